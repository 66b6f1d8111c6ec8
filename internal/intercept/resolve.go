package intercept

// Resolving a parsed request against the store: what previous_response_id and the input's
// items refer to.

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store"
)

// lookup is what parsing needs from the store: the records of responses and calls this proxy
// minted, which only their owner may use.
type lookup struct {
	ctx    context.Context
	store  store.Responses
	caller string
	// stateless: the upstream keeps no responses (Request.Stateless), so a previous_response_id
	// must be one whose conversation the proxy kept.
	stateless bool
	// items are the items of the conversation previous_response_id stands for when the proxy
	// kept it, by id, for item_reference items.
	items map[string][]byte
	// err receives the first error of the store (resolve sets it up and returns it).
	err *error
	// prev is previous_response_id's record when Prepare read it already; nil: resolve reads it.
	prev *prevRecord
}

// prevRecord is the stored response previous_response_id names, read once per request.
type prevRecord struct {
	sr    store.Response
	known bool // the store holds it
}

// fail records the store's first error.
func (lk lookup) fail(err error) {
	if lk.err != nil && *lk.err == nil {
		*lk.err = err
	}
}

// resolve completes the request with what it refers to in the store, its one I/O step, which the
// engine takes before the loop starts: a previous_response_id this proxy minted stands for the
// last upstream response of its loop (or, for an upstream that keeps nothing, the conversation the
// proxy kept), its container, and the outputs of stand-in calls the client never saw as function
// calls; code_interpreter_call items (and references to them) sent back as input become the
// function_call and function_call_output pairs the upstream saw, and references to items of a
// kept conversation become those items. Records of another caller are not used. A nil lk.store
// resolves nothing. A store that cannot answer is a 503 (store_unavailable): the request cannot be
// resolved.
//
// For a stateless upstream previous_response_id never goes upstream: one whose conversation the
// proxy did not keep (unknown, another caller's, store false, or continued upstream) is the 400
// previous_response_not_found OpenAI answers for an unknown id. For any other upstream an id the
// proxy did not mint passes through, for the upstream to resolve.
func (r *parsedRequest) resolve(lk lookup) *apierror.Error {
	var failed error
	lk.err = &failed
	var pending [][]byte
	var prevSR *store.Response // previous_response_id's record, when it is the caller's
	prevRaw := gjson.GetBytes(r.raw, "previous_response_id")
	if prev := prevRaw.String(); prev != "" {
		var sr store.Response
		known := false
		switch {
		case lk.prev != nil:
			sr, known = lk.prev.sr, lk.prev.known
		case lk.store != nil:
			var err error
			if sr, known, err = readResponse(lk.ctx, lk.store, prev); err != nil {
				return storeUnavailable(err)
			}
		}
		known = known && sr.Owner == lk.caller
		kept := known && sr.UpstreamID == "" && len(sr.Pending) > 0 // the proxy kept the conversation
		switch {
		case kept:
			r.base, _ = sjson.DeleteBytes(r.base, "previous_response_id")
			lk.items = itemsByID(sr.Pending)
		case known && sr.UpstreamID != "" && !lk.stateless:
			r.base, _ = sjson.SetBytes(r.base, "previous_response_id", sr.UpstreamID)
		case known || lk.stateless:
			return apierror.BadRequest("Previous response with id '"+prev+"' not found.", "previous_response_id", apierror.CodePreviousResponseNotFound)
		}
		if known {
			prevSR = &sr
			r.useContainer(sr.ContainerID)
			for _, it := range sr.Pending {
				pending = append(pending, it)
			}
		}
	} else if lk.stateless && prevRaw.Exists() {
		r.base, _ = sjson.DeleteBytes(r.base, "previous_response_id") // null or "": not sent
	}
	in := gjson.GetBytes(r.raw, "input")
	if in.Type == gjson.Null {
		in = gjson.Result{} // null stands for absent: no [null] input
	}
	switch {
	case in.Type == gjson.String && len(pending) == 0:
		r.inputString = true
	case in.Type == gjson.String:
		r.input = append(append([][]byte(nil), pending...), userMessageOf(in))
	default:
		// References to the shell items the proxy minted become those items, for the pairing
		// check and the upstream alike.
		items := in.Array()
		for i, it := range items {
			items[i] = shellReference(it, lk)
		}
		r.input = append(r.input, pending...)
		k := 0
		var unknown *apierror.Error
		opaque := false // an item_reference the proxy cannot resolve goes upstream as it is
		for _, it := range items {
			for i := range r.files {
				if r.files[i].item == k {
					r.files[i].at = len(r.input)
				}
			}
			for i := range r.inlined {
				if r.inlined[i].item == k {
					r.inlined[i].at = len(r.input)
				}
			}
			items, container := translateInputItem(it, r.fn, r.shell.fn, lk)
			if len(items) == 1 && gjson.GetBytes(items[0], "type").String() == "item_reference" {
				if lk.stateless {
					// Nobody upstream can resolve it: OpenAI's answer for an item it does not hold.
					unknown = apierror.NotFound("Item with id '"+it.Get("id").String()+"' not found.", "input")
					break
				}
				opaque = true
			}
			r.input = append(r.input, items...)
			r.useContainer(container)
			k++
		}
		if unknown != nil && failed == nil {
			return unknown
		}
		if r.shell.fn != "" && failed == nil {
			var prior func(string) bool // nil: the input is the whole context
			switch {
			case opaque || (prevRaw.String() != "" && prevSR == nil):
				// The upstream holds context the proxy does not see (an item only it can
				// resolve, a conversation it keeps): its calls are not checked here.
				prior = func(string) bool { return true }
			case prevSR != nil:
				prior = lk.priorShellCalls(*prevSR, r.shell.fn)
			}
			if bad := checkShellPairs(items, prior); bad != nil && failed == nil {
				return bad
			}
		}
	}
	if failed != nil {
		return storeUnavailable(failed)
	}
	return nil
}

