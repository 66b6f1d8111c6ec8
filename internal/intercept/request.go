package intercept

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
)

const (
	includeOutputs   = "code_interpreter_call.outputs"
	includeEncrypted = "reasoning.encrypted_content"
)

// parsedRequest is one intercepted /v1/responses request, parsed once: the client's bytes, kept
// unmodified, and what the loop derives from them. Every upstream body is built from base, itself
// built from raw (rewrite.go). parseRequest, resolve and findFiles build it, and placed completes
// it with where its files went before the first upstream call; nothing changes it after.
type parsedRequest struct {
	raw  []byte // the client's body; never modified
	base []byte // raw with tools, include and previous_response_id rewritten

	fn string // the stand-in function's name
	// code: the request has a code_interpreter tool. Without one the loop runs no code and needs
	// no container: one upstream call, its answer passed on under a minted id (the engine serves
	// such requests only when its caller routes them to it).
	code           bool
	stream         bool
	store          bool // store != false
	includeOutputs bool // the client asked for code_interpreter_call.outputs
	keepEncrypted  bool // the client asked for reasoning.encrypted_content (else it is stripped from output)
	// encryptedFirst: the proxy asks for reasoning.encrypted_content from the first upstream call
	// on (unstored, with a reasoning object); the loop may start asking later (includeEncrypted).
	encryptedFirst bool
	// includeEncrypted is the include list plus reasoning.encrypted_content, for the calls after
	// an unstored turn showed reasoning items (nil when the proxy never adds it).
	includeEncrypted []byte
	maxToolCalls     int // max_tool_calls; 0: no limit from the request
	// noCode: the client's tool_choice rules code_interpreter out ("none", or allowed_tools
	// without it). A model that calls the stand-in anyway (servers that ignore tool_choice) gets
	// its calls shown, never run.
	noCode bool
	// shell: the request's shell tool, when the proxy handles one; noShell: tool_choice rules it
	// out, as noCode does code_interpreter.
	shell   shellTool
	noShell bool
	// obfuscate: command deltas carry obfuscation (stream_options.include_obfuscation not false).
	obfuscate bool

	container containerSpec
	// contextContainers are the containers the conversation used so far, oldest first: the
	// previous response's, then those of the code_interpreter_call items in the input. An auto
	// container reuses the latest one still live.
	contextContainers []string
	// files are what the request puts into its container before code runs: the tool's
	// container.file_ids, then the input's input_file parts and images by file_id (files.go).
	files []wantedFile
	// inlined are the input's parts by file_id that go upstream carrying the file's bytes: every
	// input_image, and without code_interpreter every input_file.
	inlined      []wantedInline
	standInIndex int // the stand-in function's index in base's tools; -1 without one
	shellIndex   int // the shell stand-in's index in base's tools; -1 without one
	// network is the sentence of the stand-ins' descriptions on a new container's network.
	network          string
	shellDescription string // the operator's description of the shell stand-in ("": ours)

	// Client values echoed in the Response (raw JSON; nil when absent).
	model, tools, toolChoice, previousID, maxToolCallsRaw []byte

	toolChoiceFirst []byte // tool_choice on the first upstream call (nil: as sent / absent)
	toolChoiceLater []byte // tool_choice once the model has called a tool (nil: unchanged)

	inputString bool     // input was a string and no item had to be added before it
	input       [][]byte // the client's input items, translated for the upstream
}

// validMemoryLimit reports whether s is one of the values OpenAI's container memory_limit allows.
func validMemoryLimit(s string) bool {
	switch s {
	case "1g", "4g", "16g", "64g":
		return true
	}
	return false
}

