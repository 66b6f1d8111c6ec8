package intercept

// The shell tool in a request: its settings, and the shell calls and outputs of the input.

import (
	"fmt"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store"
)

// wantsShell reports whether tools holds a shell tool.
func wantsShell(root gjson.Result) bool {
	found := false
	root.Get("tools").ForEach(func(_, t gjson.Result) bool {
		found = t.Get("type").String() == "shell"
		return !found
	})
	return found
}

// parseAuto reads an auto container's settings (code_interpreter's {"type":"auto"}, the shell
// tool's container_auto) at param into spec, and its file_ids into the request's files.
func (r *parsedRequest) parseAuto(c gjson.Result, param string, spec *containerSpec) *apierror.Error {
	switch ml := c.Get("memory_limit"); {
	case !ml.Exists(), ml.Type == gjson.Null:
	case ml.Type == gjson.String && validMemoryLimit(ml.String()):
		spec.memoryLimit = ml.String()
	default:
		return apierror.BadRequest("Invalid value for '"+param+".memory_limit': expected one of '1g', '4g', '16g', '64g'.", param+".memory_limit", apierror.CodeInvalidValue)
	}
	np, bad := ParseNetworkPolicy(c.Get("network_policy"), param+".network_policy")
	if bad != nil {
		return bad
	}
	if np != nil {
		spec.network, spec.networkParam = np, param+".network_policy"
	}
	files, bad := parseFileIDs(c.Get("file_ids"), param+".file_ids")
	r.files = append(r.files, files...)
	return bad
}

// parseShellTool reads the shell tool at param: which environment runs its commands, and for a
// hosted one the container it names (into spec).
func (r *parsedRequest) parseShellTool(t gjson.Result, param, fn string, spec *containerSpec) *apierror.Error {
	r.shell = shellTool{fn: fn}
	env := t.Get("environment")
	param += ".environment"
	if !env.Exists() || env.Type == gjson.Null {
		return nil // the client runs the commands; its calls show no environment
	}
	if !env.IsObject() {
		return apierror.InvalidType(param, "an object", env)
	}
	switch typ := env.Get("type"); {
	case !typ.Exists():
		return apierror.BadRequest("Missing required parameter: '"+param+".type'.", param+".type", "")
	case typ.Str == "local":
		r.shell.local = true
	case typ.Str == "container_auto":
		r.shell.hosted = true
		spec.param = param
		return r.parseAuto(env, param, spec)
	case typ.Str == "container_reference":
		r.shell.hosted = true
		id := env.Get("container_id")
		switch {
		case !id.Exists() || id.Type == gjson.Null:
			return apierror.BadRequest("Missing required parameter: '"+param+".container_id'.", param+".container_id", "")
		case id.Type != gjson.String:
			return apierror.InvalidType(param+".container_id", "a string", id)
		}
		spec.id, spec.param = id.Str, param+".container_id"
	default:
		return apierror.BadRequest(fmt.Sprintf("Invalid value for '%s.type': %s. Supported values are: 'container_auto', 'container_reference' and 'local'.", param, typ.Raw), param+".type", apierror.CodeInvalidValue)
	}
	return nil
}

// shareContainer makes the hosted shell tool's container the request's one container beside
// code_interpreter's: an id either names is the one; two different ids are refused, since one
// request has one container.
func (r *parsedRequest) shareContainer(sh containerSpec) *apierror.Error {
	if !r.shell.hosted {
		return nil
	}
	switch {
	case sh.id != "" && r.container.id != "" && sh.id != r.container.id:
		return apierror.BadRequest("The code_interpreter and shell tools name different containers ('"+r.container.id+"' and '"+sh.id+"'); one request uses one container.", sh.param, apierror.CodeInvalidValue)
	case sh.id != "" && r.container.id == "":
		r.container.id, r.container.param = sh.id, sh.param
	case r.container.param == "":
		r.container.param = sh.param
	}
	if r.container.memoryLimit == "" {
		r.container.memoryLimit = sh.memoryLimit
	}
	if r.container.network == nil {
		r.container.network, r.container.networkParam = sh.network, sh.networkParam
	}
	return nil
}

// shellCallInput is the stand-in's function_call for a shell_call the client sends back.
func shellCallInput(it gjson.Result, fn string) []byte {
	a := shellAction{Commands: []string{}}
	it.Get("action.commands").ForEach(func(_, c gjson.Result) bool {
		a.Commands = append(a.Commands, c.String())
		return true
	})
	for _, f := range []struct {
		key string
		dst **int64
	}{{"action.timeout_ms", &a.TimeoutMS}, {"action.max_output_length", &a.MaxOutputLength}} {
		if v := it.Get(f.key); v.Type == gjson.Number {
			n := v.Int()
			*f.dst = &n
		}
	}
	return marshal(functionCall{Type: "function_call", CallID: it.Get("call_id").String(), Name: fn, Arguments: string(marshal(a))})
}

