// Package settings reads settings out of the YAML of the configuration file, the way that file writes
// them: a mapping's unknown and duplicate keys are errors, a value "os.environ/NAME" is read from the
// environment, sizes and durations have one syntax each (ParseSize, ParseDuration), and every problem
// carries its line. internal/config reads the proxy's own sections with it, and each sandbox backend
// reads its tools' litellm_params with it, so that both report problems alike and in one list.
package settings

import (
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// EnvPrefix marks a value read from the environment, as in LiteLLM: "os.environ/OPENAI_API_KEY".
const EnvPrefix = "os.environ/"

// Decoder collects the problems and warnings of one file. It is not safe for concurrent use.
type Decoder struct {
	lookup   func(string) (string, bool)
	overlay  map[string]string
	problems []Problem
	warnings []string
}

// NewDecoder returns a Decoder that resolves os.environ/NAME with lookup; nil means os.LookupEnv.
func NewDecoder(lookup func(name string) (string, bool)) *Decoder {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	return &Decoder{lookup: lookup}
}

// Errorf records a problem at line.
func (d *Decoder) Errorf(line int, format string, args ...any) {
	d.problems = append(d.problems, Problem{Line: line, Msg: fmt.Sprintf(format, args...)})
}

// Warnf records a warning: something that does not stop the proxy but that the operator should know.
func (d *Decoder) Warnf(format string, args ...any) {
	d.warnings = append(d.warnings, fmt.Sprintf(format, args...))
}

// AmendWarning adds detail to the warning written last; it does nothing when there is none.
func (d *Decoder) AmendWarning(suffix string) {
	if len(d.warnings) > 0 {
		d.warnings[len(d.warnings)-1] += suffix
	}
}

// LookupEnv reads an environment variable as the Decoder's os.environ/NAME references do: from the
// overlay first (Overlay), then from the environment.
func (d *Decoder) LookupEnv(name string) (string, bool) {
	if v, ok := d.overlay[name]; ok {
		return v, true
	}
	return d.lookup(name)
}

// Overlay makes vars take precedence over the environment for every later lookup, as LiteLLM's
// environment_variables section does. The process environment itself is never changed: parsing
// has no side effects.
func (d *Decoder) Overlay(vars map[string]string) { d.overlay = vars }

// Warnings returns the warnings recorded so far, in order.
func (d *Decoder) Warnings() []string { return slices.Clone(d.warnings) }

// Map is one YAML mapping being decoded: the values of the keys it may hold. Each getter reads its key
// once (a second read returns the same value and repeats no warning) and records what is wrong with it.
type Map struct {
	d       *Decoder
	path    string
	label   string
	line    int
	order   []string // the readable keys present, in file order
	fields  map[string]field
	values  map[string]Value
	ignored []KeyAt
}

// KeyAt is a key of a mapping and the line it is on.
type KeyAt struct {
	Key  string
	Line int
}

// field is a value node with the line of its key, for messages about the key itself.
type field struct {
	node    *yaml.Node
	keyLine int
}

// Map checks that n is a mapping (or absent, or null) whose keys are all in allowed or ignored,
// records unknown and duplicate keys, and returns the mapping's allowed keys for reading; the ignored
// keys present are listed by IgnoredKeys. path is the dotted location used in problems
// ("model_list[1].litellm_params", "" for the top level); label names the entry in warnings
// ("model_list[1] (gpt-5)") and, at the top level, in problems ("the file").
func (d *Decoder) Map(n *yaml.Node, path, label string, allowed, ignored []string) *Map {
	m := d.mapping(n, path, label, func(key string) (readable, known bool) {
		switch {
		case slices.Contains(allowed, key):
			return true, true
		case slices.Contains(ignored, key):
			return false, true
		}
		return false, false
	}, func(key string) string { return closest(key, allowed, ignored) })
	return m
}

// closest returns the key of lists nearest to key when it is near enough to be a typo of it (at
// most two edits, and fewer than half the key), or "".
func closest(key string, lists ...[]string) string {
	best, bestDist := "", 3
	for _, list := range lists {
		for _, k := range list {
			if d := editDistance(key, k); d < bestDist && d*2 < len(k) {
				best, bestDist = k, d
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// OpenMap is Map for a mapping whose keys are free (LiteLLM's model_info, environment_variables,
// extra_headers): every key may be read, only duplicates are problems.
func (d *Decoder) OpenMap(n *yaml.Node, path, label string) *Map {
	return d.mapping(n, path, label, func(string) (bool, bool) { return true, true }, nil)
}

// mapping builds a Map; classify reports whether a key may be read and whether it is known at all.
// suggest, when not nil, names a known key an unknown one may be a typo of.
func (d *Decoder) mapping(n *yaml.Node, path, label string, classify func(key string) (readable, known bool), suggest func(key string) string) *Map {
	m := &Map{d: d, path: path, label: label, fields: map[string]field{}, values: map[string]Value{}}
	n = Deref(n)
	if IsNull(n) {
		return m
	}
	m.line = n.Line
	if n.Kind != yaml.MappingNode {
		what := path
		if what == "" {
			what = label
		}
		d.Errorf(n.Line, "%s must be a mapping", what)
		return m
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
			d.Errorf(k.Line, "%s: duplicate key %q", where, key)
			continue
		}
		seen[key] = true
		switch readable, known := classify(key); {
		case readable:
			m.fields[key] = field{node: Deref(v), keyLine: k.Line}
			m.order = append(m.order, key)
		case known:
			m.ignored = append(m.ignored, KeyAt{Key: key, Line: k.Line})
		default:
			if near := suggestion(suggest, key); near != "" {
				d.Errorf(k.Line, "%s: unknown key %q (did you mean %q?)", where, key, near)
			} else {
				d.Errorf(k.Line, "%s: unknown key %q", where, key)
			}
		}
	}
	return m
}

func suggestion(suggest func(string) string, key string) string {
	if suggest == nil {
		return ""
	}
	return suggest(key)
}

// Keys returns the readable keys present, in file order.
func (m *Map) Keys() []string { return slices.Clone(m.order) }

// IgnoredKeys returns the ignored keys present (see Map), in file order.
func (m *Map) IgnoredKeys() []KeyAt { return slices.Clone(m.ignored) }

// Decoder returns the Decoder the Map records its problems in.
func (m *Map) Decoder() *Decoder { return m.d }

// Path is the mapping's dotted location in problems.
func (m *Map) Path() string { return m.path }

// Label is how warnings name the entry the mapping belongs to.
func (m *Map) Label() string { return m.label }

// Line is the line where the mapping starts; 0 when it is absent.
func (m *Map) Line() int { return m.line }

// Key is the dotted location of key in problems ("sandbox_tools[0].litellm_params.python").
func (m *Map) Key(key string) string {
	if m.path == "" {
		return key
	}
	return m.path + "." + key
}

// Has reports whether key is present (with any value, null included).
func (m *Map) Has(key string) bool {
	_, ok := m.fields[key]
	return ok
}

// Node returns key's value node, nil when the key is absent.
func (m *Map) Node(key string) *yaml.Node { return m.fields[key].node }

// ValueLine is the line of key's value; 0 when the key is absent.
func (m *Map) ValueLine(key string) int {
	if n := m.fields[key].node; n != nil {
		return n.Line
	}
	return 0
}

// KeyLine is the line of key itself; 0 when the key is absent.
func (m *Map) KeyLine(key string) int { return m.fields[key].keyLine }

// Errorf records a problem at line.
func (m *Map) Errorf(line int, format string, args ...any) { m.d.Errorf(line, format, args...) }

// Warnf records a warning.
func (m *Map) Warnf(format string, args ...any) { m.d.Warnf(format, args...) }

// LookupEnv reads an environment variable as os.environ/NAME references do.
func (m *Map) LookupEnv(name string) (string, bool) { return m.d.LookupEnv(name) }

// Value is a scalar with any os.environ/NAME reference resolved.
type Value struct {
	// S is the value, or the variable's value for an os.environ/NAME reference.
	S string
	// Env is the variable an os.environ/NAME reference named; "" for a literal.
	Env string
	// Present reports that the key is there with a non-null value whose variable (if any) is set.
	Present bool
}

// Shown describes the value in a message: for settings that are not secret only, since it echoes them.
func (v Value) Shown() string {
	if v.Env != "" {
		return fmt.Sprintf("%q (from %s)", v.S, v.Env)
	}
	return strconv.Quote(v.S)
}

// FromEnv is " (from NAME)" for a value read from the environment, "" otherwise: a suffix for messages.
func (v Value) FromEnv() string {
	if v.Env != "" {
		return " (from " + v.Env + ")"
	}
	return ""
}

// String reads key as a string. A variable that os.environ/NAME names and that is not set is a
// warning and leaves Present false with Env set.
func (m *Map) String(key string) Value {
	if v, ok := m.values[key]; ok {
		return v
	}
	f, ok := m.fields[key]
	v := m.scalar(f.node, ok, key)
	m.values[key] = v
	return v
}

// scalar reads n, the value of key (present reports that the key is there).
func (m *Map) scalar(n *yaml.Node, present bool, key string) Value {
	if !present || IsNull(n) {
		return Value{}
	}
	if n.Kind != yaml.ScalarNode {
		m.d.Errorf(n.Line, "%s: must be a single value, not a %s", m.Key(key), kindName(n))
		return Value{}
	}
	s := n.Value
	name, isEnv := strings.CutPrefix(s, EnvPrefix)
	if !isEnv {
		return Value{S: s, Present: true}
	}
	if name == "" {
		m.d.Errorf(n.Line, "%s: %q names no variable", m.Key(key), EnvPrefix)
		return Value{}
	}
	v, set := m.d.LookupEnv(name)
	if !set {
		m.d.Warnf("%s: %s refers to %s, which is not set", m.label, key, name)
		return Value{Env: name}
	}
	return Value{S: v, Env: name, Present: true}
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

// Bool reads key as true or false; def when it is absent or wrong.
func (m *Map) Bool(key string, def bool) bool {
	v := m.String(key)
	if !v.Present {
		return def
	}
	b, err := strconv.ParseBool(v.S)
	if err != nil {
		m.d.Errorf(m.ValueLine(key), "%s: %s is not true or false", m.Key(key), v.Shown())
		return def
	}
	return b
}

// Int reads key as a whole number of at least minimum; def when it is absent or wrong.
func (m *Map) Int(key string, def, minimum int) int {
	v := m.String(key)
	if !v.Present {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(v.S))
	if err != nil {
		m.d.Errorf(m.ValueLine(key), "%s: %s is not a whole number", m.Key(key), v.Shown())
		return def
	}
	if n < minimum {
		m.d.Errorf(m.ValueLine(key), "%s: must be at least %d, not %d", m.Key(key), minimum, n)
		return def
	}
	return n
}

// Duration reads key with ParseDuration; 0 is allowed only when zeroOK. def when absent or wrong.
func (m *Map) Duration(key string, def time.Duration, zeroOK bool) time.Duration {
	v := m.String(key)
	if !v.Present {
		return def
	}
	t, err := ParseDuration(v.S)
	if err != nil {
		m.d.Errorf(m.ValueLine(key), "%s: %v%s", m.Key(key), err, v.FromEnv())
		return def
	}
	if t == 0 && !zeroOK {
		m.d.Errorf(m.ValueLine(key), "%s: must be more than 0", m.Key(key))
		return def
	}
	return t
}

// Size reads key with ParseSize as a number of bytes above 0, and returns it with its text as written
// (FormatSize(def) when the key is absent). def and its text when the value is wrong.
func (m *Map) Size(key string, def int64) (int64, string) {
	v := m.String(key)
	if !v.Present {
		return def, FormatSize(def)
	}
	text := strings.TrimSpace(v.S)
	n, err := ParseSize(text)
	if err != nil {
		m.d.Errorf(m.ValueLine(key), "%s: %v%s", m.Key(key), err, v.FromEnv())
		return def, FormatSize(def)
	}
	if n <= 0 {
		m.d.Errorf(m.ValueLine(key), "%s: must be more than 0", m.Key(key))
		return def, FormatSize(def)
	}
	return n, text
}

// StringList reads key as a list of strings. It returns nil, false when the key is absent or null.
func (m *Map) StringList(key string) ([]string, bool) {
	f, ok := m.fields[key]
	if !ok || IsNull(f.node) {
		return nil, false
	}
	if f.node.Kind != yaml.SequenceNode {
		m.d.Errorf(f.node.Line, "%s: must be a list", m.Key(key))
		return nil, false
	}
	out := []string{}
	for i, item := range f.node.Content {
		item = Deref(item)
		name := fmt.Sprintf("%s[%d]", key, i)
		v := m.scalar(item, true, name)
		if v.Present {
			out = append(out, v.S)
		} else if v.Env == "" && IsNull(item) {
			m.d.Errorf(item.Line, "%s: must not be empty", m.Key(name))
		}
	}
	return out, true
}

// BaseURL checks that v, the value of the setting called name in messages and found at line, is an
// absolute http(s) URL, and returns it without a trailing slash ("" when it is not).
func (m *Map) BaseURL(v Value, line int, name string) string {
	u, err := url.Parse(v.S)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		m.d.Errorf(line, "%s: %s is not an absolute http(s) URL", name, redactURL(v))
		return ""
	}
	return strings.TrimRight(v.S, "/")
}

// redactURL quotes a URL for a message, leaving out anything that may hold credentials.
func redactURL(v Value) string {
	s := v.S
	if u, err := url.Parse(s); err == nil && u.User != nil {
		u.User = url.User("REDACTED")
		s = u.String()
	}
	if v.Env != "" {
		return fmt.Sprintf("%q (from %s)", s, v.Env)
	}
	return strconv.Quote(s)
}

// Deref follows YAML aliases to the node they name.
func Deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// IsNull reports whether n is absent or a YAML null.
func IsNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}