// unknownKeys is OpenAI's 400 for the first key of obj that is not one of known.
func unknownKeys(obj gjson.Result, param string, known ...string) *apierror.Error {
	var bad *apierror.Error
	obj.ForEach(func(k, _ gjson.Result) bool {
		if !slices.Contains(known, k.Str) {
			bad = apierror.BadRequest(fmt.Sprintf("Unknown parameter: '%s.%s'.", param, k.Str), param+"."+k.Str, apierror.CodeUnknownParameter)
		}
		return bad == nil
	})
	return bad
}

// nonEmptyArray reads v as an array of at least one item; absent is an error only when required.
func nonEmptyArray(v gjson.Result, param string, required bool) ([]gjson.Result, *apierror.Error) {
	switch {
	case !v.Exists() || v.Type == gjson.Null:
		if required {
			return nil, apierror.BadRequest("Missing required parameter: '"+param+"'.", param, apierror.CodeMissingRequiredParameter)
		}
		return nil, nil
	case !v.IsArray():
		return nil, apierror.InvalidType(param, "an array", v)
	}
	items := v.Array()
	if len(items) == 0 {
		return nil, apierror.BadRequest(fmt.Sprintf("Invalid '%s': empty array. Expected an array with minimum length 1, but got an empty array instead.", param), param, apierror.CodeEmptyArray)
	}
	return items, nil
}

// nonEmptyString checks that v is a string of at least one character and, when limit > 0, at
// most limit; the message never holds the string itself.
func nonEmptyString(v gjson.Result, param string, limit int) *apierror.Error {
	switch {
	case !v.Exists():
		return apierror.BadRequest("Missing required parameter: '"+param+"'.", param, apierror.CodeMissingRequiredParameter)
	case v.Type != gjson.String:
		return apierror.InvalidType(param, "a string", v)
	case v.Str == "":
		return apierror.BadRequest(fmt.Sprintf("Invalid '%s': empty string. Expected a string with minimum length 1, but got an empty string instead.", param), param, apierror.CodeEmptyString)
	case limit > 0 && len(v.Str) > limit:
		return apierror.BadRequest(fmt.Sprintf("Invalid '%s': string too long. Expected a string with maximum length %d, but got a string with length %d instead.", param, limit, len(v.Str)), param, apierror.CodeStringAboveMaxLength)
	}
	return nil
}

// containerSpec is the container of the request's tools (code_interpreter's and the shell
// tool's are one).
type containerSpec struct {
	id          string // "cntr_..." when a tool names one
	memoryLimit string // memory_limit of an auto container
	// network is an auto container's network_policy (nil: none set), named at networkParam.
	network      *egress.Policy
	networkParam string
	param        string // where id was named, for the error of an unknown one
}

// sandboxed reports whether the request runs anything in a container: code, or hosted shell
// commands.
func (r *parsedRequest) sandboxed() bool { return r.code || r.shell.hosted }

// wants reports whether a request is one the engine intercepts: the tools list holds a
// code_interpreter tool or a shell tool, of those ic intercepts.
func wants(root gjson.Result, ic config.Interception) bool {
	found := false
	root.Get("tools").ForEach(func(_, t gjson.Result) bool {
		found = ic.Intercepts(t.Get("type").String())
		return !found
	})
	return found
}

// parseRequest validates the client's body and derives the request, without I/O; resolve then
// completes it from the store. code says whether the proxy runs the code_interpreter tool (it is
// the request's, and interception applies); without it a code_interpreter tool is left in tools
// as sent. The error is client-visible.
func parseRequest(body []byte, ic config.Interception, code bool) (*parsedRequest, *apierror.Error) {
	root := gjson.ParseBytes(body)
	if !jsondepth.Valid(body) || !root.IsObject() {
		return nil, apierror.BadRequest("The request body must be a JSON object.", "", "")
	}
	return parseRoot(root, body, ic, code && wants(root, ic))
}

