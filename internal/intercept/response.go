package intercept

import (
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
)

// This file is the translator's last stage: the Response the client sees, patched from the
// upstream's, and the terminal events that carry it.

// completed returns the terminal event for a loop that ended normally: response.completed, or
// response.incomplete when the last upstream call was cut short.
func (t *translator) completed() Event {
	if t.end == outcomeFailed {
		return t.failed(nil)
	}
	o := outcomeCompleted
	if t.end == outcomeIncomplete {
		o = outcomeIncomplete
	}
	return newResponseEvent(o.eventType(), t.patch(t.final, o.status(), t.output(), true))
}

// upstreamFailed returns the end of a response whose upstream call failed: the nested error
// event (unless the upstream sent one, which the client has seen already), so SDKs raise it even
// when the upstream sent response.failed alone, then response.failed.
func (t *translator) upstreamFailed() []Event {
	if t.errDetail != nil {
		return []Event{t.failed(t.errDetail)}
	}
	t.errDetail = upstreamErrorDetail(t.final)
	return []Event{newErrorEvent(t.errDetail), t.failed(t.errDetail)}
}

// failed returns the terminal event of a failed loop. detail is the error event's detail (nil:
// the upstream's own error, if any).
func (t *translator) failed(detail []byte) Event {
	resp := t.patch(t.skeleton, "failed", t.output(), true)
	var e responseError
	if detail != nil {
		d := gjson.ParseBytes(detail)
		e.Code, e.Message = d.Get("code").String(), d.Get("message").String()
		if e.Code == "" {
			e.Code = d.Get("type").String()
		}
	} else if ue := gjson.GetBytes(t.skeleton, "error"); ue.IsObject() {
		e.Code, e.Message = ue.Get("code").String(), ue.Get("message").String()
	}
	if e.Code == "" {
		e.Code = apierror.CodeServer
	}
	if e.Message == "" {
		e.Message = "The response failed."
	}
	resp, _ = sjson.SetRawBytes(resp, "error", marshal(e))
	return newResponseEvent(outcomeFailed.eventType(), resp)
}

// storedResponse returns the final Response resp as it is stored: with every call's outputs,
// which a GET shows only when it includes code_interpreter_call.outputs.
func (t *translator) storedResponse(resp []byte) []byte {
	if len(t.withOutputs) == 0 {
		return resp
	}
	k := 0
	for i, it := range t.out {
		if it == nil {
			continue
		}
		if full, ok := t.withOutputs[i]; ok {
			if out, err := sjson.SetRawBytes(resp, "output."+strconv.Itoa(k), full); err == nil {
				resp = out
			}
		}
		k++
	}
	return resp
}

// withoutOutputs returns a stored Response with the outputs of its calls null, as a GET that
// does not include code_interpreter_call.outputs shows it.
func withoutOutputs(resp []byte) []byte {
	gjson.GetBytes(resp, "output").ForEach(func(k, it gjson.Result) bool {
		if it.Get("type").String() == "code_interpreter_call" && it.Get("outputs").IsArray() {
			if out, err := sjson.SetRawBytes(resp, "output."+k.String()+".outputs", []byte("null")); err == nil {
				resp = out
			}
		}
		return true
	})
	return resp
}

// output renders the client-visible output list. Items still in progress (a failure cut them
// short) are left out.
func (t *translator) output() []byte {
	size := 2
	for _, it := range t.out {
		size += len(it) + 1
	}
	b := make([]byte, 0, size)
	b = append(b, '[')
	for _, it := range t.out {
		if it != nil {
			b = appendElem(b, it)
		}
	}
	return append(b, ']')
}

// patch returns resp (an upstream Response, possibly nil) as the client's Response: the proxy's
// id, the client's model, tools and tool_choice, the given status and output, and (when
// withUsage) the usage summed over the loop.
func (t *translator) patch(resp []byte, status string, output []byte, withUsage bool) []byte {
	if !jsondepth.Valid(resp) || !gjson.ParseBytes(resp).IsObject() {
		resp = marshal(emptyResponse{Object: "response", Output: []string{}})
	}
	set := func(path string, raw []byte) {
		if raw == nil {
			return
		}
		if out, err := sjson.SetRawBytes(resp, path, raw); err == nil {
			resp = out
		}
	}
	set("id", jsonString(t.id))
	if t.createdAt == 0 {
		t.createdAt = gjson.GetBytes(resp, "created_at").Int()
	}
	set("created_at", []byte(strconv.FormatInt(t.createdAt, 10)))
	set("status", jsonString(status))
	if status == "in_progress" && gjson.GetBytes(resp, "completed_at").Exists() {
		set("completed_at", []byte("null")) // a skeleton from a finished (JSON) answer says when it finished
	}
	if status != "failed" && gjson.GetBytes(resp, "error").Exists() {
		set("error", []byte("null"))
	}
	set("model", t.req.model)
	set("tools", t.req.tools)
	if t.req.toolChoice != nil {
		set("tool_choice", t.req.toolChoice)
	} else {
		set("tool_choice", []byte(`"auto"`))
	}
	if t.req.previousID != nil {
		set("previous_response_id", t.req.previousID)
	} else if gjson.GetBytes(resp, "previous_response_id").Exists() {
		set("previous_response_id", []byte("null"))
	}
	set("max_tool_calls", t.req.maxToolCallsRaw)
	set("output", output)
	switch {
	case withUsage && t.usage.seen:
		set("usage", t.usage.json())
	case !withUsage && gjson.GetBytes(resp, "usage").Exists():
		// An in-progress response has no usage yet, even when its skeleton came from an
		// upstream's finished (JSON) answer.
		set("usage", []byte("null"))
	}
	return resp
}
