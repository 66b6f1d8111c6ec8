package config

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ciproxy/ciproxy/internal/settings"
)

// Bounds on a default parameter's value, so that a hostile or broken file (a YAML alias bomb)
// cannot make every request body huge or deeply nested.
const (
	maxParamDepth = 32
	maxParamNodes = 10000
)

// jsonValue converts the YAML value n into JSON, resolving os.environ/NAME strings at any depth.
// It records a problem and returns nil for what JSON cannot hold or what is too large; it returns
// nil, having warned, when a variable is not set. name is the key in messages.
func (d *decoder) jsonValue(n *yaml.Node, name, label, key string) json.RawMessage {
	budget := maxParamNodes
	v, ok := d.yamlToJSON(settings.Deref(n), name, label, key, 0, &budget)
	if !ok {
		return nil
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // sent as the file writes it: "</answer>" stays readable
	if err := enc.Encode(v); err != nil {
		d.Errorf(n.Line, "%s: cannot be sent as JSON: %v", name, err)
		return nil
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

func (d *decoder) yamlToJSON(n *yaml.Node, name, label, key string, depth int, budget *int) (any, bool) {
	*budget--
	if *budget < 0 || depth > maxParamDepth {
		d.Errorf(n.Line, "%s: too large or too deeply nested", name)
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := settings.Deref(n.Content[i])
			if k.Kind != yaml.ScalarNode {
				d.Errorf(k.Line, "%s: a key must be a single value", name)
				return nil, false
			}
			if _, dup := out[k.Value]; dup {
				d.Errorf(k.Line, "%s: duplicate key %q", name, k.Value)
				return nil, false
			}
			v, ok := d.yamlToJSON(settings.Deref(n.Content[i+1]), name, label, key, depth+1, budget)
			if !ok {
				return nil, false
			}
			out[k.Value] = v
		}
		return out, true
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, item := range n.Content {
			v, ok := d.yamlToJSON(settings.Deref(item), name, label, key, depth+1, budget)
			if !ok {
				return nil, false
			}
			out = append(out, v)
		}
		return out, true
	case yaml.ScalarNode:
		return d.scalarJSON(n, name, label, key)
	}
	d.Errorf(n.Line, "%s: not a value JSON can hold", name)
	return nil, false
}

// scalarJSON converts a YAML scalar by its resolved tag: numbers stay numbers (as written, so that
// 0.10 is not rewritten), booleans and null stay themselves, anything else is a string.
func (d *decoder) scalarJSON(n *yaml.Node, name, label, key string) (any, bool) {
	switch n.ShortTag() {
	case "!!null":
		return nil, true
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			d.Errorf(n.Line, "%s: %v", name, err)
			return nil, false
		}
		return b, true
	case "!!int", "!!float":
		if json.Valid([]byte(n.Value)) {
			return json.Number(n.Value), true
		}
		var f float64
		if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			d.Errorf(n.Line, "%s: %q is not a number JSON can hold", name, n.Value)
			return nil, false
		}
		return f, true
	}
	s := n.Value
	if env, ok := strings.CutPrefix(s, settings.EnvPrefix); ok {
		if env == "" {
			d.Errorf(n.Line, "%s: %q names no variable", name, settings.EnvPrefix)
			return nil, false
		}
		v, set := d.LookupEnv(env)
		if !set {
			d.Warnf("%s: %s refers to %s, which is not set; it is not sent", label, key, env)
			return nil, false
		}
		return v, true
	}
	return s, true
}

// paramTypeOK checks a default parameter's JSON value against the type the vocabulary gives it.
func paramTypeOK(typ string, v json.RawMessage) bool {
	if len(v) == 0 {
		return false
	}
	var kind string
	switch c := v[0]; {
	case c == '{':
		kind = "mapping"
	case c == '[':
		kind = "list"
	case c == '"':
		kind = "string"
	case c == 't' || c == 'f':
		kind = "boolean"
	case c == 'n':
		return true // null: sent as null, as LiteLLM would
	default:
		kind = "number"
		if _, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			kind = "integer"
		}
	}
	for _, want := range strings.Split(typ, " or ") {
		if want == kind || (want == "number" && kind == "integer") {
			return true
		}
	}
	return false
}

// typeName is how messages name a param type.
func typeName(typ string) string {
	switch typ {
	case "integer":
		return "a whole number"
	case "number":
		return "a number"
	case "boolean":
		return "true or false"
	case "string":
		return "a string"
	case "list":
		return "a list"
	case "mapping":
		return "a mapping"
	}
	return "a " + typ
}
