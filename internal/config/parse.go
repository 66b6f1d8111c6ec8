package config

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Defaults applied by Parse; config.example.yaml documents the same values.
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

	// DefaultSandboxToolName names the local sandbox tool that stands in when sandbox_tools is absent.
	DefaultSandboxToolName = "local"

	DefaultE2BDomain   = "e2b.app"
	DefaultE2BTemplate = "code-interpreter-v1"
	DefaultE2BTimeout  = 300 * time.Second

	DefaultPython       = "/usr/bin/python3"
	DefaultMemoryLimit  = "1g"
	DefaultMaxMemory    = "4g"
	DefaultMaxProcesses = 64
	DefaultMaxFileSize  = "100m"
	DefaultMaxDiskSize  = "512m"
	DefaultPoolSize     = 2

	// InterceptionCallback is the litellm_settings.callbacks entry that turns interception on.
	InterceptionCallback = "code_interpreter_interception"
)

// envPrefix marks a value read from the environment, as in LiteLLM: "os.environ/OPENAI_API_KEY".
const envPrefix = "os.environ/"

// functionNameRE is what OpenAI accepts as a function tool name.
var functionNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ParseOptions adjusts ParseWith. The zero value reads the process environment.
type ParseOptions struct {
	// LookupEnv resolves os.environ/NAME references and the E2B_* fallbacks; nil means os.LookupEnv.
	LookupEnv func(name string) (string, bool)
}

// Load reads and parses the file at path with the process environment.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return Parse(data, path)
}

// Parse parses and validates a configuration file with the process environment. path is used in
// messages and stored in Config.Path. Every problem found is returned in one *Errors.
func Parse(data []byte, path string) (*Config, error) {
	return ParseWith(data, path, ParseOptions{})
}

// ParseWith is Parse with options. A variable named by os.environ/NAME that is not set never fails
// parsing: it becomes a warning, and the entry that needs it records it in MissingEnv.
func ParseWith(data []byte, path string, opts ParseOptions) (*Config, error) {
	lookup := opts.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	d := &decoder{lookup: lookup}
	cfg := d.config(data)
	if len(d.problems) > 0 {
		sort.SliceStable(d.problems, func(i, j int) bool { return d.problems[i].Line < d.problems[j].Line })
		return nil, &Errors{Path: path, Problems: d.problems}
	}
	cfg.Path = path
	cfg.Warnings = d.warnings
	cfg.raw = slices.Clone(data)
	return cfg, nil
}

// decoder walks the YAML node tree, collecting every problem instead of stopping at the first.
type decoder struct {
	lookup   func(string) (string, bool)
	problems []Problem
	warnings []string
}

