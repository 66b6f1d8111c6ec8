package intercept

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/tidwall/sjson"
)

// noInternet is the network sentence of a container without network.
const noInternet = "There is no internet access."

// networkNote is the sentence of the stand-ins' descriptions on what a new container's code can
// reach (p, the policy it gets).
func networkNote(p egress.Policy) string {
	if !p.Open() {
		return noInternet
	}
	note := "The code can reach only these domains, over HTTP and HTTPS through the proxy already set in " +
		"its environment (no other network, no raw sockets): " + strings.Join(p.Domains, ", ") + "."
	if p.Allows("pypi.org") && p.Allows("files.pythonhosted.org") {
		note += " pip install works (packages go to the user site, already on the import path)."
	}
	for _, s := range p.Secrets {
		note += " Requests to " + s.Domain + " may use $" + s.Name + " in a header; the proxy puts the real value in."
	}
	return note
}

// functionDescription teaches the model the sandbox behind the stand-in function.
const functionDescription = "Run Python code in a stateful Jupyter-like kernel. Variables, imports and files " +
	"persist between calls in this conversation. The value of the last expression is shown, as in a notebook " +
	"cell, together with anything printed to stdout or stderr and the traceback of an exception. matplotlib " +
	"figures are rendered and returned to the user as images (plt.show() or leaving the figure as the last " +
	"expression). Files are read from and written to /mnt/data; to give the user a file, save it there and " +
	"link it in your answer, e.g. [sales.csv](sandbox:/mnt/data/sales.csv). Use it for " +
	"calculations, data analysis, charts and files. "

const codeDescription = "The Python code to run in the kernel."

// functionTool is a function tool of a Responses request, as the stand-in is offered upstream.
type functionTool struct {
	Type        string         `json:"type"`
	Name        string         `json:"name"`
	Description string         `json:"description"`
	Parameters  codeParameters `json:"parameters"`
	Strict      bool           `json:"strict"`
}

// codeParameters is the stand-in's JSON schema: one required string, "code".
type codeParameters struct {
	Type       string `json:"type"`
	Properties struct {
		Code struct {
			Type        string `json:"type"`
			Description string `json:"description"`
		} `json:"code"`
	} `json:"properties"`
	Required             []string `json:"required"`
	AdditionalProperties bool     `json:"additionalProperties"`
}

// standInTool returns the function tool that replaces code_interpreter upstream.
func standInTool(name string) []byte { return standInToolWith(name, noInternet, "") }

// standInToolWith is standInTool with the sentence on the container's network (networkNote) and
// more description (the files the container holds).
func standInToolWith(name, network, more string) []byte {
	t := functionTool{Type: "function", Name: name, Description: functionDescription + network + more, Strict: true}
	t.Parameters.Type = "object"
	t.Parameters.Properties.Code.Type = "string"
	t.Parameters.Properties.Code.Description = codeDescription
	t.Parameters.Required = []string{"code"}
	return marshal(t)
}

// functionChoice is a tool_choice, or an allowed_tools entry, naming one function.
type functionChoice struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

// rewriteToolChoice maps the client's tool_choice for the first upstream call and for the calls
// after the model used a tool (a forced choice would loop forever). standIns maps each hosted tool
// the proxy runs (code_interpreter, shell) to its stand-in function. nil means "leave as is".
func rewriteToolChoice(tc gjson.Result, standIns map[string]string) (first, later []byte) {
	switch {
	case !tc.Exists():
		return nil, nil
	case tc.Type == gjson.String:
		if tc.String() == "required" {
			return nil, []byte(`"auto"`)
		}
		return nil, nil
	case standIns[tc.Get("type").String()] != "":
		return marshal(functionChoice{Type: "function", Name: standIns[tc.Get("type").String()]}), []byte(`"auto"`)
	case tc.Get("type").String() == "allowed_tools":
		out := []byte(tc.Raw)
		tools := []byte{'['}
		tc.Get("tools").ForEach(func(_, t gjson.Result) bool {
			if fn := standIns[t.Get("type").String()]; fn != "" {
				tools = appendElem(tools, marshal(functionChoice{Type: "function", Name: fn}))
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

// functionCall is the function_call input item that stands for an execution the upstream saw.
type functionCall struct {
	Type      string `json:"type"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// functionCallOutput is a function_call_output input item.
type functionCallOutput struct {
	Type   string `json:"type"`
	CallID string `json:"call_id"`
	Output string `json:"output"`
}

// codeArguments is the stand-in's arguments object.
type codeArguments struct {
	Code string `json:"code"`
}

// callPair returns the function_call and function_call_output items for one execution.
func callPair(fn, callID, code, output string) [][]byte {
	args := marshal(codeArguments{code})
	call := marshal(functionCall{Type: "function_call", CallID: callID, Name: fn, Arguments: string(args)})
	return [][]byte{call, functionOutput(callID, output)}
}

// functionOutput returns a function_call_output item.
func functionOutput(callID, output string) []byte {
	return marshal(functionCallOutput{Type: "function_call_output", CallID: callID, Output: output})
}

// userMessage is a user message input item; the client's content is spliced in.
type userMessage struct {
	Type string `json:"type"`
	Role string `json:"role"`
}

// userMessageOf returns the user message whose content is the client's string input s.
func userMessageOf(s gjson.Result) []byte {
	return appendWithRaw(nil, userMessage{Type: "message", Role: "user"}, "content", []byte(s.Raw))
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
func (r *parsedRequest) body(cs callSpec) ([]byte, error) {
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
		in = appendElem(in, userMessageOf(gjson.GetBytes(r.raw, "input")))
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

// conversation returns every item of a finished loop as the upstream saw them, for an upstream
// that keeps nothing: the input (the kept conversation it continued included), the items of each
// iteration, the last turn, and the outputs of its calls not sent yet.
func (r *parsedRequest) conversation(turns, last, pending [][]byte) [][]byte {
	out := make([][]byte, 0, len(r.input)+len(turns)+len(last)+len(pending)+1)
	if r.inputString {
		out = append(out, userMessageOf(gjson.GetBytes(r.raw, "input")))
	}
	out = append(out, r.input...)
	out = append(out, turns...)
	out = append(out, last...)
	return append(out, pending...)
}

// appendElem appends v to a JSON array being built in dst (which ends with '[' or an element).
func appendElem(dst, v []byte) []byte {
	if dst[len(dst)-1] != '[' {
		dst = append(dst, ',')
	}
	return append(dst, v...)
}