// parseRoot is parseRequest of a body already checked (Prepare): root is body parsed, a JSON
// object of bounded depth, and code says that the proxy runs the request's code_interpreter tool.
func parseRoot(root gjson.Result, body []byte, ic config.Interception, code bool) (*parsedRequest, *apierror.Error) {
	fn := ic.FunctionName
	if fn == "" {
		fn = config.DefaultFunctionName
	}
	if bad := checkTypes(root); bad != nil {
		return nil, bad
	}
	sfn := ic.ShellFunctionName
	if sfn == "" {
		sfn = config.DefaultShellFunctionName
	}
	run := code // interception applies: the tools it intercepts are the proxy's to run
	code = false
	root.Get("tools").ForEach(func(_, t gjson.Result) bool {
		code = run && t.Get("type").String() == "code_interpreter" && ic.Intercepts("code_interpreter")
		return !code
	})
	r := &parsedRequest{
		raw:          body,
		fn:           fn,
		code:         code,
		obfuscate:    root.Get("stream_options.include_obfuscation").Type != gjson.False,
		stream:       root.Get("stream").Bool(),
		store:        root.Get("store").Type != gjson.False,
		standInIndex: -1,
		shellIndex:   -1,
		network:      noInternet,
	}
	shellTools := run && ic.Intercepts("shell") && wantsShell(root)
	if (r.code || shellTools) && root.Get("background").Bool() {
		return nil, apierror.BadRequest("Background mode is not supported together with the code_interpreter or shell tool.", "background", "")
	}
	if c := root.Get("conversation"); (r.code || shellTools) && c.Exists() && c.Type != gjson.Null {
		// Each upstream call of the loop would append the conversation's items again.
		return nil, apierror.BadRequest("Conversations are not supported together with the code_interpreter or shell tool on this server; use previous_response_id or send the items in input.", "conversation", "")
	}
	r.model = rawOf(root.Get("model"))
	r.tools = withoutSecrets(rawOf(root.Get("tools")))
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
	seen, shellSeen := false, false
	var shellContainer containerSpec
	n := 0 // tools written so far
	var bad *apierror.Error
	root.Get("tools").ForEach(func(k, t gjson.Result) bool {
		switch typ := t.Get("type").String(); {
		case typ == "code_interpreter" && r.code:
			if seen {
				return true
			}
			seen = true
			c := t.Get("container")
			param := "tools[" + k.String() + "].container"
			r.container.param = param
			switch {
			case !c.Exists(), c.Type == gjson.Null:
				// No container: an auto one, as the most lenient reading of a required field.
			case c.Type == gjson.String:
				r.container.id = c.String()
			case c.IsObject() && c.Get("type").String() == "auto":
				if bad = r.parseAuto(c, param, &r.container); bad != nil {
					return false
				}
			default:
				bad = apierror.BadRequest("Invalid value for '"+param+"': expected a container id or {\"type\": \"auto\"}.", param, apierror.CodeInvalidValue)
				return false
			}
			r.standInIndex = n
			tools = appendElem(tools, standInTool(fn))
		case typ == "shell" && shellTools:
			if shellSeen {
				return true // one shell serves them all
			}
			shellSeen = true
			if bad = r.parseShellTool(t, "tools["+k.String()+"]", sfn, &shellContainer); bad != nil {
				return false
			}
			r.shellIndex, r.shellDescription = n, ic.ShellFunctionDescription
			tools = appendElem(tools, shellStandIn(sfn, ic.ShellFunctionDescription, noInternet))
		case r.code && (typ == "function" || typ == "custom") && t.Get("name").String() == fn:
			bad = apierror.BadRequest("The tool name '"+fn+"' is reserved for code_interpreter on this server; rename the function.", "tools", "")
			return false
		case shellTools && (typ == "function" || typ == "custom") && t.Get("name").String() == sfn:
			bad = apierror.BadRequest("The tool name '"+sfn+"' is reserved for the shell tool on this server; rename the function.", "tools", "")
			return false
		default:
			tools = appendElem(tools, []byte(t.Raw))
		}
		n++
		return true
	})
	if bad != nil {
		return nil, bad
	}
	tools = append(tools, ']')
	if bad = r.shareContainer(shellContainer); bad != nil {
		return nil, bad
	}
	// Files of the input go to the container too, as OpenAI's do; images by file_id go upstream
	// as their bytes, code or not, and so do files when they go to no container.
	in, inlined, bad := parseInputFiles(root.Get("input"), r.sandboxed())
	if bad != nil {
		return nil, bad
	}
	r.files = append(r.files, in...)
	r.inlined = inlined
	if len(r.files) > maxPlacedFiles {
		return nil, apierror.BadRequest(fmt.Sprintf("Too many files for the code interpreter's container: %d, at most %d per request.", len(r.files), maxPlacedFiles), "input", "")
	}

	if r.code || r.shell.fn != "" {
		standIns := map[string]string{}
		if r.code {
			standIns["code_interpreter"] = fn
		}
		if r.shell.fn != "" {
			standIns["shell"] = r.shell.fn
		}
		r.toolChoiceFirst, r.toolChoiceLater = rewriteToolChoice(root.Get("tool_choice"), standIns)
		r.noCode = r.code && excludes(root.Get("tool_choice"), "code_interpreter")
		r.noShell = r.shell.fn != "" && excludes(root.Get("tool_choice"), "shell")
	}

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
			r.encryptedFirst = true
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

	r.base = base
	return r, nil
}

