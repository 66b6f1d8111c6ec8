package intercept

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
)

const (
	includeOutputs   = "code_interpreter_call.outputs"
	includeEncrypted = "reasoning.encrypted_content"
)

// functionDescription teaches the model the sandbox behind the stand-in function.
const functionDescription = "Run Python code in a stateful Jupyter-like kernel. Variables, imports and files " +
	"persist between calls in this conversation. The value of the last expression is shown, as in a notebook " +
	"cell, together with anything printed to stdout or stderr and the traceback of an exception. matplotlib " +
	"figures are rendered and returned to the user as images (plt.show() or leaving the figure as the last " +
	"expression). Files are read from and written to /mnt/data. There is no internet access. Use it for " +
	"calculations, data analysis, charts and files."

const codeDescription = "The Python code to run in the kernel."

// standInTool returns the function tool that replaces code_interpreter upstream.
func standInTool(name string) []byte {
	b := make([]byte, 0, 1024)
	b = append(b, `{"type":"function","name":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"description":`...)
	b = appendJSONString(b, functionDescription)
	b = append(b, `,"parameters":{"type":"object","properties":{"code":{"type":"string","description":`...)
	b = appendJSONString(b, codeDescription)
	b = append(b, `}},"required":["code"],"additionalProperties":false},"strict":true}`...)
	return b
}

// request is one intercepted /v1/responses request: the client's bytes, kept unmodified, and what
// the loop derives from them once. Every upstream body is built from base, itself built from raw.
type request struct {
	raw  []byte // the client's body; never modified
	base []byte // raw with tools, include and previous_response_id rewritten

	fn             string // the stand-in function's name
	stream         bool
	store          bool // store != false
	includeOutputs bool // the client asked for code_interpreter_call.outputs
	keepEncrypted  bool // the client asked for reasoning.encrypted_content (else it is stripped from output)
	addedEncrypted bool // the proxy asks for reasoning.encrypted_content upstream
	// includeEncrypted is the include list plus reasoning.encrypted_content, for the calls after
	// an unstored turn showed reasoning items (nil when the proxy never adds it).
	includeEncrypted []byte
	maxToolCalls     int // max_tool_calls; 0: no limit from the request
	// noCode: the client's tool_choice rules code_interpreter out ("none", or allowed_tools
	// without it). A model that calls the stand-in anyway (servers that ignore tool_choice) gets
	// its calls shown, never run.
	noCode bool

	container     containerSpec
	prevContainer string // container of the previous response in a chain, reused while it lives

	// Client values echoed in the Response (raw JSON; nil when absent).
	model, tools, toolChoice, previousID, maxToolCallsRaw []byte

	toolChoiceFirst []byte // tool_choice on the first upstream call (nil: as sent / absent)
	toolChoiceLater []byte // tool_choice once the model has called a tool (nil: unchanged)

	inputString bool     // input was a string and no item had to be added before it
	input       [][]byte // the client's input items, translated for the upstream
}

// validMemoryLimits are the values OpenAI's ContainerMemoryLimit allows.
var validMemoryLimits = map[string]bool{"1g": true, "4g": true, "16g": true, "64g": true}

// containerSpec is the code_interpreter tool's container.
type containerSpec struct {
	id          string // "cntr_..." when the tool names one
	memoryLimit string // container.memory_limit of an auto container
	toolIndex   int    // index of the code_interpreter tool in tools, for error params
}

// lookup is what rewriting needs from the store.
type lookup struct {
	ctx    context.Context
	store  Store
	caller string
}

// wants reports whether a request is one the engine intercepts: the tools list holds a
// code_interpreter tool.
func wants(body []byte) bool {
	if !jsondepth.Valid(body) {
		return false
	}
	found := false
	gjson.GetBytes(body, "tools").ForEach(func(_, t gjson.Result) bool {
		if t.Get("type").String() == "code_interpreter" {
			found = true
			return false
		}
		return true
	})
	return found
}

