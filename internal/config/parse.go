package config

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
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
	DefaultShellFunctionName    = "shell"
	DefaultMaxIterations        = 20
	DefaultExecutionTimeout     = 120 * time.Second
	DefaultModelOutputLimit     = 16384
	DefaultContainerIdleTimeout = 20 * time.Minute
	DefaultKernelIdleTimeout    = 5 * time.Minute
	DefaultMaxRequestBodySize   = 32 << 20
	DefaultShutdownGrace        = 30 * time.Second
	DefaultMaxFileUploadSize    = 512 << 20 // OpenAI's limit for one file
	DefaultMaxFileStoragePerKey = 10 << 30
	// The bytes of stored files that requests in flight inline by file_id, in all and per key:
	// above what one request may name (100 MB of files and images), well below the host's memory.
	DefaultMaxInlineBytesInFlight       = 512 << 20
	DefaultMaxInlineBytesInFlightPerKey = 128 << 20
	// Uploads in flight: one key's at once, every key's bytes together (of this process, or of
	// every replica on Redis), and how long one upload's body may take.
	DefaultMaxConcurrentUploadsPerKey = 16
	DefaultMaxUploadBytesInFlight     = 2 << 30
	DefaultUploadTimeout              = 15 * time.Minute

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
	// SharedSecret is general_settings.container_secret when the file sets none: the secret the
	// replicas agreed on through their Redis (docs/replicas.md).
	SharedSecret string
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
	cfg, err := Check(data, path, opts)
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// Check parses data as ParseWith does, but returns the configuration even when the file has
// errors (with them as the *Errors), so that --check can list what else the file holds: its
// ignored LiteLLM keys and unusable deployments. A configuration with errors must never serve.
func Check(data []byte, path string, opts ParseOptions) (*Config, error) {
	d := &decoder{Decoder: settings.NewDecoder(opts.LookupEnv), backends: opts.Backends, sharedSecret: opts.SharedSecret}
	cfg := d.config(data)
	cfg.Path = path
	cfg.Warnings = d.Warnings()
	cfg.raw = slices.Clone(data)
	return cfg, d.Err(path)
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
	backends     []SandboxBackend
	sharedSecret string
	ignored      map[string]*IgnoredKey // by place in the file
	// toolsAt says where each model_list entry's intercepted_tools are, by the entry's line.
	toolsAt map[int]toolsAt
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
	top := d.section(root, secTop, "", "the file", "")

	// environment_variables first: every os.environ/ reference below may name one of them.
	d.environment(top.Node("environment_variables"))
	litellm := d.section(top.Node("litellm_settings"), secLiteLLMSettings, "litellm_settings", "litellm_settings", "litellm_settings")
	var defaults deploymentDefaults
	cfg.Router, defaults = d.routerSettings(top.Node("router_settings"), litellm)
	creds := d.credentials(top.Node("credential_list"))

	cfg.Models = d.models(top.Node("model_list"), creds, defaults)
	if len(cfg.Models) == 0 {
		d.Warnf("model_list is empty: the proxy serves no model")
	}
	var toolNames map[string]int
	cfg.SandboxTools, toolNames = d.sandboxTools(top.Node("sandbox_tools"))
	d.litellmSettings(litellm, cfg, toolNames)
	d.modelTools(cfg)
	cfg.General = d.general(top.Node("general_settings"))
	cfg.Ignored = d.ignoredKeys()
	return cfg
}

// section decodes one mapping of the vocabulary's section: its readable keys are returned, its
// ignored keys recorded under pattern (their place in the file, "router_settings"), anything else
// is an unknown key.
func (d *decoder) section(n *yaml.Node, section, path, label, pattern string) *settings.Map {
	readable, ignored := sectionKeys(section)
	m := d.Map(n, path, label, readable, ignored)
	d.noteIgnored(pattern, section, m.IgnoredKeys())
	return m
}

// noteIgnored records ignored keys found in a mapping of section, at the place pattern names.
func (d *decoder) noteIgnored(pattern, section string, keys []settings.KeyAt) {
	for _, k := range keys {
		name := k.Key
		if pattern != "" {
			name = pattern + "." + k.Key
		}
		if d.ignored == nil {
			d.ignored = map[string]*IgnoredKey{}
		}
		ik, ok := d.ignored[name]
		if !ok {
			v, _ := lookupKey(section, k.Key)
			ik = &IgnoredKey{Key: name, Reason: v.note}
			d.ignored[name] = ik
		}
		ik.Lines = append(ik.Lines, k.Line)
	}
}

