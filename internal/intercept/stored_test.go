package intercept

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// TestStoredResponses: GET /v1/responses/{id} returns the Response an intercepted request got,
// only to its owner and only when it was stored; DELETE forgets it; other ids are not ours.
func TestStoredResponses(t *testing.T) { forEachAPI(t, testStoredResponses) }

func testStoredResponses(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	cid := h.container("alice")
	h.up.Enqueue(calls("6 * 7"), text("42."))
	status, resp := h.post(bodyIn(cid, ""), "alice")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	id := gjson.GetBytes(resp, "id").String()

	// serve answers as the router does: ids the engine minted are its own, other ids pass through.
	serve := func(method, id, caller string) (bool, int, []byte) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(method, "/v1/responses/"+id, nil)
		ok, _ := h.eng.Minted(r.Context(), id)
		if ok {
			serveLikeRouter(rec, r, func() error { return h.eng.ServeStored(rec, r, id, caller) })
		}
		return ok, rec.Code, rec.Body.Bytes()
	}
	if ok, code, got := serve(http.MethodGet, id, "alice"); !ok || code != http.StatusOK || !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(resp)) {
		t.Errorf("GET own response = %v %d %s; want the response the client received:\n%s", ok, code, got, resp)
	}
	if ok, code, got := serve(http.MethodGet, id, "mallory"); !ok || code != http.StatusNotFound {
		t.Errorf("GET another caller's response = %v %d %s; want 404", ok, code, got)
	}
	if ok, _, _ := serve(http.MethodGet, "resp_upstreams", "alice"); ok {
		t.Error("ServeStored claimed an id the proxy did not mint")
	}
	// The proxy makes no background responses: cancelling one of its own is the 400 OpenAI
	// answers for a synchronous response; another caller's is not found.
	cancel := func(id, caller string) (int, []byte) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/responses/"+id+"/cancel", nil)
		serveLikeRouter(rec, r, func() error { return h.eng.ServeCancel(rec, r, id, caller) })
		return rec.Code, rec.Body.Bytes()
	}
	if code, got := cancel(id, "alice"); code != http.StatusBadRequest || gjson.GetBytes(got, "error.type").Str != "invalid_request_error" ||
		gjson.GetBytes(got, "error.message").Str != "Cannot cancel a synchronous response." {
		t.Errorf("cancel own response = %d %s; want 400 Cannot cancel a synchronous response.", code, got)
	}
	if code, got := cancel(id, "mallory"); code != http.StatusNotFound {
		t.Errorf("cancel another caller's response = %d %s; want 404", code, got)
	}
	if ok, code, got := serve(http.MethodDelete, id, "alice"); !ok || code != http.StatusOK || !gjson.GetBytes(got, "deleted").Bool() {
		t.Errorf("DELETE own response = %v %d %s; want deleted", ok, code, got)
	}
	// A deleted id stays the proxy's (no upstream hears of it), and is not found.
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		if ok, code, _ := serve(method, id, "alice"); !ok || code != http.StatusNotFound {
			t.Errorf("%s a deleted response = %v %d; want ours, 404", method, ok, code)
		}
	}
	if code, got := cancel(id, "alice"); code != http.StatusNotFound {
		t.Errorf("cancel a deleted response = %d %s; want 404", code, got)
	}
	before := len(h.up.Requests())
	if status, raw := h.post(bodyIn(cid, `"previous_response_id":"`+id+`"`), "alice"); status != http.StatusBadRequest ||
		gjson.GetBytes(raw, "error.code").String() != "previous_response_not_found" || len(h.up.Requests()) != before {
		t.Errorf("continuing a deleted response = %d %s; want 400 previous_response_not_found, nothing sent", status, raw)
	}

	h.up.Enqueue(calls("1"), text("One."))
	_, resp = h.post(bodyIn(cid, `"store":false`), "alice")
	if ok, code, _ := serve(http.MethodGet, gjson.GetBytes(resp, "id").String(), "alice"); !ok || code != http.StatusNotFound {
		t.Errorf("GET a store:false response = %v %d; want 404", ok, code)
	}
}

