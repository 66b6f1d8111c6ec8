package intercept

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

// FuzzRewrite feeds any body to the request rewriter. It must not panic and must not modify its
// input; a body it accepts gives valid JSON for every kind of upstream call, and a body it refuses
// gives a client (4xx) error.
func FuzzRewrite(f *testing.F) {
	ins, _ := filepath.Glob("testdata/rewrite/*.in.json")
	for _, in := range ins {
		raw, err := os.ReadFile(in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	for _, seed := range []string{
		`{}`, `[]`, `null`, `"x"`, `{"tools":[{"type":"code_interpreter"}]}`,
		`{"model":"m","input":"hi","tools":[{"type":"code_interpreter","container":"cntr_x"}],"tool_choice":{"type":"code_interpreter"}}`,
		`{"model":"m","input":[{"type":"code_interpreter_call","id":"ci_1","code":null,"outputs":null}],"tools":[{"type":"code_interpreter","container":{"type":"auto","memory_limit":"4g"}}]}`,
		`{"model":"m","input":[{"type":"item_reference","id":"ci_1"}],"tools":[{"type":"code_interpreter"},{"type":"function","name":"python"}]}`,
		`{"model":"m","include":["code_interpreter_call.outputs"],"store":false,"reasoning":{},"tools":[{"type":"code_interpreter"}],"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"code_interpreter"}]}}`,
	} {
		f.Add([]byte(seed))
	}
	ic := config.Defaults().Interception
	turn := callPair("python", "call_1", "print(1)", "1\n")
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		req, aerr := parseRequest(body, ic, true)
		if !bytes.Equal(body, orig) {
			t.Fatal("parseRequest modified its input")
		}
		if aerr != nil {
			if aerr.Status < 400 || aerr.Status >= http.StatusInternalServerError {
				t.Fatalf("parseRequest refused with status %d (%s); want a 4xx", aerr.Status, aerr.Message)
			}
			return
		}
		req.resolve(lookup{ctx: context.Background(), store: storetest.NewMemResponses(nil)})
		for _, cs := range []callSpec{{first: true}, {turns: turn}, {none: true, turns: turn}, {encrypted: true, turns: turn}} {
			out, err := req.body(cs)
			if err != nil {
				// A body the rewriter accepted must also be one it can rebuild.
				t.Fatalf("body(%+v) error = %v for accepted input %q", cs, err, body)
			}
			if !json.Valid(out) {
				t.Fatalf("body(%+v) = %q; not valid JSON (input %q)", cs, out, body)
			}
		}
		if !bytes.Equal(body, orig) {
			t.Fatal("body() modified the client's bytes")
		}
	})
}