// ignoredKeys returns the ignored keys recorded, ordered by the line each is first on.
func (d *decoder) ignoredKeys() []IgnoredKey {
	out := make([]IgnoredKey, 0, len(d.ignored))
	for _, k := range d.ignored {
		slices.Sort(k.Lines)
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b IgnoredKey) int {
		if a.Lines[0] != b.Lines[0] {
			return a.Lines[0] - b.Lines[0]
		}
		return strings.Compare(a.Key, b.Key)
	})
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
		t := SandboxTool{Name: DefaultSandboxToolName, Backend: DefaultSandboxBackend}
		if b, ok := d.backend(t.Backend); ok {
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
		for _, k := range b.Keys {
			if !slices.Contains(all, k) { // backends share keys (api_key, api_base)
				all = append(all, k)
			}
		}
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
		kind := p.String("sandbox_provider")
		t.Backend = kind.S
		b, known := d.backend(kind.S)
		switch {
		case kind.Present && !known:
			d.Errorf(p.ValueLine("sandbox_provider"), "%s: %s is not a sandbox provider (%s)", p.Key("sandbox_provider"), kind.Shown(), d.backendNames())
			continue
		case !kind.Present && kind.Env == "" && pn.Kind == yaml.MappingNode:
			d.Errorf(pn.Line, "%s: sandbox_provider is required (%s)", ppath, d.backendNames())
			continue
		case !kind.Present:
			continue
		}
		for _, k := range all[1:] {
			if p.Has(k) && !slices.Contains(b.Keys, k) {
				d.Errorf(p.KeyLine(k), "%s: key %q does not apply to sandbox_provider %s", ppath, k, kind.S)
			}
		}
		t.Settings = b.Decode(p)
		out = append(out, t)
	}
	return out, names
}

// litellmSettings reads litellm_settings (s, decoded by config) but for num_retries and
// request_timeout, which routerSettings reads.
func (d *decoder) litellmSettings(s *settings.Map, cfg *Config, tools map[string]int) {
	const path = "litellm_settings"
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
		"tools", "shell_function_name", "shell_function_description",
		"execution_timeout", "model_output_limit", "container_idle_timeout", "kernel_idle_timeout",
		"max_calls_per_turn", "max_executions", "max_code_size", "max_response_output",
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
	in.Tools = slices.Clone(HostedTools)
	if v, ok := hostedTools(p, "tools"); ok {
		in.Tools = v
	}
	in.ShellFunctionName = DefaultShellFunctionName
	if v := p.String("shell_function_name"); v.Present {
		switch {
		case !functionNameRE.MatchString(v.S):
			d.Errorf(p.ValueLine("shell_function_name"), "%s: %s is not a valid function name (1 to 64 letters, digits, _ or -)", p.Key("shell_function_name"), v.Shown())
		default:
			in.ShellFunctionName = v.S
		}
	}
	if in.ShellFunctionName == in.FunctionName {
		d.Errorf(p.ValueLine("shell_function_name"), "%s: the shell tool's function needs a name of its own (function_name is %q)", p.Key("shell_function_name"), in.FunctionName)
	}
	in.ShellFunctionDescription = p.String("shell_function_description").S
	in.MaxIterations = p.Int("max_iterations", DefaultMaxIterations, 1)
	in.ExecutionTimeout = p.Duration("execution_timeout", DefaultExecutionTimeout, false)
	limit, _ := p.Size("model_output_limit", DefaultModelOutputLimit)
	if limit > 1<<30 {
		d.Errorf(p.ValueLine("model_output_limit"), "%s: must be at most 1g", p.Key("model_output_limit"))
		limit = DefaultModelOutputLimit
	}
	in.ModelOutputLimit = int(limit)
	in.ContainerIdleTimeout = p.Duration("container_idle_timeout", DefaultContainerIdleTimeout, true)
	in.KernelIdleTimeout = p.Duration("kernel_idle_timeout", DefaultKernelIdleTimeout, true)
	d.limits(p, in)

	if given && in.Enabled && !slices.Contains(cbs, InterceptionCallback) {
		d.Warnf("%s is set, but litellm_settings.callbacks does not list %q: interception is off", ipath, InterceptionCallback)
	}
}

// hostedTools reads key of m as a list of HostedTools names (code_interpreter_interception_params
// tools, model_info.intercepted_tools): each other name is an error at its own line, naming the
// valid ones; a name listed twice counts once. It returns nil, false when the key is absent or
// null, and an empty, non-nil list for an empty one.
func hostedTools(m *settings.Map, key string) ([]string, bool) {
	names, ok := m.StringList(key)
	if !ok {
		return nil, false
	}
	var items []*yaml.Node // the list's items, for their lines; StringList checked its shape
	if n := settings.Deref(m.Node(key)); n != nil && n.Kind == yaml.SequenceNode {
		items = n.Content
	}
	out := []string{}
	for _, t := range names {
		line := m.ValueLine(key)
		for _, item := range items {
			if item = settings.Deref(item); item.Kind == yaml.ScalarNode && item.Value == t {
				line = item.Line
				break
			}
		}
		switch {
		case !slices.Contains(HostedTools, t):
			m.Errorf(line, "%s: %q is not a hosted tool this proxy runs (%s)", m.Key(key), t, strings.Join(HostedTools, ", "))
		case !slices.Contains(out, t):
			out = append(out, t)
		}
	}
	return out, true
}

