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
			req, aerr := parseRequest(raw, config.Interception{FunctionName: "python"}, lookup{ctx: context.Background(), store: NewMemoryStore(0, nil)})
			if aerr != nil {
				t.Fatalf("parseRequest: %v", aerr)
			}
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