// parseRequest validates the client's body and derives the request. The error is client-visible.
func parseRequest(body []byte, ic config.Interception, lk lookup) (*request, *apierror.Error) {
	fn := ic.FunctionName
	if fn == "" {
		fn = "python"
	}
	root := gjson.ParseBytes(body)
	if !jsondepth.Valid(body) || !root.IsObject() {
		return nil, apierror.BadRequest("The request body must be a JSON object.", "", "")
	}
	r := &request{
		raw:    body,
		fn:     fn,
		stream: root.Get("stream").Bool(),
		store:  root.Get("store").Type != gjson.False,
	}
	if root.Get("background").Bool() {
		return nil, apierror.BadRequest("Background mode is not supported together with the code_interpreter tool.", "background", "")
	}
	if c := root.Get("conversation"); c.Exists() && c.Type != gjson.Null {
		// Each upstream call of the loop would append the conversation's items again.
		return nil, apierror.BadRequest("Conversations are not supported together with the code_interpreter tool on this server; use previous_response_id or send the items in input.", "conversation", "")
	}
	r.model = rawOf(root.Get("model"))
	r.tools = rawOf(root.Get("tools"))
	r.toolChoice = rawOf(root.Get("tool_choice"))
	r.previousID = rawOf(root.Get("previous_response_id"))
	r.maxToolCallsRaw = rawOf(root.Get("max_tool_calls"))
	if n := root.Get("max_tool_calls"); n.Type == gjson.Number && n.Int() > 0 {
		r.maxToolCalls = int(n.Int())
	}

	// tools: the first code_interpreter tool becomes the stand-in function; further ones are
	// dropped (one kernel serves them all); a client function using the name is a clash.
	tools := make([]byte, 0, len(r.tools)+1024)
	tools = append(tools, '[')
	seen := false
	var bad *apierror.Error
	root.Get("tools").ForEach(func(k, t gjson.Result) bool {
		switch typ := t.Get("type").String(); {
		case typ == "code_interpreter":
			if seen {
				return true
			}
			seen = true
			r.container.toolIndex = int(k.Int())
			c := t.Get("container")
			param := "tools[" + k.String() + "].container"
			switch {
			case !c.Exists(), c.Type == gjson.Null:
				// No container: an auto one, as the most lenient reading of a required field.
			case c.Type == gjson.String:
				r.container.id = c.String()
			case c.IsObject() && c.Get("type").String() == "auto":
				switch ml := c.Get("memory_limit"); {
				case !ml.Exists(), ml.Type == gjson.Null:
				case ml.Type == gjson.String && validMemoryLimits[ml.String()]:
					r.container.memoryLimit = ml.String()
				default:
					bad = apierror.BadRequest("Invalid value for '"+param+".memory_limit': expected one of '1g', '4g', '16g', '64g'.", param+".memory_limit", "invalid_value")
					return false
				}
			default:
				bad = apierror.BadRequest("Invalid value for '"+param+"': expected a container id or {\"type\": \"auto\"}.", param, "invalid_value")
				return false
			}
			tools = appendElem(tools, standInTool(fn))
		case (typ == "function" || typ == "custom") && t.Get("name").String() == fn:
			bad = apierror.BadRequest("The tool name '"+fn+"' is reserved for code_interpreter on this server; rename the function.", "tools", "")
			return false
		default:
			tools = appendElem(tools, []byte(t.Raw))
		}
		return true
	})
	if bad != nil {
		return nil, bad
	}
	tools = append(tools, ']')

	r.toolChoiceFirst, r.toolChoiceLater = rewriteToolChoice(root.Get("tool_choice"), fn)
	r.noCode = excludesCode(root.Get("tool_choice"))

	// include: outputs are the proxy's business; encrypted reasoning is asked for when the
	// conversation is not stored upstream and the request configures reasoning (a sign of a
	// reasoning model: non-reasoning models reject the include), so reasoning items can be
	// carried from one iteration to the next.
	var include []string
	root.Get("include").ForEach(func(_, v gjson.Result) bool {
		switch s := v.String(); s {
		case includeOutputs:
			r.includeOutputs = true
		case includeEncrypted:
			r.keepEncrypted = true
			include = append(include, s)
		default:
			include = append(include, s)
		}
		return true
	})
	if !r.store && !r.keepEncrypted {
		withEnc, _ := json.Marshal(append(slices.Clone(include), includeEncrypted))
		r.includeEncrypted = withEnc
		if root.Get("reasoning").IsObject() {
			r.addedEncrypted = true
			include = append(include, includeEncrypted)
		}
	}

	base, err := sjson.SetRawBytes(body, "tools", tools)
	if err != nil {
		return nil, apierror.BadRequest("Invalid JSON body.", "", "")
	}
	if root.Get("include").Exists() || len(include) > 0 {
		if len(include) == 0 {
			base, err = sjson.DeleteBytes(base, "include")
		} else {
			inc, _ := json.Marshal(include)
			base, err = sjson.SetRawBytes(base, "include", inc)
		}
		if err != nil {
			return nil, apierror.BadRequest("Invalid JSON body.", "include", "")
		}
	}

	// previous_response_id: a response this proxy minted stands for the last upstream response
	// of its loop, plus the outputs of stand-in calls the client never saw as function calls.
	var pending [][]byte
	if prev := root.Get("previous_response_id").String(); prev != "" && lk.store != nil {
		if sr, ok := lk.store.Response(lk.ctx, prev); ok && sr.Owner == lk.caller {
			base, _ = sjson.SetBytes(base, "previous_response_id", sr.UpstreamID)
			r.prevContainer = sr.ContainerID
			pending = sr.Pending
		}
	}

	in := root.Get("input")
	switch {
	case in.Type == gjson.String && len(pending) == 0:
		r.inputString = true
	case in.Type == gjson.String:
		r.input = append(append([][]byte(nil), pending...), userMessage(in))
	default:
		r.input = append(r.input, pending...)
		in.ForEach(func(_, it gjson.Result) bool {
			r.input = append(r.input, translateInputItem(it, fn, lk)...)
			return true
		})
	}
	r.base = base
	return r, nil
}