// checkTypes refuses, as OpenAI does (400 invalid_type naming the field), a field the engine reads
// whose JSON type is not the one CreateResponse declares: read loosely, "stream":"true" would
// stream and "store":"false" would store. null stands for absent in each (all are optional).
func checkTypes(root gjson.Result) *apierror.Error {
	isBool := func(v gjson.Result) bool { return v.Type == gjson.True || v.Type == gjson.False }
	isString := func(v gjson.Result) bool { return v.Type == gjson.String }
	for _, f := range []struct {
		name, want string
		ok         func(gjson.Result) bool
	}{
		{"stream", "a boolean", isBool},
		{"store", "a boolean", isBool},
		{"background", "a boolean", isBool},
		{"parallel_tool_calls", "a boolean", isBool},
		{"max_tool_calls", "an integer", func(v gjson.Result) bool { return apierror.JSONType(v) == "an integer" }},
		{"previous_response_id", "a string", isString},
		{"instructions", "a string", isString},
		{"input", "a string or an array", func(v gjson.Result) bool { return isString(v) || v.IsArray() }},
		{"tool_choice", "a string or an object", func(v gjson.Result) bool { return isString(v) || v.IsObject() }},
		{"tools", "an array of objects", gjson.Result.IsArray},
		{"include", "an array of strings", gjson.Result.IsArray},
	} {
		if v := root.Get(f.name); v.Exists() && v.Type != gjson.Null && !f.ok(v) {
			return apierror.InvalidType(f.name, f.want, v)
		}
	}
	var bad *apierror.Error
	root.Get("tools").ForEach(func(k, t gjson.Result) bool {
		if !t.IsObject() {
			bad = apierror.InvalidType("tools["+k.String()+"]", "an object", t)
		}
		return bad == nil
	})
	root.Get("include").ForEach(func(k, v gjson.Result) bool {
		if bad == nil && !isString(v) {
			bad = apierror.InvalidType("include["+k.String()+"]", "a string", v)
		}
		return bad == nil
	})
	return bad
}

// excludes reports whether tool_choice rules the hosted tool typ out: "none", or an
// allowed_tools list without it.
func excludes(tc gjson.Result, typ string) bool {
	switch {
	case tc.Type == gjson.String:
		return tc.String() == "none"
	case tc.Get("type").String() == "allowed_tools":
		found := false
		tc.Get("tools").ForEach(func(_, t gjson.Result) bool {
			found = t.Get("type").String() == typ
			return !found
		})
		return !found
	}
	return false
}
