package config

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ciproxy/ciproxy/internal/settings"
)

// Defaults applied by Parse; config.example.yaml documents the same values. Each sandbox backend
// keeps the defaults of its own keys.
const (
	DefaultFunctionName         = "python"
	DefaultMaxIterations        = 20
	DefaultExecutionTimeout     = 120 * time.Second
	DefaultModelOutputLimit     = 16384
	DefaultContainerIdleTimeout = 20 * time.Minute
	DefaultMaxRequestBodySize   = 32 << 20
	DefaultShutdownGrace        = 30 * time.Second
	DefaultMaxFileUploadSize    = 512 << 20 // OpenAI's limit for one file
	DefaultMaxFileStoragePerKey = 10 << 30

	// DefaultSandboxToolName names the sandbox tool that stands in when sandbox_tools is absent, and
	// DefaultSandboxBackend is its backend, with that backend's defaults.
	DefaultSandboxToolName = "local"
	DefaultSandboxBackend  = "local"

	// InterceptionCallback is the litellm_settings.callbacks entry that turns interception on.
	InterceptionCallback = "code_interpreter_interception"
)

// functionNameRE is what OpenAI accepts as a function tool name.
var functionNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// SandboxBackend is how Parse hands a sandbox tool's litellm_params to the backend that its
// sandbox_provider names, without knowing any backend: internal/sandbox/backends lists them all.
type SandboxBackend struct {
	// Name is the sandbox_provider value that selects the backend.
	Name string
	// Keys are the litellm_params keys the backend reads, sandbox_provider aside. A key of another
	// backend is reported as not applying to this one; any other key is unknown.
	Keys []string
	// Decode reads the backend's keys from p, records each problem and warning through p (with its
	// line), and returns the settings with every default applied; Parse stores the result in
	// SandboxTool.Settings. It must start nothing: parsing has no side effects.
	Decode func(p *settings.Map) any
}

// ParseOptions adjusts ParseWith. The zero value reads the process environment and knows no sandbox
// backend.
type ParseOptions struct {
	// LookupEnv resolves os.environ/NAME references and the backends' environment fallbacks; nil
	// means os.LookupEnv.
	LookupEnv func(name string) (string, bool)
	// Backends are the sandbox backends a tool may name, in the order messages list them. Without the
	// backend a tool names, the tool is an error; the implicit local tool is then left with nil
	// Settings.
	Backends []SandboxBackend
}

// Load reads and parses the file at path.
func Load(path string, opts ParseOptions) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return ParseWith(data, path, opts)
}

// Parse parses and validates a configuration file with the process environment and no sandbox
// backend. path is used in messages and stored in Config.Path.
func Parse(data []byte, path string) (*Config, error) {
	return ParseWith(data, path, ParseOptions{})
}

// ParseWith parses and validates a configuration file. Every problem found, in the proxy's sections
// and in each backend's keys, is returned in one *Errors in line order. A variable named by
// os.environ/NAME that is not set never fails parsing: it becomes a warning, and the entry that needs
// it records it in MissingEnv (or its backend does).
func ParseWith(data []byte, path string, opts ParseOptions) (*Config, error) {
	d := &decoder{Decoder: settings.NewDecoder(opts.LookupEnv), backends: opts.Backends}
	cfg := d.config(data)
	if err := d.Err(path); err != nil {
		return nil, err
	}
	cfg.Path = path
	cfg.Warnings = d.Warnings()
	cfg.raw = slices.Clone(data)
	return cfg, nil
}

// Defaults returns the configuration of an empty file: no model, the implicit local sandbox tool
// (with nil Settings: no backend decodes it here), interception enabled but not listed in callbacks,
// and every other default. Tests start from it rather than restate the defaults.
func Defaults() *Config {
	c, err := ParseWith(nil, "", ParseOptions{LookupEnv: func(string) (string, bool) { return "", false }})
	if err != nil {
		panic(fmt.Sprintf("config: the empty file does not parse: %v", err)) // a bug in this package
	}
	c.Warnings = nil
	c.raw = nil
	return c
}

// decoder walks the YAML node tree, collecting every problem instead of stopping at the first.
type decoder struct {
	*settings.Decoder
	backends []SandboxBackend
}

// syntaxError returns the line and message of a YAML syntax error. yaml.v3 reports the line where
// the enclosing block starts, not the line at fault, so the line is found as the shortest prefix of
// whole lines that fails with the same message; files too long for that keep yaml.v3's line.
func syntaxError(data []byte, err error) (int, string) {
	line, msg := splitYAMLError(err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > 2000 {
		return line, msg
	}
	var prefix []byte
	for i, l := range lines {
		prefix = append(prefix, l...)
		var n yaml.Node
		if e := yaml.Unmarshal(prefix, &n); e != nil {
			if _, m := splitYAMLError(e); m == msg {
				return i + 1, msg
			}
		}
	}
	return line, msg
}

func splitYAMLError(err error) (int, string) {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return line, m[2]
	}
	return 0, strings.TrimPrefix(msg, "yaml: ")
}