func (d *decoder) errorf(line int, format string, args ...any) {
	d.problems = append(d.problems, Problem{Line: line, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) warnf(format string, args ...any) {
	d.warnings = append(d.warnings, fmt.Sprintf(format, args...))
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

// amendWarning adds detail to the warning just written.
func (d *decoder) amendWarning(suffix string) {
	d.warnings[len(d.warnings)-1] += suffix
}

// yamlLineRE finds the line in yaml.v3's syntax errors ("yaml: line 3: ...").
var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func (d *decoder) config(data []byte) *Config {
	cfg := &Config{}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, msg := syntaxError(data, err)
		d.errorf(line, "invalid YAML: %s", msg)
		return cfg
	}
	var root *yaml.Node
	if len(doc.Content) > 0 {
		root = doc.Content[0]
	}
	top := d.fields(root, "", "the file", []string{"model_list", "sandbox_tools", "litellm_settings", "general_settings"}, nil)

	cfg.Models = d.models(top["model_list"].Node)
	if len(cfg.Models) == 0 {
		d.warnf("model_list is empty: the proxy serves no model")
	}
	var toolNames map[string]int
	cfg.SandboxTools, toolNames = d.sandboxTools(top["sandbox_tools"].Node)
	d.litellmSettings(top["litellm_settings"].Node, cfg, toolNames)
	cfg.General = d.general(top["general_settings"].Node)
	return cfg
}

// field is a value node with the line of its key, for messages about the key itself.
type field struct {
	*yaml.Node
	keyLine int
}

// fields checks that n is a mapping (or absent/null) whose keys are all in allowed or ignored,
// reports unknown and duplicate keys, and returns the values of the allowed keys that are present.
// path is the dotted location used in errors ("model_list[1].litellm_params"); what describes n
// when path is empty.
func (d *decoder) fields(n *yaml.Node, path, what string, allowed, ignored []string) map[string]field {
	out := map[string]field{}
	n = deref(n)
	if isNull(n) {
		return out
	}
	if n.Kind != yaml.MappingNode {
		if path == "" {
			d.errorf(n.Line, "%s must be a mapping", what)
		} else {
			d.errorf(n.Line, "%s must be a mapping", path)
		}
		return out
	}
	where := path
	if where == "" {
		where = "top level"
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		if seen[key] {
			d.errorf(k.Line, "%s: duplicate key %q", where, key)
			continue
		}
		seen[key] = true
		switch {
		case slices.Contains(allowed, key):
			out[key] = field{Node: deref(v), keyLine: k.Line}
		case slices.Contains(ignored, key):
		default:
			d.errorf(k.Line, "%s: unknown key %q", where, key)
		}
	}
	return out
}

func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// value is a scalar with any os.environ/NAME reference resolved.
type value struct {
	s       string
	env     string // the variable an os.environ/NAME reference named; "" for a literal
	present bool   // the key is there with a non-null value whose variable (if any) is set
}

// scalar reads f as a string. label names the entry in warnings ("model_list[0] (gpt-5)"), key the
// field. An unset variable is a warning and leaves present false with env set.
func (d *decoder) scalar(f field, ok bool, path, label, key string) value {
	if !ok || isNull(f.Node) {
		return value{}
	}
	if f.Kind != yaml.ScalarNode {
		d.errorf(f.Line, "%s: must be a single value, not a %s", join(path, key), kindName(f.Node))
		return value{}
	}
	s := f.Value
	name, isEnv := strings.CutPrefix(s, envPrefix)
	if !isEnv {
		return value{s: s, present: true}
	}
	if name == "" {
		d.errorf(f.Line, "%s: %q names no variable", join(path, key), envPrefix)
		return value{}
	}
	v, set := d.lookup(name)
	if !set {
		d.warnf("%s: %s refers to %s, which is not set", label, key, name)
		return value{env: name}
	}
	return value{s: v, env: name, present: true}
}

// shown describes a value in an error message: non-secret settings only, so echoing it is safe.
func (v value) shown() string {
	if v.env != "" {
		return fmt.Sprintf("%q (from %s)", v.s, v.env)
	}
	return strconv.Quote(v.s)
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	default:
		return "value"
	}
}

func (d *decoder) str(m map[string]field, path, label, key string) value {
	f, ok := m[key]
	return d.scalar(f, ok, path, label, key)
}

func (d *decoder) boolean(m map[string]field, path, label, key string, def bool) bool {
	v := d.str(m, path, label, key)
	if !v.present {
		return def
	}
	b, err := strconv.ParseBool(v.s)
	if err != nil {
		d.errorf(m[key].Line, "%s: %s is not true or false", join(path, key), v.shown())
		return def
	}
	return b
}

func (d *decoder) integer(m map[string]field, path, label, key string, def, minimum int) int {
	v := d.str(m, path, label, key)
	if !v.present {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(v.s))
	if err != nil {
		d.errorf(m[key].Line, "%s: %s is not a whole number", join(path, key), v.shown())
		return def
	}
	if n < minimum {
		d.errorf(m[key].Line, "%s: must be at least %d, not %d", join(path, key), minimum, n)
		return def
	}
	return n
}

func (d *decoder) duration(m map[string]field, path, label, key string, def time.Duration, zeroOK bool) time.Duration {
	v := d.str(m, path, label, key)
	if !v.present {
		return def
	}
	t, err := ParseDuration(v.s)
	if err != nil {
		d.errorf(m[key].Line, "%s: %v%s", join(path, key), err, fromEnv(v))
		return def
	}
	if t == 0 && !zeroOK {
		d.errorf(m[key].Line, "%s: must be more than 0", join(path, key))
		return def
	}
	return t
}

// size reads a size; it returns the text as written (or def) and its value in bytes.
func (d *decoder) size(m map[string]field, path, label, key, def string) (string, int64) {
	v := d.str(m, path, label, key)
	text := def
	if v.present {
		text = strings.TrimSpace(v.s)
	}
	n, err := ParseSize(text)
	if err != nil {
		d.errorf(m[key].Line, "%s: %v%s", join(path, key), err, fromEnv(v))
		return def, mustSize(def)
	}
	if n <= 0 {
		d.errorf(m[key].Line, "%s: must be more than 0", join(path, key))
		return def, mustSize(def)
	}
	return text, n
}

func fromEnv(v value) string {
	if v.env != "" {
		return " (from " + v.env + ")"
	}
	return ""
}

func mustSize(s string) int64 {
	n, err := ParseSize(s)
	if err != nil {
		panic(err) // only called with the constants above
	}
	return n
}

// stringList reads a list of strings. It returns nil, false when the key is absent or null.
func (d *decoder) stringList(m map[string]field, path, label, key string) ([]string, bool) {
	f, ok := m[key]
	if !ok || isNull(f.Node) {
		return nil, false
	}
	if f.Kind != yaml.SequenceNode {
		d.errorf(f.Line, "%s: must be a list", join(path, key))
		return nil, false
	}
	out := []string{}
	for i, item := range f.Content {
		item = deref(item)
		v := d.scalar(field{Node: item}, true, path, label, fmt.Sprintf("%s[%d]", key, i))
		if v.present {
			out = append(out, v.s)
		} else if v.env == "" && isNull(item) {
			d.errorf(item.Line, "%s[%d]: must not be empty", join(path, key), i)
		}
	}
	return out, true
}

// baseURL checks an api_base-like value and returns it without a trailing slash.
func (d *decoder) baseURL(s string, line int, name string, v value) string {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		d.errorf(line, "%s: %s is not an absolute http(s) URL", name, redactURL(s, v))
		return ""
	}
	return strings.TrimRight(s, "/")
}