// shellOutputText is what the model is told of a shell_call_output's entries, as the proxy tells
// it of the commands it runs: the entries as JSON.
func shellOutputText(output gjson.Result) string {
	entries := []shellEntry{}
	output.ForEach(func(_, e gjson.Result) bool {
		en := shellEntry{Stdout: e.Get("stdout").String(), Stderr: e.Get("stderr").String(), Outcome: shellOutcome{Type: "timeout"}}
		if e.Get("outcome.type").String() != "timeout" {
			code := int(e.Get("outcome.exit_code").Int())
			en.Outcome = shellOutcome{Type: "exit", ExitCode: &code}
		}
		entries = append(entries, en)
		return true
	})
	return string(marshal(entries))
}

// checkShellPairs refuses, as OpenAI does, a shell_call_output in input whose call_id names no
// shell_call of the context, and a shell_call of the input without its output. The context is
// the input before the output and what prior reports of the conversation previous_response_id
// continues (nil: there is none); a prior that cannot tell reports every call_id as known.
func checkShellPairs(in []gjson.Result, prior func(callID string) bool) *apierror.Error {
	calls, outputs := map[string]bool{}, map[string]bool{}
	var order []string
	for _, it := range in {
		id := it.Get("call_id").String()
		switch it.Get("type").String() {
		case "shell_call":
			calls[id] = true
			order = append(order, id)
		case "shell_call_output":
			if !calls[id] && (prior == nil || !prior(id)) {
				return apierror.BadRequest("No tool call found for shell call output with call_id "+id+".", "input", "")
			}
			outputs[id] = true
		}
	}
	for _, id := range order {
		if !outputs[id] {
			return apierror.BadRequest("No tool output found for shell call "+id+".", "input", "")
		}
	}
	return nil
}

// shellReference returns the shell item the proxy minted that an item_reference names ("sh_…",
// "sho_…"), as the client received it; any other item, and a reference the store does not hold
// for the caller, is returned as it is.
func shellReference(it gjson.Result, lk lookup) gjson.Result {
	if it.Get("type").String() != "item_reference" {
		return it
	}
	id := it.Get("id").String()
	if !strings.HasPrefix(id, "sh_") && !strings.HasPrefix(id, "sho_") {
		return it
	}
	if sc, ok := storedCall(lk, id); ok && sc.Item != "" && gjson.Valid(sc.Item) {
		return gjson.Parse(sc.Item)
	}
	return it
}

// maxChainReads bounds the records read back along a previous_response_id chain for the calls of
// its conversation; a longer chain is not checked.
const maxChainReads = 32

// priorShellCalls reports, for a call_id, whether the conversation sr ends is known to hold a
// shell call of it, or not known well enough to tell: sr's conversation as the proxy kept it (for
// an upstream that keeps nothing), or, while the chain is the caller's and stored with its
// bodies, each response's input and output back to the first. Records are read only while a
// call_id is still missing.
func (lk lookup) priorShellCalls(sr store.Response, sfn string) func(string) bool {
	ids := map[string]bool{}
	next, whole, reads := &sr, false, 0
	return func(callID string) bool {
		for !ids[callID] && next != nil {
			cur := next
			next = nil
			var prev string
			if prev, whole = lk.shellCallsOf(*cur, sfn, ids); prev == "" || whole {
				break
			}
			if reads++; reads > maxChainReads {
				break
			}
			sr, known, err := readResponse(lk.ctx, lk.store, prev)
			if err != nil {
				lk.fail(err)
				break
			}
			if known && sr.Owner == lk.caller {
				next = &sr
			}
		}
		return ids[callID] || (next == nil && !whole)
	}
}

// shellCallsOf adds the call_ids of the shell calls of one stored response to ids, and returns
// the response it continues ("" for none) and whether its record holds the whole conversation.
// A record that holds none of it (not kept, or deleted) is a chain that cannot be followed: ""
// and false.
func (lk lookup) shellCallsOf(sr store.Response, sfn string, ids map[string]bool) (prev string, whole bool) {
	add := func(items []gjson.Result) {
		for _, it := range items {
			switch typ := it.Get("type").String(); {
			case typ == "shell_call", typ == "function_call" && it.Get("name").String() == sfn:
				ids[it.Get("call_id").String()] = true
			case typ == "item_reference":
				if ref := shellReference(it, lk); ref.Get("type").String() == "shell_call" {
					ids[ref.Get("call_id").String()] = true
				}
			}
		}
	}
	if sr.UpstreamID == "" && len(sr.Pending) > 0 {
		// The conversation the proxy kept: every item of the chain, in the upstream's form.
		items := make([]gjson.Result, len(sr.Pending))
		for i, it := range sr.Pending {
			items[i] = gjson.ParseBytes(it)
		}
		add(items)
		return "", true
	}
	if sr.Body == nil {
		return "", false
	}
	add(gjson.ParseBytes(sr.Input).Array())
	add(gjson.GetBytes(sr.Body, "output").Array())
	prev = gjson.GetBytes(sr.Body, "previous_response_id").String()
	return prev, prev == ""
}