// yamlLineRE finds the line in yaml.v3's syntax errors ("yaml: line 3: ...").
var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func (d *decoder) config(data []byte) *Config {
	cfg := &Config{}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, msg := syntaxError(data, err)
		d.Errorf(line, "invalid YAML: %s", msg)
		return cfg
	}
	var root *yaml.Node
	if len(doc.Content) > 0 {
		root = doc.Content[0]
	}
	top := d.Map(root, "", "the file", []string{"model_list", "sandbox_tools", "litellm_settings", "general_settings"}, nil)

	cfg.Models = d.models(top.Node("model_list"))
	if len(cfg.Models) == 0 {
		d.Warnf("model_list is empty: the proxy serves no model")
	}
	var toolNames map[string]int
	cfg.SandboxTools, toolNames = d.sandboxTools(top.Node("sandbox_tools"))
	d.litellmSettings(top.Node("litellm_settings"), cfg, toolNames)
	cfg.General = d.general(top.Node("general_settings"))
	return cfg
}

// KnownAPIBase returns the default api_base of an upstream provider, or "" when a deployment of
// that provider must set api_base itself. Only OpenAI-compatible endpoints whose address is fixed
// and documented by the provider are listed.
func KnownAPIBase(provider string) string {
	switch provider {
	case "openai":
		return "https://api.openai.com/v1"
	case "openrouter":
		return "https://openrouter.ai/api/v1"
	case "ollama":
		return "http://localhost:11434/v1"
	case "lm_studio":
		return "http://localhost:1234/v1"
	case "groq":
		return "https://api.groq.com/openai/v1"
	case "xai":
		return "https://api.x.ai/v1"
	case "mistral":
		return "https://api.mistral.ai/v1"
	case "deepseek":
		return "https://api.deepseek.com/v1"
	case "together_ai":
		return "https://api.together.xyz/v1"
	case "fireworks_ai":
		return "https://api.fireworks.ai/inference/v1"
	}
	return ""
}

// ignoredModelParams are LiteLLM litellm_params keys of model_list entries that are accepted and
// ignored, so that LiteLLM configs load unchanged. Any other unknown key is an error.
var ignoredModelParams = []string{"rpm", "tpm", "timeout", "stream_timeout", "max_retries", "organization"}

// ignoredLiteLLMSettings are litellm_settings keys accepted and ignored for the same reason.
var ignoredLiteLLMSettings = []string{"drop_params", "set_verbose", "num_retries", "request_timeout"}

func (d *decoder) models(n *yaml.Node) []Deployment {
	n = settings.Deref(n)
	if settings.IsNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.Errorf(n.Line, "model_list must be a list")
		return nil
	}
	var out []Deployment
	for i, item := range n.Content {
		item = settings.Deref(item)
		path := fmt.Sprintf("model_list[%d]", i)
		entry := d.Map(item, path, path, []string{"model_name", "litellm_params"}, []string{"model_info"})
		dep := Deployment{Line: item.Line}
		label := path
		name := entry.String("model_name")
		if name.Present {
			dep.ModelName = name.S
			label = fmt.Sprintf("%s (%s)", path, name.S)
		}
		if name.S == "" && name.Env == "" && item.Kind == yaml.MappingNode {
			d.Errorf(item.Line, "%s: model_name is required", path)
		}
		pn := entry.Node("litellm_params")
		if settings.IsNull(pn) {
			if item.Kind == yaml.MappingNode {
				d.Errorf(item.Line, "%s: litellm_params is required", path)
			}
			continue
		}
		ppath := path + ".litellm_params"
		p := d.Map(pn, ppath, label, []string{"model", "api_key", "api_base"}, ignoredModelParams)
		model := p.String("model")
		switch {
		case model.Present:
			provider, upstream, found := strings.Cut(model.S, "/")
			if !found || provider == "" || upstream == "" {
				d.Errorf(p.ValueLine("model"), "%s: %s must be provider/model, e.g. \"openai/gpt-4.1\"", p.Key("model"), model.Shown())
			} else {
				dep.Provider, dep.UpstreamModel = provider, upstream
			}
		case model.Env != "":
			dep.MissingEnv = model.Env
		case pn.Kind == yaml.MappingNode:
			d.Errorf(pn.Line, "%s: model is required (provider/model, e.g. \"openai/gpt-4.1\")", ppath)
		}
		key := p.String("api_key")
		dep.APIKey = key.S
		if key.Env != "" && !key.Present && dep.MissingEnv == "" {
			dep.MissingEnv = key.Env
		}
		base := p.String("api_base")
		switch {
		case base.Present:
			dep.APIBase = p.BaseURL(base, p.ValueLine("api_base"), p.Key("api_base"))
		case base.Env != "":
			if dep.MissingEnv == "" {
				dep.MissingEnv = base.Env
			}
			dep.APIBase = KnownAPIBase(dep.Provider)
		case dep.Provider != "":
			dep.APIBase = KnownAPIBase(dep.Provider)
			if dep.APIBase == "" {
				d.Errorf(pn.Line, "%s: api_base is required for provider %q (it has no known default)", ppath, dep.Provider)
			}
		}
		out = append(out, dep)
	}
	return out
}