// redactURL quotes a URL for a message, leaving out anything that may hold credentials.
func redactURL(s string, v value) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		u.User = url.User("REDACTED")
		s = u.String()
	}
	if v.env != "" {
		return fmt.Sprintf("%q (from %s)", s, v.env)
	}
	return strconv.Quote(s)
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
	n = deref(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n.Line, "model_list must be a list")
		return nil
	}
	var out []Deployment
	for i, item := range n.Content {
		item = deref(item)
		path := fmt.Sprintf("model_list[%d]", i)
		entry := d.fields(item, path, path, []string{"model_name", "litellm_params"}, []string{"model_info"})
		dep := Deployment{Line: item.Line}
		label := path
		name := d.str(entry, path, label, "model_name")
		if name.present {
			dep.ModelName = name.s
			label = fmt.Sprintf("%s (%s)", path, name.s)
		}
		if name.s == "" && name.env == "" && item.Kind == yaml.MappingNode {
			d.errorf(item.Line, "%s: model_name is required", path)
		}
		pf, ok := entry["litellm_params"]
		if !ok || isNull(pf.Node) {
			if item.Kind == yaml.MappingNode {
				d.errorf(item.Line, "%s: litellm_params is required", path)
			}
			continue
		}
		ppath := path + ".litellm_params"
		p := d.fields(pf.Node, ppath, ppath, []string{"model", "api_key", "api_base"}, ignoredModelParams)
		model := d.str(p, ppath, label, "model")
		switch {
		case model.present:
			provider, upstream, found := strings.Cut(model.s, "/")
			if !found || provider == "" || upstream == "" {
				d.errorf(p["model"].Line, "%s.model: %s must be provider/model, e.g. \"openai/gpt-4.1\"", ppath, model.shown())
			} else {
				dep.Provider, dep.UpstreamModel = provider, upstream
			}
		case model.env != "":
			dep.MissingEnv = model.env
		case pf.Kind == yaml.MappingNode:
			d.errorf(pf.Line, "%s: model is required (provider/model, e.g. \"openai/gpt-4.1\")", ppath)
		}
		key := d.str(p, ppath, label, "api_key")
		dep.APIKey = key.s
		if key.env != "" && !key.present && dep.MissingEnv == "" {
			dep.MissingEnv = key.env
		}
		base := d.str(p, ppath, label, "api_base")
		switch {
		case base.present:
			dep.APIBase = d.baseURL(base.s, p["api_base"].Line, ppath+".api_base", base)
		case base.env != "":
			if dep.MissingEnv == "" {
				dep.MissingEnv = base.env
			}
			dep.APIBase = KnownAPIBase(dep.Provider)
		case dep.Provider != "":
			dep.APIBase = KnownAPIBase(dep.Provider)
			if dep.APIBase == "" {
				d.errorf(pf.Line, "%s: api_base is required for provider %q (it has no known default)", ppath, dep.Provider)
			}
		}
		out = append(out, dep)
	}
	return out
}