// TestStoredResponseHonoursInclude: a GET shows the calls' outputs when it includes
// code_interpreter_call.outputs, whatever the request included, and null otherwise.
func TestStoredResponseHonoursInclude(t *testing.T) {
	for _, requestIncluded := range []bool{false, true} {
		h := newHarness(t)
		h.fake.setRun(func(context.Context, string) (sandbox.Result, error) { return sandbox.Result{Stdout: "42\n"}, nil })
		h.up.Enqueue(calls("print(42)"), text("42."))
		extra := ""
		if requestIncluded {
			extra = `"include":["code_interpreter_call.outputs"]`
		}
		_, resp := h.post(body(extra), "alice")
		id := gjson.GetBytes(resp, "id").String()
		get := func(query string) []byte {
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodGet, "/v1/responses/"+id+query, nil)
			serveLikeRouter(rec, r, func() error { return h.eng.ServeStored(rec, r, id, "alice") })
			if rec.Code != http.StatusOK {
				t.Fatalf("GET %s: %d %s", query, rec.Code, rec.Body)
			}
			return rec.Body.Bytes()
		}
		for _, q := range []string{"?include[]=code_interpreter_call.outputs", "?include=code_interpreter_call.outputs"} {
			if got := gjson.GetBytes(get(q), "output.0.outputs").Raw; got != `[{"type":"logs","logs":"42\n"}]` {
				t.Errorf("request included %v: GET%s outputs = %s", requestIncluded, q, got)
			}
		}
		plain := get("")
		if got := gjson.GetBytes(plain, "output.0.outputs").Raw; got != "null" {
			t.Errorf("request included %v: GET outputs = %s, want null", requestIncluded, got)
		}
		if !requestIncluded && !bytes.Equal(bytes.TrimSpace(plain), bytes.TrimSpace(resp)) {
			t.Errorf("GET without include differs from what the client received:\n%s\n%s", plain, resp)
		}
	}
}

// TestInputItems: GET /v1/responses/{id}/input_items lists a minted response's input as OpenAI
// does, paged, with include honoured, whatever API the upstream speaks.
func TestInputItems(t *testing.T) { forEachAPI(t, testInputItems) }