// backend returns the sandbox backend called name.
func (d *decoder) backend(name string) (SandboxBackend, bool) {
	for _, b := range d.backends {
		if b.Name == name {
			return b, true
		}
	}
	return SandboxBackend{}, false
}

// backendNames lists the backends for messages: "local or e2b".
func (d *decoder) backendNames() string {
	var names []string
	for _, b := range d.backends {
		names = append(names, b.Name)
	}
	switch len(names) {
	case 0:
		return "none is available"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// sandboxTools reads sandbox_tools; with none configured it returns the implicit local tool. The map
// holds each name's index.
func (d *decoder) sandboxTools(n *yaml.Node) ([]SandboxTool, map[string]int) {
	names := map[string]int{}
	n = settings.Deref(n)
	if settings.IsNull(n) || (n.Kind == yaml.SequenceNode && len(n.Content) == 0) {
		t := SandboxTool{Name: DefaultSandboxToolName, Provider: DefaultSandboxBackend}
		if b, ok := d.backend(t.Provider); ok {
			t.Settings = b.Decode(d.Map(nil, "", t.Name, nil, nil))
		}
		names[t.Name] = 0
		return []SandboxTool{t}, names
	}
	if n.Kind != yaml.SequenceNode {
		d.Errorf(n.Line, "sandbox_tools must be a list")
		return nil, names
	}
	// Every backend's keys are accepted at first, so that a key of another backend gets a message
	// saying so rather than "unknown key".
	all := []string{"sandbox_provider"}
	for _, b := range d.backends {
		all = append(all, b.Keys...)
	}
	var out []SandboxTool
	for i, item := range n.Content {
		item = settings.Deref(item)
		path := fmt.Sprintf("sandbox_tools[%d]", i)
		entry := d.Map(item, path, path, []string{"sandbox_tool_name", "litellm_params"}, nil)
		label := path
		t := SandboxTool{Line: item.Line}
		name := entry.String("sandbox_tool_name")
		if name.Present && name.S != "" {
			t.Name = name.S
			label = fmt.Sprintf("%s (%s)", path, name.S)
			if j, dup := names[t.Name]; dup {
				d.Errorf(entry.ValueLine("sandbox_tool_name"), "%s: %q is already used by sandbox_tools[%d]", entry.Key("sandbox_tool_name"), t.Name, j)
			} else {
				names[t.Name] = i
			}
		} else if item.Kind == yaml.MappingNode {
			d.Errorf(item.Line, "%s: sandbox_tool_name is required", path)
		}
		pn := entry.Node("litellm_params")
		if settings.IsNull(pn) {
			if item.Kind == yaml.MappingNode {
				d.Errorf(item.Line, "%s: litellm_params is required (with sandbox_provider: %s)", path, d.backendNames())
			}
			continue
		}
		ppath := path + ".litellm_params"
		p := d.Map(pn, ppath, label, all, nil)
		prov := p.String("sandbox_provider")
		t.Provider = prov.S
		b, known := d.backend(prov.S)
		switch {
		case prov.Present && !known:
			d.Errorf(p.ValueLine("sandbox_provider"), "%s: %s is not a sandbox provider (%s)", p.Key("sandbox_provider"), prov.Shown(), d.backendNames())
			continue
		case !prov.Present && prov.Env == "" && pn.Kind == yaml.MappingNode:
			d.Errorf(pn.Line, "%s: sandbox_provider is required (%s)", ppath, d.backendNames())
			continue
		case !prov.Present:
			continue
		}
		for _, k := range all[1:] {
			if p.Has(k) && !slices.Contains(b.Keys, k) {
				d.Errorf(p.KeyLine(k), "%s: key %q does not apply to sandbox_provider %s", ppath, k, prov.S)
			}
		}
		t.Settings = b.Decode(p)
		out = append(out, t)
	}
	return out, names
}

func (d *decoder) litellmSettings(n *yaml.Node, cfg *Config, tools map[string]int) {
	const path = "litellm_settings"
	s := d.Map(n, path, path, []string{"callbacks", "code_interpreter_interception_params"}, ignoredLiteLLMSettings)
	cbs, _ := s.StringList("callbacks")
	cfg.Callbacks = cbs
	for _, cb := range cbs {
		if cb != InterceptionCallback {
			d.Warnf("%s.callbacks: %q is not supported here and is ignored", path, cb)
		}
	}

	ipath := path + ".code_interpreter_interception_params"
	given := s.Has("code_interpreter_interception_params") && !settings.IsNull(s.Node("code_interpreter_interception_params"))
	p := d.Map(s.Node("code_interpreter_interception_params"), ipath, ipath, []string{
		"enabled", "enabled_providers", "sandbox_tool_name", "function_name", "max_iterations",
		"execution_timeout", "model_output_limit", "container_idle_timeout",
	}, nil)
	in := &cfg.Interception
	in.Enabled = p.Bool("enabled", true)
	in.EnabledProviders, _ = p.StringList("enabled_providers")
	for _, prov := range in.EnabledProviders {
		if !slices.ContainsFunc(cfg.Models, func(m Deployment) bool { return m.Provider == prov }) {
			d.Warnf("%s.enabled_providers: no model_list entry uses provider %q", ipath, prov)
		}
	}
	if len(cfg.SandboxTools) > 0 {
		in.SandboxToolName = cfg.SandboxTools[0].Name
	}
	if v := p.String("sandbox_tool_name"); v.Present {
		if _, ok := tools[v.S]; !ok {
			d.Errorf(p.ValueLine("sandbox_tool_name"), "%s: no sandbox tool is named %s", p.Key("sandbox_tool_name"), v.Shown())
		} else {
			in.SandboxToolName = v.S
		}
	}
	in.FunctionName = DefaultFunctionName
	if v := p.String("function_name"); v.Present {
		if !functionNameRE.MatchString(v.S) {
			d.Errorf(p.ValueLine("function_name"), "%s: %s is not a valid function name (1 to 64 letters, digits, _ or -)", p.Key("function_name"), v.Shown())
		} else {
			in.FunctionName = v.S
		}
	}
	in.MaxIterations = p.Int("max_iterations", DefaultMaxIterations, 1)
	in.ExecutionTimeout = p.Duration("execution_timeout", DefaultExecutionTimeout, false)
	limit, _ := p.Size("model_output_limit", DefaultModelOutputLimit)
	if limit > 1<<30 {
		d.Errorf(p.ValueLine("model_output_limit"), "%s: must be at most 1g", p.Key("model_output_limit"))
		limit = DefaultModelOutputLimit
	}
	in.ModelOutputLimit = int(limit)
	in.ContainerIdleTimeout = p.Duration("container_idle_timeout", DefaultContainerIdleTimeout, true)

	if given && in.Enabled && !slices.Contains(cbs, InterceptionCallback) {
		d.Warnf("%s is set, but litellm_settings.callbacks does not list %q: interception is off", ipath, InterceptionCallback)
	}
}

func (d *decoder) general(n *yaml.Node) General {
	const path = "general_settings"
	p := d.Map(n, path, path, []string{"master_key", "container_secret", "max_request_body_size", "shutdown_grace",
		"data_dir", "max_file_upload_size", "max_file_storage_per_key"}, nil)
	var g General
	mk := p.String("master_key")
	switch {
	case mk.Present && mk.S != "":
		g.MasterKey = mk.S
	case mk.Env != "" && !mk.Present:
		// Fail closed: an unset variable must not turn an authenticated proxy into an open one.
		g.MissingEnv = mk.Env
		g.MasterKey = randomKey()
		d.AmendWarning(": every request is refused until it is set")
	default:
		d.Warnf("%s.master_key is not set: the proxy is open: anyone who can reach it can use its upstream keys", path)
	}
	cs := p.String("container_secret")
	g.ContainerSecret = cs.S
	if cs.Env != "" && !cs.Present {
		d.AmendWarning(": container ids are sealed with a random key per process")
	}
	g.MaxRequestBodySize, _ = p.Size("max_request_body_size", DefaultMaxRequestBodySize)
	g.ShutdownGrace = p.Duration("shutdown_grace", DefaultShutdownGrace, true)
	g.DataDir = strings.TrimSpace(p.String("data_dir").S)
	g.MaxFileUploadSize, _ = p.Size("max_file_upload_size", DefaultMaxFileUploadSize)
	g.MaxFileStoragePerKey, _ = p.Size("max_file_storage_per_key", DefaultMaxFileStoragePerKey)
	return g
}

func randomKey() string {
	return "unset-" + rand.Text() + rand.Text()
}