var (
	e2bKeys   = []string{"api_key", "api_base", "domain", "sandbox_url", "template", "timeout", "allow_internet_access"}
	localKeys = []string{"python", "memory_limit", "max_memory", "max_processes", "max_file_size", "max_disk_size", "pool_size", "work_dir"}
)

// sandboxTools reads sandbox_tools; with none configured it returns the implicit local tool. The map
// holds each name's index.
func (d *decoder) sandboxTools(n *yaml.Node) ([]SandboxTool, map[string]int) {
	names := map[string]int{}
	n = deref(n)
	if isNull(n) || (n.Kind == yaml.SequenceNode && len(n.Content) == 0) {
		t := d.localTool(SandboxTool{Name: DefaultSandboxToolName, Provider: "local"}, map[string]field{}, "", "")
		names[t.Name] = 0
		return []SandboxTool{t}, names
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n.Line, "sandbox_tools must be a list")
		return nil, names
	}
	var out []SandboxTool
	for i, item := range n.Content {
		item = deref(item)
		path := fmt.Sprintf("sandbox_tools[%d]", i)
		entry := d.fields(item, path, path, []string{"sandbox_tool_name", "litellm_params"}, nil)
		label := path
		t := SandboxTool{Line: item.Line}
		name := d.str(entry, path, label, "sandbox_tool_name")
		if name.present && name.s != "" {
			t.Name = name.s
			label = fmt.Sprintf("%s (%s)", path, name.s)
			if j, dup := names[t.Name]; dup {
				d.errorf(entry["sandbox_tool_name"].Line, "%s.sandbox_tool_name: %q is already used by sandbox_tools[%d]", path, t.Name, j)
			} else {
				names[t.Name] = i
			}
		} else if item.Kind == yaml.MappingNode {
			d.errorf(item.Line, "%s: sandbox_tool_name is required", path)
		}
		pf, ok := entry["litellm_params"]
		if !ok || isNull(pf.Node) {
			if item.Kind == yaml.MappingNode {
				d.errorf(item.Line, "%s: litellm_params is required (with sandbox_provider: local or e2b)", path)
			}
			continue
		}
		ppath := path + ".litellm_params"
		all := append(append([]string{"sandbox_provider"}, e2bKeys...), localKeys...)
		p := d.fields(pf.Node, ppath, ppath, all, nil)
		prov := d.str(p, ppath, label, "sandbox_provider")
		t.Provider = prov.s
		var other []string
		switch {
		case prov.s == "local":
			other = e2bKeys
		case prov.s == "e2b":
			other = localKeys
		case prov.present:
			d.errorf(p["sandbox_provider"].Line, "%s.sandbox_provider: %s is not a sandbox provider (local or e2b)", ppath, prov.shown())
			continue
		case prov.env == "" && pf.Kind == yaml.MappingNode:
			d.errorf(pf.Line, "%s: sandbox_provider is required (local or e2b)", ppath)
			continue
		default:
			continue
		}
		for _, k := range other {
			if f, ok := p[k]; ok {
				d.errorf(f.keyLine, "%s: key %q does not apply to sandbox_provider %s", ppath, k, prov.s)
			}
		}
		if prov.s == "local" {
			t = d.localTool(t, p, ppath, label)
		} else {
			t = d.e2bTool(t, p, ppath, label, pf.Line)
		}
		out = append(out, t)
	}
	return out, names
}