// excludesCode reports whether tool_choice rules code_interpreter out: "none", or an allowed_tools
// list without it.
func excludesCode(tc gjson.Result) bool {
	switch {
	case tc.Type == gjson.String:
		return tc.String() == "none"
	case tc.Get("type").String() == "allowed_tools":
		found := false
		tc.Get("tools").ForEach(func(_, t gjson.Result) bool {
			found = t.Get("type").String() == "code_interpreter"
			return !found
		})
		return !found
	}
	return false
}

// rewriteToolChoice maps the client's tool_choice for the first upstream call and for the calls
// after the model used a tool (a forced choice would loop forever). nil means "leave as is".
func rewriteToolChoice(tc gjson.Result, fn string) (first, later []byte) {
	fnChoice := []byte(`{"type":"function","name":` + string(jsonString(fn)) + `}`)
	switch {
	case !tc.Exists():
		return nil, nil
	case tc.Type == gjson.String:
		if tc.String() == "required" {
			return nil, []byte(`"auto"`)
		}
		return nil, nil
	case tc.Get("type").String() == "code_interpreter":
		return fnChoice, []byte(`"auto"`)
	case tc.Get("type").String() == "allowed_tools":
		out := []byte(tc.Raw)
		tools := []byte{'['}
		tc.Get("tools").ForEach(func(_, t gjson.Result) bool {
			if t.Get("type").String() == "code_interpreter" {
				tools = appendElem(tools, []byte(`{"type":"function","name":`+string(jsonString(fn))+`}`))
			} else {
				tools = appendElem(tools, []byte(t.Raw))
			}
			return true
		})
		tools = append(tools, ']')
		out, _ = sjson.SetRawBytes(out, "tools", tools)
		later = out
		if tc.Get("mode").String() == "required" {
			later, _ = sjson.SetBytes(out, "mode", "auto")
		}
		return out, later
	case tc.IsObject():
		return nil, []byte(`"auto"`)
	}
	return nil, nil
}

// translateInputItem turns replayed code_interpreter_call items (and references to ones this
// proxy minted) into the function_call + function_call_output pair the upstream saw.
func translateInputItem(it gjson.Result, fn string, lk lookup) [][]byte {
	switch it.Get("type").String() {
	case "code_interpreter_call":
		id := it.Get("id").String()
		sc, known := storedCall(lk, id)
		code := it.Get("code").String()
		if !it.Get("code").Exists() || it.Get("code").Type == gjson.Null {
			code = sc.Code
		}
		output := sc.Output
		if outs := it.Get("outputs"); !known || (outs.IsArray() && len(outs.Array()) > 0) {
			output = logsText(outs)
		}
		callID := sc.CallID
		if callID == "" {
			callID = "call_" + strings.TrimPrefix(id, "ci_")
		}
		return callPair(fn, callID, code, output)
	case "item_reference":
		id := it.Get("id").String()
		if strings.HasPrefix(id, "ci_") {
			if sc, ok := storedCall(lk, id); ok {
				return callPair(fn, sc.CallID, sc.Code, sc.Output)
			}
		}
	}
	return [][]byte{[]byte(it.Raw)}
}