func testInputItems(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withLocal())
	h.up.Enqueue(calls("print(5)"), text("Five."))
	status, resp := h.post(body(`"include":["code_interpreter_call.outputs"]`), "alice")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	ci := gjson.GetBytes(resp, "output.0").Raw
	h.up.Enqueue(text("Again."))
	in := `[{"role":"user","content":"first"},` + ci + `,{"type":"message","role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]},{"role":"assistant","content":"noted"}]`
	status, resp = h.post(`{"model":"gpt-test","input":`+in+`,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, "alice")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	id := gjson.GetBytes(resp, "id").String()

	list := func(query, caller string) (int, []byte) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/v1/responses/"+id+"/input_items"+query, nil)
		serveLikeRouter(rec, r, func() error { return h.eng.ServeInputItems(rec, r, id, caller) })
		return rec.Code, rec.Body.Bytes()
	}
	code, got := list("", "alice")
	if code != http.StatusOK || gjson.GetBytes(got, "object").Str != "list" || gjson.GetBytes(got, "has_more").Bool() {
		t.Fatalf("input_items = %d %s", code, got)
	}
	var seen []string
	gjson.GetBytes(got, "data").ForEach(func(_, it gjson.Result) bool {
		seen = append(seen, it.Get("type").Str+":"+it.Get("role").Str)
		if it.Get("id").Str == "" {
			t.Errorf("item without an id: %s", it.Raw)
		}
		return true
	})
	// Newest first by default.
	if want := "message:assistant,message:user,code_interpreter_call:,message:user"; strings.Join(seen, ",") != want {
		t.Errorf("items = %v; want %s", seen, want)
	}
	if p := gjson.GetBytes(got, "data.0.content.0"); p.Get("type").Str != "output_text" || p.Get("text").Str != "noted" {
		t.Errorf("the assistant's string content = %s; want an output_text part", p.Raw)
	}
	if gjson.GetBytes(got, "data.1.content.1.image_url").Exists() || gjson.GetBytes(got, "data.2.outputs").Type != gjson.Null {
		t.Errorf("without include: image_url or outputs shown: %s", got)
	}
	if first, last := gjson.GetBytes(got, "first_id").Str, gjson.GetBytes(got, "last_id").Str; first != gjson.GetBytes(got, "data.0.id").Str || last != gjson.GetBytes(got, "data.3.id").Str {
		t.Errorf("first_id %s, last_id %s", first, last)
	}

	code, got = list("?include[]=code_interpreter_call.outputs&include[]=message.input_image.image_url&order=asc&limit=2", "alice")
	if code != http.StatusOK || gjson.GetBytes(got, "data.#").Int() != 2 || !gjson.GetBytes(got, "has_more").Bool() ||
		gjson.GetBytes(got, "data.0.content.0.text").Str != "first" || gjson.GetBytes(got, "data.1.outputs.0.logs").Str != "5\n" {
		t.Fatalf("asc page 1 = %d %s", code, got)
	}
	code, got = list("?include=message.input_image.image_url&order=asc&limit=2&after="+gjson.GetBytes(got, "last_id").Str, "alice")
	if code != http.StatusOK || gjson.GetBytes(got, "data.#").Int() != 2 || gjson.GetBytes(got, "has_more").Bool() ||
		gjson.GetBytes(got, "data.0.content.1.image_url").Str != "data:image/png;base64,AAAA" {
		t.Fatalf("asc page 2 = %d %s", code, got)
	}

	// The list parameters are refused as the Files and Containers lists refuse them, as OpenAI does.
	for _, tt := range []struct{ query, caller, param, code, message string }{
		{"?limit=0", "alice", "limit", "integer_below_min_value", "Invalid 'limit': integer below minimum value. Expected a value >= 1, but got 0 instead."},
		{"?limit=101", "alice", "limit", "integer_above_max_value", "Invalid 'limit': integer above maximum value. Expected a value <= 100, but got 101 instead."},
		{"?limit=ten", "alice", "limit", "invalid_value", "Invalid 'limit': expected an integer, but got 'ten' instead."},
		{"?order=up", "alice", "order", "invalid_value", "Invalid value for 'order': 'up'. Supported values are: 'asc' and 'desc'."},
		{"", "mallory", "", "", "Response with id '" + id + "' not found."},
	} {
		code, got := list(tt.query, tt.caller)
		want := http.StatusBadRequest
		if tt.param == "" {
			want = http.StatusNotFound
		}
		if e := gjson.GetBytes(got, "error"); code != want || e.Get("param").Str != tt.param || e.Get("code").Str != tt.code || e.Get("message").Str != tt.message {
			t.Errorf("%s as %s = %d %s; want %d naming %q, code %q, %q", tt.query, tt.caller, code, got, want, tt.param, tt.code, tt.message)
		}
	}

	// A string input is one user message; store:false keeps no input.
	h.up.Enqueue(text("ok"), text("ok"))
	ciTool := `,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`
	_, resp = h.post(`{"model":"gpt-test","input":"just this"`+ciTool, "alice")
	id = gjson.GetBytes(resp, "id").String()
	if code, got := list("", "alice"); code != http.StatusOK || gjson.GetBytes(got, "data.#").Int() != 1 ||
		gjson.GetBytes(got, "data.0.role").Str != "user" || gjson.GetBytes(got, "data.0.content.0.type").Str != "input_text" {
		t.Errorf("string input = %d %s", code, got)
	}
	_, resp = h.post(`{"model":"gpt-test","input":"x","store":false`+ciTool, "alice")
	id = gjson.GetBytes(resp, "id").String()
	if code, _ := list("", "alice"); code != http.StatusNotFound {
		t.Errorf("store:false input_items = %d; want 404", code)
	}
}