func (d *decoder) localTool(t SandboxTool, p map[string]field, path, label string) SandboxTool {
	t.Python = DefaultPython
	if v := d.str(p, path, label, "python"); v.present {
		if !filepath.IsAbs(v.s) {
			d.errorf(p["python"].Line, "%s.python: %s must be an absolute path", path, v.shown())
		} else {
			t.Python = v.s
		}
	}
	t.MemoryLimit, t.MemoryLimitBytes = d.size(p, path, label, "memory_limit", DefaultMemoryLimit)
	t.MaxMemory, t.MaxMemoryBytes = d.size(p, path, label, "max_memory", DefaultMaxMemory)
	if t.MemoryLimitBytes > t.MaxMemoryBytes {
		line := p["memory_limit"].Line
		if line == 0 {
			line = p["max_memory"].Line
		}
		d.errorf(line, "%s: memory_limit (%s) is larger than max_memory (%s)", path, t.MemoryLimit, t.MaxMemory)
	}
	t.MaxProcesses = d.integer(p, path, label, "max_processes", DefaultMaxProcesses, 1)
	t.MaxFileSize, t.MaxFileSizeBytes = d.size(p, path, label, "max_file_size", DefaultMaxFileSize)
	t.MaxDiskSize, t.MaxDiskSizeBytes = d.size(p, path, label, "max_disk_size", DefaultMaxDiskSize)
	t.PoolSize = d.integer(p, path, label, "pool_size", DefaultPoolSize, 0)
	t.WorkDir = filepath.Join(os.TempDir(), "ciproxy-sandboxes")
	if v := d.str(p, path, label, "work_dir"); v.present {
		if !filepath.IsAbs(v.s) {
			d.errorf(p["work_dir"].Line, "%s.work_dir: %s must be an absolute path", path, v.shown())
		} else {
			t.WorkDir = filepath.Clean(v.s)
		}
	}
	return t
}

// e2bTool applies the e2b settings with the official SDKs' environment fallbacks: E2B_API_KEY,
// E2B_DOMAIN, E2B_API_URL (the whole control-plane base) and E2B_SANDBOX_URL (one data-plane base).
func (d *decoder) e2bTool(t SandboxTool, p map[string]field, path, label string, line int) SandboxTool {
	// fallback returns the configured value, else the environment variable's.
	fallback := func(key, env string) (value, int) {
		v := d.str(p, path, label, key)
		if v.env != "" && !v.present && t.MissingEnv == "" {
			// Never fall back to a default endpoint the operator did not choose.
			t.MissingEnv = v.env
		}
		if v.present || v.env != "" {
			return v, p[key].Line
		}
		if s, ok := d.lookup(env); ok && s != "" {
			return value{s: s, env: env, present: true}, line
		}
		return value{}, 0
	}
	key := d.str(p, path, label, "api_key")
	switch {
	case key.present:
		t.APIKey = key.s
	case key.env != "":
		t.MissingEnv = key.env
	default:
		if s, ok := d.lookup("E2B_API_KEY"); ok && s != "" {
			t.APIKey = s
		} else {
			d.warnf("%s: no api_key, and E2B_API_KEY, which it falls back to, is not set", label)
			t.MissingEnv = "E2B_API_KEY"
		}
	}
	t.Domain = DefaultE2BDomain
	if v, l := fallback("domain", "E2B_DOMAIN"); v.present {
		dom := strings.TrimSpace(v.s)
		if dom == "" || strings.ContainsAny(dom, "/:@ ") {
			d.errorf(l, "%s.domain: %s is not a domain name (e.g. \"e2b.app\")", path, v.shown())
		} else {
			t.Domain = dom
		}
	}
	if v, l := fallback("api_base", "E2B_API_URL"); v.present {
		t.APIBase = d.baseURL(v.s, l, path+".api_base", v)
	} else {
		t.APIBase = "https://api." + t.Domain
	}
	if v, l := fallback("sandbox_url", "E2B_SANDBOX_URL"); v.present {
		t.SandboxURL = d.baseURL(v.s, l, path+".sandbox_url", v)
	}
	t.Template = DefaultE2BTemplate
	if v := d.str(p, path, label, "template"); v.present && v.s != "" {
		t.Template = v.s
	}
	t.Timeout = d.duration(p, path, label, "timeout", DefaultE2BTimeout, false)
	t.AllowInternetAccess = d.boolean(p, path, label, "allow_internet_access", false)
	return t
}