func storedCall(lk lookup, id string) (StoredCall, bool) {
	if lk.store == nil || id == "" {
		return StoredCall{}, false
	}
	sc, ok := lk.store.Call(lk.ctx, id)
	if !ok || sc.Owner != lk.caller {
		return StoredCall{}, false
	}
	return sc, true
}

// logsText rebuilds what the model saw of an execution from a code_interpreter_call item's
// outputs: the logs, then a line per image, as describe writes them.
func logsText(outs gjson.Result) string {
	var parts, images []string
	outs.ForEach(func(_, o gjson.Result) bool {
		switch o.Get("type").String() {
		case "logs":
			parts = append(parts, o.Get("logs").String())
		case "image":
			kind := "image/png"
			if strings.HasPrefix(o.Get("url").String(), "data:image/jpeg") {
				kind = "image/jpeg"
			}
			images = append(images, "["+kind+" produced: shown to the user]")
		}
		return true
	})
	s := joinLines(append(parts, images...)...)
	if s == "" {
		return "[no output]"
	}
	return s
}

// callPair returns the function_call and function_call_output items for one execution.
func callPair(fn, callID, code, output string) [][]byte {
	args, _ := json.Marshal(struct {
		Code string `json:"code"`
	}{code})
	call := make([]byte, 0, len(args)+len(callID)+96)
	call = append(call, `{"type":"function_call","call_id":`...)
	call = appendJSONString(call, callID)
	call = append(call, `,"name":`...)
	call = appendJSONString(call, fn)
	call = append(call, `,"arguments":`...)
	call = appendJSONString(call, string(args))
	call = append(call, '}')
	return [][]byte{call, functionOutput(callID, output)}
}

// functionOutput returns a function_call_output item.
func functionOutput(callID, output string) []byte {
	b := make([]byte, 0, len(output)+len(callID)+64)
	b = append(b, `{"type":"function_call_output","call_id":`...)
	b = appendJSONString(b, callID)
	b = append(b, `,"output":`...)
	b = appendJSONString(b, output)
	b = append(b, '}')
	return b
}

func userMessage(s gjson.Result) []byte {
	return []byte(`{"type":"message","role":"user","content":` + s.Raw + `}`)
}

// callSpec says how one upstream call differs from the first.
type callSpec struct {
	first bool // the first upstream call of the loop
	// encrypted asks for reasoning.encrypted_content (req.includeEncrypted): the model turned out
	// to reason, and without storage its reasoning can only be carried encrypted.
	encrypted bool
	none      bool     // tools off: the model must answer in text
	turns     [][]byte // items of earlier iterations: the model's turns and the outputs of our calls
}

// body builds one upstream request body from the client's bytes (through base). It never
// modifies base or raw.
func (r *request) body(cs callSpec) ([]byte, error) {
	b := r.base
	var err error
	switch {
	case cs.none:
		b, err = sjson.SetRawBytes(b, "tool_choice", []byte(`"none"`))
	case cs.first && r.toolChoiceFirst != nil:
		b, err = sjson.SetRawBytes(b, "tool_choice", r.toolChoiceFirst)
	case !cs.first && r.toolChoiceLater != nil:
		b, err = sjson.SetRawBytes(b, "tool_choice", r.toolChoiceLater)
	}
	if err != nil {
		return nil, err
	}
	if cs.encrypted && r.includeEncrypted != nil {
		if b, err = sjson.SetRawBytes(b, "include", r.includeEncrypted); err != nil {
			return nil, err
		}
	}
	if len(cs.turns) == 0 && (r.inputString || len(r.input) == 0) {
		return b, nil
	}
	size := 2
	for _, it := range r.input {
		size += len(it) + 1
	}
	for _, it := range cs.turns {
		size += len(it) + 1
	}
	in := make([]byte, 0, size+64)
	in = append(in, '[')
	if r.inputString {
		in = appendElem(in, userMessage(gjson.GetBytes(r.raw, "input")))
	}
	for _, it := range r.input {
		in = appendElem(in, it)
	}
	for _, it := range cs.turns {
		in = appendElem(in, it)
	}
	in = append(in, ']')
	return sjson.SetRawBytes(b, "input", in)
}

// appendElem appends v to a JSON array being built in dst (which ends with '[' or an element).
func appendElem(dst, v []byte) []byte {
	if dst[len(dst)-1] != '[' {
		dst = append(dst, ',')
	}
	return append(dst, v...)
}

func rawOf(r gjson.Result) []byte {
	if !r.Exists() {
		return nil
	}
	return []byte(r.Raw)
}
