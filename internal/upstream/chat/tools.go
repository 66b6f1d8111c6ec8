package chat

import "github.com/tidwall/gjson"

// The request's tools, tool_choice and text.format, as Chat Completions takes them.

// toolList maps function tools, tool_choice and parallel_tool_calls.
func (t *chatTranslation) toolList() error {
	var tools []chatTool
	index := map[string]int{}
	var err error
	t.tools.ForEach(func(k, tool gjson.Result) bool {
		param := "tools[" + k.String() + "]"
		if !tool.IsObject() {
			err = invalidType(param, "an object")
			return false
		}
		var typ, name, desc, params, strict gjson.Result
		readFields(tool, field{"type", &typ}, field{"name", &name}, field{"description", &desc}, field{"parameters", &params}, field{"strict", &strict})
		if typ := typ.String(); typ != "function" {
			err = unsupportedValue(param+".type", "Tool type '"+typ+"' is not supported for this model: its upstream speaks only "+
				"Chat Completions, which takes function tools only.")
			return false
		}
		if name.Type != gjson.String || name.Str == "" {
			err = missing(param + ".name")
			return false
		}
		fn := chatTool{Type: "function", Function: chatFunction{Name: name.Str}}
		if present(desc) {
			if desc.Type != gjson.String {
				err = invalidType(param+".description", "a string")
				return false
			}
			fn.Function.Description = raw(desc)
		}
		if present(params) {
			if !params.IsObject() {
				err = invalidType(param+".parameters", "an object")
				return false
			}
			fn.Function.Parameters = raw(params)
		}
		if present(strict) {
			if !isBool(strict) {
				err = invalidType(param+".strict", "a boolean")
				return false
			}
			fn.Function.Strict = raw(strict)
		}
		index[name.Str] = len(tools)
		tools = append(tools, fn)
		return true
	})
	if err != nil {
		return err
	}

	tc := t.toolChoice
	switch {
	case !present(tc):
	case tc.Type == gjson.String:
		switch tc.Str {
		case "auto", "none":
			if len(tools) > 0 {
				t.out.ToolChoice = raw(tc)
			}
			// Without tools both mean what no tool_choice means; chat servers refuse the field then.
		case "required":
			if len(tools) == 0 {
				return invalidValue("tool_choice", "Invalid value for 'tool_choice': 'required' needs at least one tool in 'tools'.")
			}
			t.out.ToolChoice = raw(tc)
		default:
			return invalidValue("tool_choice", "Invalid value for 'tool_choice': '"+tc.Str+"'. Supported values are 'none', 'auto' and 'required'.")
		}
	case tc.IsObject():
		switch typ := tc.Get("type").String(); typ {
		case "function":
			name := tc.Get("name").String()
			if _, ok := index[name]; !ok {
				return invalidValue("tool_choice", "Tool choice '"+name+"' not found in 'tools' parameter.")
			}
			t.out.ToolChoice = &chatTool{Type: "function", Function: chatFunction{Name: name}}
		case "allowed_tools":
			// Chat servers other than OpenAI's have no allowed_tools: the tools list itself is cut
			// down to the allowed ones, which offers the model exactly the same choice.
			mode := tc.Get("mode").String()
			if mode != "auto" && mode != "required" {
				return invalidValue("tool_choice.mode", "Invalid value for 'tool_choice.mode': expected 'auto' or 'required'.")
			}
			var allowed []chatTool
			seen := map[string]bool{}
			tc.Get("tools").ForEach(func(k, a gjson.Result) bool {
				param := "tool_choice.tools[" + k.String() + "]"
				if typ := a.Get("type").String(); typ != "function" {
					err = unsupportedValue(param+".type", "Tool type '"+typ+"' is not supported for this model: its upstream speaks only Chat Completions.")
					return false
				}
				name := a.Get("name").String()
				i, ok := index[name]
				if !ok {
					err = invalidValue(param, "Tool choice '"+name+"' not found in 'tools' parameter.")
					return false
				}
				if !seen[name] {
					seen[name] = true
					allowed = append(allowed, tools[i])
				}
				return true
			})
			if err != nil {
				return err
			}
			if len(allowed) == 0 {
				return missing("tool_choice.tools")
			}
			tools = allowed
			t.out.ToolChoice = mode
		default:
			if hostedToolChoice[typ] {
				// Every tool in tools is a function by now (any other was refused above), so the
				// hosted tool it forces is not there: OpenAI's answer for a choice not in tools.
				return invalid("tool_choice", "Tool choice '"+typ+"' not found in 'tools' parameter.")
			}
			return unsupportedValue("tool_choice.type", "Tool choice type '"+typ+"' is not supported for this model: its upstream speaks only "+
				"Chat Completions, which takes function tools only.")
		}
	default:
		return invalidType("tool_choice", "a string or an object")
	}
	t.out.Tools = tools
	if len(tools) > 0 && present(t.parallel) {
		// Chat servers refuse parallel_tool_calls without tools.
		t.out.ParallelToolCalls = raw(t.parallel)
	}
	return nil
}

// text maps text.format to response_format and text.verbosity to verbosity.
func (t *chatTranslation) text(v gjson.Result) error {
	if !v.IsObject() {
		return invalidType("text", "an object")
	}
	t.echo.text = raw(v)
	if vb := v.Get("verbosity"); present(vb) {
		if vb.Type != gjson.String {
			return invalidType("text.verbosity", "a string")
		}
		t.out.Verbosity = raw(vb)
	}
	f := v.Get("format")
	if !present(f) {
		return nil
	}
	if !f.IsObject() {
		return invalidType("text.format", "an object")
	}
	switch typ := f.Get("type").String(); typ {
	case "text":
	case "json_object":
		t.out.ResponseFormat = &responseFormat{Type: "json_object"}
	case "json_schema":
		name := f.Get("name")
		if name.Type != gjson.String || name.Str == "" {
			return missing("text.format.name")
		}
		schema := f.Get("schema")
		if !schema.IsObject() {
			return missing("text.format.schema")
		}
		js := &jsonSchema{Name: raw(name), Schema: raw(schema)}
		if d := f.Get("description"); present(d) {
			if d.Type != gjson.String {
				return invalidType("text.format.description", "a string")
			}
			js.Description = raw(d)
		}
		if s := f.Get("strict"); present(s) {
			if !isBool(s) {
				return invalidType("text.format.strict", "a boolean")
			}
			js.Strict = raw(s)
		}
		t.out.ResponseFormat = &responseFormat{Type: "json_schema", JSONSchema: js}
	default:
		return unsupportedValue("text.format.type", "Unsupported value: text.format.type '"+typ+"' is not supported for this model: its upstream speaks only Chat Completions.")
	}
	return nil
}