func (d *decoder) litellmSettings(n *yaml.Node, cfg *Config, tools map[string]int) {
	const path = "litellm_settings"
	s := d.fields(n, path, path, []string{"callbacks", "code_interpreter_interception_params"}, ignoredLiteLLMSettings)
	cbs, _ := d.stringList(s, path, path, "callbacks")
	cfg.Callbacks = cbs
	for _, cb := range cbs {
		if cb != InterceptionCallback {
			d.warnf("%s.callbacks: %q is not supported here and is ignored", path, cb)
		}
	}

	ipath := path + ".code_interpreter_interception_params"
	pf, given := s["code_interpreter_interception_params"]
	p := d.fields(pf.Node, ipath, ipath, []string{
		"enabled", "enabled_providers", "sandbox_tool_name", "function_name", "max_iterations",
		"execution_timeout", "model_output_limit", "container_idle_timeout",
	}, nil)
	in := &cfg.Interception
	in.Enabled = d.boolean(p, ipath, ipath, "enabled", true)
	in.EnabledProviders, _ = d.stringList(p, ipath, ipath, "enabled_providers")
	for _, prov := range in.EnabledProviders {
		if !slices.ContainsFunc(cfg.Models, func(m Deployment) bool { return m.Provider == prov }) {
			d.warnf("%s.enabled_providers: no model_list entry uses provider %q", ipath, prov)
		}
	}
	if len(cfg.SandboxTools) > 0 {
		in.SandboxToolName = cfg.SandboxTools[0].Name
	}
	if v := d.str(p, ipath, ipath, "sandbox_tool_name"); v.present {
		if _, ok := tools[v.s]; !ok {
			d.errorf(p["sandbox_tool_name"].Line, "%s.sandbox_tool_name: no sandbox tool is named %s", ipath, v.shown())
		} else {
			in.SandboxToolName = v.s
		}
	}
	in.FunctionName = DefaultFunctionName
	if v := d.str(p, ipath, ipath, "function_name"); v.present {
		if !functionNameRE.MatchString(v.s) {
			d.errorf(p["function_name"].Line, "%s.function_name: %s is not a valid function name (1 to 64 letters, digits, _ or -)", ipath, v.shown())
		} else {
			in.FunctionName = v.s
		}
	}
	in.MaxIterations = d.integer(p, ipath, ipath, "max_iterations", DefaultMaxIterations, 1)
	in.ExecutionTimeout = d.duration(p, ipath, ipath, "execution_timeout", DefaultExecutionTimeout, false)
	_, limit := d.size(p, ipath, ipath, "model_output_limit", strconv.Itoa(DefaultModelOutputLimit))
	if limit > 1<<30 {
		d.errorf(p["model_output_limit"].Line, "%s.model_output_limit: must be at most 1g", ipath)
		limit = DefaultModelOutputLimit
	}
	in.ModelOutputLimit = int(limit)
	in.ContainerIdleTimeout = d.duration(p, ipath, ipath, "container_idle_timeout", DefaultContainerIdleTimeout, true)

	if given && !isNull(pf.Node) && in.Enabled && !slices.Contains(cbs, InterceptionCallback) {
		d.warnf("%s is set, but litellm_settings.callbacks does not list %q: interception is off", ipath, InterceptionCallback)
	}
}

func (d *decoder) general(n *yaml.Node) General {
	const path = "general_settings"
	p := d.fields(n, path, path, []string{"master_key", "container_secret", "max_request_body_size", "shutdown_grace",
		"data_dir", "max_file_upload_size", "max_file_storage_per_key"}, nil)
	var g General
	mk := d.str(p, path, path, "master_key")
	switch {
	case mk.present && mk.s != "":
		g.MasterKey = mk.s
	case mk.env != "" && !mk.present:
		// Fail closed: an unset variable must not turn an authenticated proxy into an open one.
		g.MissingEnv = mk.env
		g.MasterKey = randomKey()
		d.amendWarning(": every request is refused until it is set")
	default:
		d.warnf("%s.master_key is not set: the proxy is open: anyone who can reach it can use its upstream keys", path)
	}
	cs := d.str(p, path, path, "container_secret")
	g.ContainerSecret = cs.s
	if cs.env != "" && !cs.present {
		d.amendWarning(": container ids are sealed with a random key per process")
	}
	_, g.MaxRequestBodySize = d.size(p, path, path, "max_request_body_size", strconv.Itoa(DefaultMaxRequestBodySize))
	g.ShutdownGrace = d.duration(p, path, path, "shutdown_grace", DefaultShutdownGrace, true)
	g.DataDir = strings.TrimSpace(d.str(p, path, path, "data_dir").s)
	_, g.MaxFileUploadSize = d.size(p, path, path, "max_file_upload_size", strconv.Itoa(DefaultMaxFileUploadSize))
	_, g.MaxFileStoragePerKey = d.size(p, path, path, "max_file_storage_per_key", strconv.Itoa(DefaultMaxFileStoragePerKey))
	return g
}

func randomKey() string {
	return "unset-" + rand.Text() + rand.Text()
}