// storeUnavailable is the error of a request that needs a record the store cannot read now.
func storeUnavailable(err error) *apierror.Error {
	return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeServer, Code: apierror.CodeStoreUnavailable,
		Message: "The service's state store is unavailable; please try again shortly.", Err: err}
}

// itemsByID indexes the items of a kept conversation by id.
func itemsByID(items []json.RawMessage) map[string][]byte {
	m := make(map[string][]byte, len(items))
	for _, it := range items {
		if id := gjson.GetBytes(it, "id").String(); id != "" {
			m[id] = it
		}
	}
	return m
}

// useContainer adds a container the conversation used to the context.
func (r *parsedRequest) useContainer(id string) {
	if id == "" {
		return
	}
	if i := slices.Index(r.contextContainers, id); i >= 0 {
		r.contextContainers = slices.Delete(r.contextContainers, i, i+1)
	}
	r.contextContainers = append(r.contextContainers, id)
}

// translateInputItem turns replayed code_interpreter_call items (and references to ones this
// proxy minted) into the function_call + function_call_output pair the upstream saw, shell_call
// and shell_call_output items into the shell stand-in's call and output (sfn: its name; "": the
// proxy handles no shell tool), and returns the container such an item ran in ("" for any other
// item).
func translateInputItem(it gjson.Result, fn, sfn string, lk lookup) ([][]byte, string) {
	switch typ := it.Get("type").String(); {
	case sfn != "" && typ == "shell_call":
		return [][]byte{shellCallInput(it, sfn)}, it.Get("environment.container_id").String()
	case sfn != "" && typ == "shell_call_output":
		return [][]byte{functionOutput(it.Get("call_id").String(), shellOutputText(it.Get("output")))}, ""
	}
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
		container := it.Get("container_id").String()
		if container == "" {
			container = sc.ContainerID
		}
		return callPair(fn, callID, code, output), container
	case "item_reference":
		id := it.Get("id").String()
		if strings.HasPrefix(id, "ci_") {
			if sc, ok := storedCall(lk, id); ok {
				return callPair(fn, sc.CallID, sc.Code, sc.Output), sc.ContainerID
			}
		}
		if item, ok := lk.items[id]; ok {
			return [][]byte{item}, ""
		}
	}
	return [][]byte{[]byte(it.Raw)}, ""
}

func storedCall(lk lookup, id string) (store.Call, bool) {
	if lk.store == nil || id == "" {
		return store.Call{}, false
	}
	sc, ok, err := readCall(lk.ctx, lk.store, id)
	lk.fail(err)
	if !ok || sc.Owner != lk.caller {
		return store.Call{}, false
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

func rawOf(r gjson.Result) []byte {
	if !r.Exists() {
		return nil
	}
	return []byte(r.Raw)
}