func (d *decoder) general(n *yaml.Node) General {
	const path = "general_settings"
	p := d.section(n, secGeneral, path, path, path)
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
	case !p.Has("client_keys"):
		d.Warnf("%s.master_key is not set: the proxy is open: anyone who can reach it can use its upstream keys", path)
	}
	cs := p.String("container_secret")
	g.ContainerSecret = cs.S
	if g.ContainerSecret == "" {
		g.ContainerSecret = d.sharedSecret
	}
	if cs.Env != "" && !cs.Present {
		d.AmendWarning(": replicas that share Redis use the secret they agreed on through it instead")
	}
	g.MaxRequestBodySize, _ = p.Size("max_request_body_size", DefaultMaxRequestBodySize)
	// LiteLLM's max_request_size_mb, in MiB, applies when this proxy's own key is absent.
	if !p.Has("max_request_body_size") {
		if mb := p.Int("max_request_size_mb", 0, 1); mb > 0 {
			if mb > 1<<20 {
				d.Errorf(p.ValueLine("max_request_size_mb"), "%s: must be at most %d", p.Key("max_request_size_mb"), 1<<20)
			} else {
				g.MaxRequestBodySize = int64(mb) << 20
			}
		}
	}
	g.ShutdownGrace = p.Duration("shutdown_grace", DefaultShutdownGrace, true)
	g.DataDir = strings.TrimSpace(p.String("data_dir").S)
	g.MaxFileUploadSize, _ = p.Size("max_file_upload_size", DefaultMaxFileUploadSize)
	g.MaxFileStoragePerKey, _ = p.Size("max_file_storage_per_key", DefaultMaxFileStoragePerKey)
	g.MaxInlineBytesInFlight, _ = p.Size("max_inline_bytes_in_flight", DefaultMaxInlineBytesInFlight)
	g.MaxInlineBytesInFlightPerKey, _ = p.Size("max_inline_bytes_in_flight_per_key", DefaultMaxInlineBytesInFlightPerKey)
	g.MaxConcurrentUploadsPerKey = p.Int("max_concurrent_uploads_per_key", DefaultMaxConcurrentUploadsPerKey, 1)
	g.MaxUploadBytesInFlight, _ = p.Size("max_upload_bytes_in_flight", DefaultMaxUploadBytesInFlight)
	g.UploadTimeout = p.Duration("upload_timeout", DefaultUploadTimeout, false)
	if g.MaxUploadBytesInFlight < g.MaxFileUploadSize {
		d.Warnf("%s.max_upload_bytes_in_flight (%d) is below max_file_upload_size (%d): a file larger than it can never be uploaded",
			path, g.MaxUploadBytesInFlight, g.MaxFileUploadSize)
	}
	g.Quotas = d.quotas(p, keyCount(g.MasterKey, p.Node("client_keys")))
	g.ClientKeys = d.clientKeys(p.Node("client_keys"), g.Quotas, g.MasterKey)
	if v := p.String("advertise_url"); v.Present && strings.TrimSpace(v.S) != "" {
		if err := CheckAdvertiseURL(strings.TrimSpace(v.S)); err != nil {
			d.Errorf(p.ValueLine("advertise_url"), "%s: %v%s", p.Key("advertise_url"), err, v.FromEnv())
		} else {
			g.AdvertiseURL = strings.TrimRight(strings.TrimSpace(v.S), "/")
		}
	}
	return g
}

func randomKey() string {
	return "unset-" + rand.Text() + rand.Text()
}

// CheckAdvertiseURL reports what is wrong with u as an advertised address (general_settings'
// advertise_url, the --advertise-url flag): it must be an http or https URL with a host and a
// port, and nothing else (no credentials, path, query or fragment).
func CheckAdvertiseURL(u string) error {
	parsed, err := url.Parse(u)
	switch {
	case err != nil:
		return errors.New("not a URL")
	case parsed.Scheme != "http" && parsed.Scheme != "https":
		return errors.New("must be an http:// or https:// URL")
	case parsed.Hostname() == "" || parsed.Port() == "":
		return errors.New("must name a host and a port (http://10.0.0.5:4000)")
	case parsed.User != nil:
		return errors.New("must not hold credentials")
	case strings.Trim(parsed.Path, "/") != "" || parsed.RawQuery != "" || parsed.Fragment != "":
		return errors.New("must have no path, query or fragment")
	}
	return nil
}
