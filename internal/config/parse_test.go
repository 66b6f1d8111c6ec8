package config_test

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	. "github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
)

var update = flag.Bool("update", false, "rewrite the expected results in testdata/*.yaml")

// goldenSep separates a testdata file's YAML input from the result it must give: either the
// parsed summary or the error text.
const goldenSep = "#### want\n"

// TestGolden parses every testdata/*.yaml and testdata/litellm/*.yaml (LiteLLM configs in the
// shapes its docs give) with every sandbox backend, as the proxy does. Leading
// "# env: NAME=value" comment lines set the environment seen by os.environ/NAME references; no other
// variable is set.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	litellm, err2 := filepath.Glob("testdata/litellm/*.yaml")
	if err != nil || err2 != nil || len(files) == 0 || len(litellm) < 20 {
		t.Fatalf("testdata: %d files, %d LiteLLM configs (want at least 20): %v %v", len(files), len(litellm), err, err2)
	}
	for _, file := range append(files, litellm...) {
		name := strings.TrimSuffix(strings.TrimPrefix(file, "testdata/"), ".yaml")
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, want, found := strings.Cut(string(raw), goldenSep)
			if !found && !*update {
				t.Fatalf("%s has no %q line", file, strings.TrimSpace(goldenSep))
			}
			env := map[string]string{}
			for _, line := range strings.Split(input, "\n") {
				if kv, ok := strings.CutPrefix(line, "# env: "); ok {
					k, v, _ := strings.Cut(kv, "=")
					env[k] = v
				}
			}
			lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
			got := summarize(ParseWith([]byte(input), "config.yaml", backends.ParseOptions(lookup)))
			if *update {
				if err := os.WriteFile(file, []byte(input+goldenSep+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != want {
				t.Errorf("ParseWith(%s) =\n%s\nwant\n%s", file, got, want)
			}
		})
	}
}

// summarize renders a parse result as stable text: the error, or every field of the config.
func summarize(c *Config, err error) string {
	var b strings.Builder
	if err != nil {
		var errs *Errors
		if !errors.As(err, &errs) {
			return fmt.Sprintf("error of type %T: %v\n", err, err)
		}
		fmt.Fprintf(&b, "error:\n%s\n", err)
		return b.String()
	}
	tmp := filepath.Join(os.TempDir(), "ciproxy-sandboxes")
	b.WriteString("models:\n")
	for _, m := range c.Models {
		fmt.Fprintf(&b, "  %s\n", describe(m))
	}
	b.WriteString("sandbox_tools:\n")
	for _, s := range c.SandboxTools {
		if o, ok := s.Settings.(local.Options); ok && o.WorkDir == tmp {
			o.WorkDir = "$TMPDIR/ciproxy-sandboxes"
			s.Settings = o
		}
		fmt.Fprintf(&b, "  %+v\n", s)
	}
	fmt.Fprintf(&b, "callbacks: %q\n", c.Callbacks)
	fmt.Fprintf(&b, "interception: %+v\n", c.Interception)
	if c.Interception.EnabledProviders == nil {
		b.WriteString("interception enabled for every provider\n")
	}
	fmt.Fprintf(&b, "interception active: %v\n", c.InterceptionActive())
	g := c.General
	if g.MissingEnv != "" && strings.HasPrefix(g.MasterKey, "unset-") {
		g.MasterKey = "<random>"
	}
	fmt.Fprintf(&b, "general: %+v\n", g)
	if c.Router != (Router{}) {
		fmt.Fprintf(&b, "router: %+v\n", c.Router)
	}
	b.WriteString("warnings:\n")
	for _, w := range c.AllWarnings() {
		fmt.Fprintf(&b, "  %s\n", w)
	}
	return b.String()
}

