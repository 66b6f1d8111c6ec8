package intercept

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestRewriteGolden checks the upstream body built from each testdata/rewrite/<case>.in.json:
// <case>.first.json for the first upstream call, <case>.later.json for a call after the model
// used a tool. Run with -update to regenerate them.
func TestRewriteGolden(t *testing.T) {
	ins, _ := filepath.Glob("testdata/rewrite/*.in.json")
	if len(ins) == 0 {
		t.Fatal("no golden cases")
	}
	for _, in := range ins {
		name := strings.TrimSuffix(in, ".in.json")
		t.Run(filepath.Base(name), func(t *testing.T) {
			raw, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			orig := bytes.Clone(raw)
			req, aerr := parseRequest(raw, config.Defaults().Interception, true)
			if aerr != nil {
				t.Fatalf("parseRequest: %v", aerr)
			}
			req.resolve(lookup{ctx: context.Background(), store: NewMemoryStore(0, nil)})
			turn := callPair("python", "call_1", "1+1", "2")
			for suffix, cs := range map[string]callSpec{".first.json": {first: true}, ".later.json": {turns: turn}} {
				got, err := req.body(cs)
				if err != nil {
					t.Fatal(err)
				}
				var pretty bytes.Buffer
				if err := json.Indent(&pretty, got, "", "  "); err != nil {
					t.Fatalf("body is not JSON: %v: %s", err, got)
				}
				pretty.WriteByte('\n')
				golden := name + suffix
				if *update {
					if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run with -update)", err)
				}
				if !bytes.Equal(pretty.Bytes(), want) {
					t.Errorf("%s differs:\n%s", golden, pretty.Bytes())
				}
			}
			if !bytes.Equal(raw, orig) {
				t.Error("the client's body was modified")
			}
		})
	}
}

// TestContainerValidation: a container that is neither an id nor {"type":"auto"}, or a memory
// limit OpenAI does not offer, is a 400 naming the field.
func TestContainerValidation(t *testing.T) {
	for _, tc := range []struct {
		name, container string
		param           string // "" when accepted
	}{
		{"auto", `{"type":"auto"}`, ""},
		{"auto with memory", `{"type":"auto","memory_limit":"4g"}`, ""},
		{"auto with null memory", `{"type":"auto","memory_limit":null}`, ""},
		{"id", `"cntr_abc"`, ""},
		{"absent", ``, ""},
		{"array", `["auto"]`, "tools[0].container"},
		{"number", `4`, "tools[0].container"},
		{"unknown type", `{"type":"manual"}`, "tools[0].container"},
		{"bad memory", `{"type":"auto","memory_limit":"3g"}`, "tools[0].container.memory_limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tool := `{"type":"code_interpreter"}`
			if tc.container != "" {
				tool = `{"type":"code_interpreter","container":` + tc.container + `}`
			}
			body := []byte(`{"model":"m","input":"x","tools":[` + tool + `]}`)
			_, aerr := parseRequest(body, config.Defaults().Interception, true)
			switch {
			case tc.param == "" && aerr != nil:
				t.Errorf("parseRequest(%s) = %v; want accepted", tc.container, aerr)
			case tc.param != "" && (aerr == nil || aerr.Status != 400 || aerr.Param != tc.param):
				t.Errorf("parseRequest(%s) = %v; want a 400 with param %s", tc.container, aerr, tc.param)
			}
		})
	}
}
