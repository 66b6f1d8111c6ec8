package intercept

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// TestStoredResponses: GET /v1/responses/{id} returns the Response an intercepted request got,
// only to its owner and only when it was stored; DELETE forgets it; other ids are not ours.
func TestStoredResponses(t *testing.T) {
	h := newHarness(t)
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
		ok := h.eng.Minted(r.Context(), id)
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
	if ok, code, got := serve(http.MethodDelete, id, "alice"); !ok || code != http.StatusOK || !gjson.GetBytes(got, "deleted").Bool() {
		t.Errorf("DELETE own response = %v %d %s; want deleted", ok, code, got)
	}
	if ok, _, _ := serve(http.MethodGet, id, "alice"); ok {
		t.Error("a deleted response is still served")
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