// describe renders the fields of v that are not zero, as "{Name:value ...}", so that golden files
// show what each deployment sets. Params and ExtraBody print their JSON.
func describe(v any) string {
	rv := reflect.ValueOf(v)
	var parts []string
	for i := range rv.NumField() {
		f := rv.Field(i)
		if f.IsZero() {
			continue
		}
		val := fmt.Sprintf("%v", f.Interface())
		if ps, ok := f.Interface().([]Param); ok {
			var items []string
			for _, p := range ps {
				items = append(items, p.Name+"="+string(p.Value))
			}
			val = "[" + strings.Join(items, " ") + "]"
		}
		parts = append(parts, rv.Type().Field(i).Name+":"+val)
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func TestErrorsType(t *testing.T) {
	in := "model_list:\n  - model_name: a\n    litellm_params:\n      model: openai/a\n      api_bse: x\nbogus: 1\n"
	_, err := Parse([]byte(in), "c.yaml")
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse error = %T %v; want *Errors", err, err)
	}
	want := []Problem{
		{Line: 5, Msg: `model_list[0].litellm_params: unknown key "api_bse" (did you mean "api_base"?)`},
		{Line: 6, Msg: `top level: unknown key "bogus"`},
	}
	if fmt.Sprint(errs.Problems) != fmt.Sprint(want) {
		t.Errorf("Problems = %v; want %v", errs.Problems, want)
	}
	wantText := "c.yaml:5: model_list[0].litellm_params: unknown key \"api_bse\" (did you mean \"api_base\"?)\nc.yaml:6: top level: unknown key \"bogus\""
	if err.Error() != wantText {
		t.Errorf("Error() = %q; want %q", err.Error(), wantText)
	}
}

func TestUnsetEnvWarnsAndMarksEntry(t *testing.T) {
	in := "model_list:\n  - model_name: gpt-5\n    litellm_params: {model: openai/gpt-5, api_key: os.environ/OPENAI_API_KEY}\n"
	c, err := ParseWith([]byte(in), "c.yaml", ParseOptions{LookupEnv: func(string) (string, bool) { return "", false }})
	if err != nil {
		t.Fatalf("ParseWith: %v", err)
	}
	const want = "model_list[0] (gpt-5): api_key refers to OPENAI_API_KEY, which is not set"
	if len(c.Warnings) == 0 || c.Warnings[0] != want {
		t.Errorf("Warnings = %q; want first %q", c.Warnings, want)
	}
	if got := c.Models[0].MissingEnv; got != "OPENAI_API_KEY" {
		t.Errorf("MissingEnv = %q; want OPENAI_API_KEY", got)
	}

	c, err = ParseWith([]byte(in), "c.yaml", ParseOptions{LookupEnv: func(n string) (string, bool) { return "sk-" + n, true }})
	if err != nil {
		t.Fatalf("ParseWith: %v", err)
	}
	if m := c.Models[0]; m.APIKey != "sk-OPENAI_API_KEY" || m.MissingEnv != "" {
		t.Errorf("with the variable set: APIKey = %q, MissingEnv = %q; want sk-OPENAI_API_KEY and none", m.APIKey, m.MissingEnv)
	}
}

// TestSecretsStayOutOfMessages checks that no error or warning repeats the value of a secret, even
// when the file around it is wrong.
func TestSecretsStayOutOfMessages(t *testing.T) {
	in := `model_list:
  - model_name: m
    litellm_params: {model: openai/m, api_key: SECRET-UPSTREAM, timeout: 5, bad: 1}
sandbox_tools:
  - sandbox_tool_name: e
    litellm_params: {sandbox_provider: e2b, api_key: os.environ/E2B_KEY, python: /x}
general_settings:
  master_key: os.environ/MASTER
  container_secret: SECRET-CONTAINER
  shutdown_grace: nope
`
	env := map[string]string{"E2B_KEY": "SECRET-E2B", "MASTER": "SECRET-MASTER"}
	_, err := ParseWith([]byte(in), "c.yaml", backends.ParseOptions(func(n string) (string, bool) { v, ok := env[n]; return v, ok }))
	if err == nil {
		t.Fatal("ParseWith succeeded; want errors")
	}
	if strings.Contains(err.Error(), "SECRET") {
		t.Errorf("error text reveals a secret:\n%v", err)
	}
	if n := len(err.(*Errors).Problems); n != 3 {
		t.Errorf("got %d problems; want 3 (bad, python, shutdown_grace):\n%v", n, err)
	}
}

// TestLiteLLMSecretsStayOutOfMessages: the LiteLLM keys that carry secrets (a Redis URL with its
// password, Azure tokens, credential values, extra headers) are never repeated in a message or a
// warning, whatever is wrong around them.
func TestLiteLLMSecretsStayOutOfMessages(t *testing.T) {
	in := `model_list:
  - model_name: a
    litellm_params:
      model: azure/dep
      api_base: https://contoso.openai.azure.com
      azure_ad_token: SECRET-TOKEN
      extra_headers: {X-Key: SECRET-HEADER, "Bad Name": SECRET-HEADER2}
      litellm_credential_name: cred
      temperature: SECRET-TEMP
credential_list:
  - credential_name: cred
    credential_values: {api_key: SECRET-CRED, api_bsae: SECRET-BASE}
router_settings:
  redis_url: ftp://user:SECRET-REDIS@host
  redis_password: SECRET-PW
  redis_port: SECRET-PORT
general_settings:
  master_key: SECRET-MASTER
  database_url: postgresql://u:SECRET-DB@db/x
`
	c, err := Check([]byte(in), "c.yaml", backends.ParseOptions(func(string) (string, bool) { return "", false }))
	if err == nil {
		t.Fatal("Check succeeded; want errors")
	}
	all := err.Error() + "\n" + strings.Join(c.AllWarnings(), "\n")
	// The port's value is not a secret in itself, but the message must still name it only.
	for _, secret := range []string{"SECRET-TOKEN", "SECRET-HEADER", "SECRET-CRED", "SECRET-BASE", "SECRET-REDIS", "SECRET-PW", "SECRET-MASTER", "SECRET-DB"} {
		if strings.Contains(all, secret) {
			t.Errorf("messages reveal %s:\n%s", secret, all)
		}
	}
	if n := len(err.(*Errors).Problems); n != 5 {
		t.Errorf("got %d problems; want 5 (header name, temperature, api_bsae, redis_url, redis_port):\n%v", n, err)
	}
}

// TestExampleConfig loads the shipped config.example.yaml with no environment: it must load with
// warnings only.
func TestExampleConfig(t *testing.T) {
	data, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseWith(data, "config.example.yaml", backends.ParseOptions(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
	if len(c.Warnings) == 0 {
		t.Error("no warnings; want at least the unset OPENAI_API_KEY")
	}
	gpt := c.Deployments("gpt-4.1")
	if len(gpt) != 1 || gpt[0].Provider != "openai" || gpt[0].APIBase != "https://api.openai.com/v1" || gpt[0].MissingEnv != "OPENAI_API_KEY" {
		t.Errorf("gpt-4.1 deployments = %+v; want one openai deployment missing OPENAI_API_KEY", gpt)
	}
	var vllm bool
	for _, m := range c.Models {
		vllm = vllm || (m.Provider == "hosted_vllm" && m.APIBase != "")
	}
	if !vllm {
		t.Errorf("no hosted_vllm deployment with an api_base in %+v", c.Models)
	}
	if !c.InterceptionActive() {
		t.Error("interception is not active")
	}
	tool, ok := c.SandboxTool(c.Interception.SandboxToolName)
	if !ok || tool.Backend != "local" {
		t.Errorf("interception uses %q (%+v); want a local tool", c.Interception.SandboxToolName, tool)
	}
	// The example writes out every local default: it must decode to exactly the defaults.
	want := local.DefaultOptions()
	if got, _ := tool.Settings.(local.Options); !reflect.DeepEqual(got, want) {
		t.Errorf("the example's local tool = %+v; want the defaults %+v", got, want)
	}
}

// TestExampleConfigE2BTool uncomments the example's e2b tool: it must be valid as written.
func TestExampleConfigE2BTool(t *testing.T) {
	data, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	inBlock := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "  # - sandbox_tool_name: my-e2b") {
			inBlock = true
		}
		if inBlock && !strings.HasPrefix(line, "  # ") {
			inBlock = false
		}
		if inBlock {
			line = "  " + strings.TrimPrefix(line, "  # ")
		}
		out = append(out, line)
	}
	env := map[string]string{"E2B_API_KEY": "e2b_123"}
	c, err := ParseWith([]byte(strings.Join(out, "\n")), "config.example.yaml", backends.ParseOptions(func(n string) (string, bool) { v, ok := env[n]; return v, ok }))
	if err != nil {
		t.Fatalf("config.example.yaml with the e2b tool uncommented: %v", err)
	}
	tool, ok := c.SandboxTool("my-e2b")
	opts := e2b.DefaultOptions()
	opts.APIKey, opts.APIBase = "e2b_123", "https://api.e2b.app"
	want := SandboxTool{Name: "my-e2b", Backend: "e2b", Settings: e2b.Settings{Options: opts}, Line: tool.Line}
	if !ok || !reflect.DeepEqual(tool, want) {
		t.Errorf("my-e2b = %+v; want %+v", tool, want)
	}
	if opts.Timeout != 300*time.Second || opts.Template != "code-interpreter-v1" || opts.Domain != "e2b.app" {
		t.Errorf("e2b defaults = %+v; want the SDKs' (300 s, code-interpreter-v1, e2b.app)", opts)
	}
}

// TestExampleConfigAgentSandboxTool uncomments the example's agent_sandbox tool: it must be valid
// as written, with the values its comments give as defaults.
func TestExampleConfigAgentSandboxTool(t *testing.T) {
	data, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data = uncomment(t, data, "  # - sandbox_tool_name: my-agent-sandbox")
	c, err := ParseWith(data, "config.example.yaml", backends.ParseOptions(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatalf("config.example.yaml with the agent_sandbox tool uncommented: %v", err)
	}
	tool, ok := c.SandboxTool("my-agent-sandbox")
	opts := agentsandbox.DefaultOptions()
	opts.Namespace, opts.WarmPool = "ciproxy-sandboxes", "ciproxy-python"
	want := SandboxTool{Name: "my-agent-sandbox", Backend: agentsandbox.Backend, Settings: agentsandbox.Settings{Options: opts}, Line: tool.Line}
	if !ok || !reflect.DeepEqual(tool, want) {
		t.Errorf("my-agent-sandbox = %+v; want %+v", tool, want)
	}
}

// uncomment returns data with the commented-out block that starts with the line first
// uncommented: that line and those after it with the same comment prefix, up to a blank line.
func uncomment(t *testing.T, data []byte, first string) []byte {
	t.Helper()
	prefix := first[:strings.Index(first, "# ")+2]
	var out []string
	in, found := false, false
	for _, line := range strings.Split(string(data), "\n") {
		if line == first {
			in, found = true, true
		}
		if in && (!strings.HasPrefix(line, prefix) || line == "") {
			in = false
		}
		if in {
			line = prefix[:len(prefix)-2] + strings.TrimPrefix(line, prefix)
		}
		out = append(out, line)
	}
	if !found {
		t.Fatalf("no line %q", first)
	}
	return []byte(strings.Join(out, "\n"))
}

// TestExampleConfigLiteLLMBlocks uncomments the example's LiteLLM blocks (default params,
// model_info, Azure, router_settings, credential_list, environment_variables): each must be valid
// as written and mean what its comment says.
func TestExampleConfigLiteLLMBlocks(t *testing.T) {
	data, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, first := range []string{
		"      # temperature: 0.2", "      # timeout: 600        # longest wait for the upstream's response headers (then the next entry)", "    # model_info:", "  # - model_name: gpt-4o-azure",
		"# router_settings:", "# credential_list:", "# environment_variables:",
	} {
		data = uncomment(t, data, first)
	}
	env := map[string]string{"AZURE_API_KEY": "az", "REDIS_HOST": "redis", "OPENAI_API_KEY": "sk"}
	c, err := ParseWith(data, "config.example.yaml", backends.ParseOptions(func(n string) (string, bool) { v, ok := env[n]; return v, ok }))
	if err != nil {
		t.Fatalf("config.example.yaml with its LiteLLM blocks uncommented: %v", err)
	}
	gpt := c.Deployments("gpt-4.1")[0]
	if len(gpt.Params) != 3 || len(gpt.ExtraHeaders) != 1 || len(gpt.ExtraBody) != 1 || gpt.Timeout != 600*time.Second ||
		gpt.StreamTimeout != 60*time.Second || gpt.API != APIResponses || gpt.Attempts != 3 {
		t.Errorf("gpt-4.1 = %+v; want 3 params, a header, an extra_body key, the timeouts, the Responses API and 3 attempts", gpt)
	}
	if !reflect.DeepEqual(gpt.InterceptedTools, []string{"code_interpreter"}) {
		t.Errorf("gpt-4.1 InterceptedTools = %q; want [code_interpreter], as model_info.intercepted_tools says", gpt.InterceptedTools)
	}
	az := c.Deployments("gpt-4o-azure")
	if len(az) != 1 || az[0].Provider != "azure" || az[0].APIKey != "az" || az[0].KeyHeader != KeyHeaderAzure || az[0].APIVersion != "2025-04-01-preview" || az[0].Unusable != "" {
		t.Errorf("gpt-4o-azure = %+v; want a usable Azure deployment with its key and version", az)
	}
	if r := c.Router.Redis; r.Addr() != "redis:6379" {
		t.Errorf("Redis = %+v; want redis:6379", r)
	}
	for _, w := range c.AllWarnings() {
		if strings.HasPrefix(w, "ignored: ") || strings.HasPrefix(w, "unusable: ") {
			t.Errorf("the example's blocks use only honoured keys, yet: %s", w)
		}
	}
}

// Defaults is the empty file's configuration, with the defaults this package documents.
func TestDefaults(t *testing.T) {
	c := Defaults()
	in := c.Interception
	if !in.Enabled || in.EnabledProviders != nil || in.SandboxToolName != DefaultSandboxToolName ||
		in.FunctionName != DefaultFunctionName || in.MaxIterations != DefaultMaxIterations ||
		in.ExecutionTimeout != DefaultExecutionTimeout || in.ModelOutputLimit != DefaultModelOutputLimit ||
		in.ContainerIdleTimeout != DefaultContainerIdleTimeout {
		t.Errorf("Defaults().Interception = %+v; want the documented defaults", in)
	}
	if g := c.General; g.MasterKey != "" || g.MaxRequestBodySize != DefaultMaxRequestBodySize || g.ShutdownGrace != DefaultShutdownGrace {
		t.Errorf("Defaults().General = %+v; want the documented defaults", g)
	}
	want := []SandboxTool{{Name: DefaultSandboxToolName, Backend: DefaultSandboxBackend}}
	if fmt.Sprint(c.SandboxTools) != fmt.Sprint(want) || len(c.Models) != 0 || c.InterceptionActive() {
		t.Errorf("Defaults() = %+v; want the implicit local tool, no model, interception not listed in callbacks", c)
	}
	if c.SameSource(nil) || Defaults() == c {
		t.Error("Defaults() must return a fresh config that no file is the source of")
	}
	parsed, err := ParseWith(nil, "", backends.ParseOptions(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatal(err)
	}
	parsed.SandboxTools[0].Settings = nil
	parsed.Warnings, parsed.Path = nil, ""
	if fmt.Sprintf("%+v", parsed) != fmt.Sprintf("%+v", c) {
		t.Errorf("Defaults() = %+v; want the empty file's configuration %+v", c, parsed)
	}
}

func TestAdvertiseURL(t *testing.T) {
	cases := []struct {
		value string
		want  string // "" when it is an error
	}{
		{"http://10.0.0.5:4000", "http://10.0.0.5:4000"},
		{"https://proxy-0.proxy.svc:4000/", "https://proxy-0.proxy.svc:4000"},
		{"http://[fd00::5]:4000", "http://[fd00::5]:4000"},
		{"10.0.0.5:4000", ""},
		{"http://10.0.0.5", ""},
		{"http://u:p@10.0.0.5:4000", ""},
		{"http://10.0.0.5:4000/v1", ""},
		{"ftp://10.0.0.5:21", ""},
	}
	for _, tc := range cases {
		t.Run(tc.value, func(t *testing.T) {
			cfg, err := ParseWith([]byte("general_settings:\n  master_key: k\n  advertise_url: \""+tc.value+"\"\n"), "c.yaml", ParseOptions{})
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), "advertise_url") || !strings.Contains(err.Error(), "c.yaml:3:") {
					t.Errorf("Parse = %v; want an error naming advertise_url and its line", err)
				}
				return
			}
			if err != nil || cfg.General.AdvertiseURL != tc.want {
				t.Errorf("Parse = %q, %v; want %q", cfg.General.AdvertiseURL, err, tc.want)
			}
		})
	}
	// os.environ/ works as for every value: POD_IP through the downward API.
	env := func(name string) (string, bool) {
		return map[string]string{"ADVERTISE": "http://10.1.2.3:4000"}[name], name == "ADVERTISE"
	}
	cfg, err := ParseWith([]byte("general_settings:\n  master_key: k\n  advertise_url: os.environ/ADVERTISE\n"), "c.yaml", ParseOptions{LookupEnv: env})
	if err != nil || cfg.General.AdvertiseURL != "http://10.1.2.3:4000" {
		t.Errorf("from the environment = %q, %v", cfg.General.AdvertiseURL, err)
	}
}

// TestSharedSecret: the secret the replicas agreed on is container_secret when the file sets none
// (or names a variable that is not set); an explicit one wins.
func TestSharedSecret(t *testing.T) {
	cases := []struct{ file, want string }{
		{"", "agreed"},
		{"general_settings:\n  container_secret: mine\n", "mine"},
		{"general_settings:\n  container_secret: os.environ/UNSET_SECRET\n", "agreed"},
	}
	for _, tc := range cases {
		none := func(string) (string, bool) { return "", false }
		cfg, err := ParseWith([]byte(tc.file), "config.yaml", ParseOptions{LookupEnv: none, SharedSecret: "agreed"})
		if err != nil {
			t.Fatalf("%q: %v", tc.file, err)
		}
		if cfg.General.ContainerSecret != tc.want {
			t.Errorf("%q: container secret %q; want %q", tc.file, cfg.General.ContainerSecret, tc.want)
		}
	}
}
