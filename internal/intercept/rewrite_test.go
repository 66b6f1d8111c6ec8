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
	"github.com/ciproxy/ciproxy/internal/store/storetest"
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
			req.resolve(lookup{ctx: context.Background(), store: storetest.NewMemResponses(nil)})
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
		{"network disabled", `{"type":"auto","network_policy":{"type":"disabled"}}`, ""},
		// Parsed here, narrowed to the tool's bound in Prepare (TestNetworkPolicyNarrowed).
		{"network allowlist", `{"type":"auto","network_policy":{"type":"allowlist","allowed_domains":["pypi.org"]}}`, ""},
		{"network no domains", `{"type":"auto","network_policy":{"type":"allowlist"}}`, "tools[0].container.network_policy.allowed_domains"},
		{"network IP", `{"type":"auto","network_policy":{"type":"allowlist","allowed_domains":["pypi.org","10.0.0.1"]}}`, "tools[0].container.network_policy.allowed_domains[1]"},
		{"network type", `{"type":"auto","network_policy":{"type":"open"}}`, "tools[0].container.network_policy.type"},
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

// TestFieldTypes: a field the engine reads, sent with the wrong JSON type, is the 400
// invalid_type OpenAI answers, naming the field; null is accepted for each (all are optional).
func TestFieldTypes(t *testing.T) {
	const tool = `{"type":"code_interpreter","container":{"type":"auto"}}`
	for _, tc := range []struct {
		field, value string
		message      string // "" when accepted
	}{
		{"stream", `"true"`, "Invalid type for 'stream': expected a boolean, but got a string instead."},
		{"stream", `1`, "Invalid type for 'stream': expected a boolean, but got an integer instead."},
		{"stream", `true`, ""},
		{"stream", `null`, ""},
		{"store", `"false"`, "Invalid type for 'store': expected a boolean, but got a string instead."},
		{"parallel_tool_calls", `{}`, "Invalid type for 'parallel_tool_calls': expected a boolean, but got an object instead."},
		{"background", `0`, "Invalid type for 'background': expected a boolean, but got an integer instead."},
		{"max_tool_calls", `"3"`, "Invalid type for 'max_tool_calls': expected an integer, but got a string instead."},
		{"max_tool_calls", `2.5`, "Invalid type for 'max_tool_calls': expected an integer, but got a decimal instead."},
		{"max_tool_calls", `3`, ""},
		{"previous_response_id", `7`, "Invalid type for 'previous_response_id': expected a string, but got an integer instead."},
		{"previous_response_id", `null`, ""},
		{"instructions", `["be brief"]`, "Invalid type for 'instructions': expected a string, but got an array instead."},
		{"instructions", `"be brief"`, ""},
		{"include", `"code_interpreter_call.outputs"`, "Invalid type for 'include': expected an array of strings, but got a string instead."},
		{"include", `[1]`, "Invalid type for 'include[0]': expected a string, but got an integer instead."},
		{"include", `["code_interpreter_call.outputs"]`, ""},
		{"tool_choice", `true`, "Invalid type for 'tool_choice': expected a string or an object, but got a boolean instead."},
		{"tool_choice", `"auto"`, ""},
		{"tool_choice", `{"type":"code_interpreter"}`, ""},
		{"input", `5`, "Invalid type for 'input': expected a string or an array, but got an integer instead."},
		{"tools", `{"type":"code_interpreter"}`, "Invalid type for 'tools': expected an array of objects, but got an object instead."},
		{"tools", `[` + tool + `,"python"]`, "Invalid type for 'tools[1]': expected an object, but got a string instead."},
	} {
		body := `{"model":"m","input":"x","tools":[` + tool + `],"` + tc.field + `":` + tc.value + `}`
		switch tc.field {
		case "input":
			body = `{"model":"m","input":` + tc.value + `,"tools":[` + tool + `]}`
		case "tools":
			body = `{"model":"m","input":"x","tools":` + tc.value + `}`
		}
		_, aerr := parseRequest([]byte(body), config.Defaults().Interception, true)
		switch {
		case tc.message == "" && aerr != nil:
			t.Errorf("%s: %s = %v; want accepted", tc.field, tc.value, aerr)
		case tc.message != "" && (aerr == nil || aerr.Status != 400 || aerr.Type != "invalid_request_error" || aerr.Code != "invalid_type" ||
			aerr.Message != tc.message || !strings.HasPrefix(aerr.Param, tc.field)):
			t.Errorf("%s: %s = %+v; want a 400 invalid_type naming the field: %s", tc.field, tc.value, aerr, tc.message)
		}
	}
}
