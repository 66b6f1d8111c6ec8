package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestUpstreamResponsesBelongToTheirKey: through the binary, a response the upstream stored for a
// request that passed through is its key's alone: another client key reading or continuing it
// gets OpenAI's "not found", and the upstream never hears of it.
func TestUpstreamResponsesBelongToTheirKey(t *testing.T) {
	up := upstreamtest.New(t)
	path := writeConfig(t, t.TempDir(), `model_list:
  - model_name: gpt-a
    litellm_params: {model: openai/gpt-a-up, api_base: `+up.URL()+`, api_key: sk-upstream}
general_settings:
  master_key: `+testKey+`
  client_keys:
    - {name: alice, key: sk-alice-key}
    - {name: bob, key: sk-bob-key}
`)
	p := start(t, "--config", path)
	do := func(method, path, key, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, p.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("alice's answer")}})
	status, body := do(http.MethodPost, "/v1/responses", "sk-alice-key", `{"model":"gpt-a","input":"hi"}`)
	id := gjson.Get(body, "id").String()
	if status != http.StatusOK || id == "" {
		t.Fatalf("alice's POST = %d %s", status, body)
	}
	if status, body := do(http.MethodGet, "/v1/responses/"+id, "sk-alice-key", ""); status != http.StatusOK || !strings.Contains(body, "alice's answer") {
		t.Errorf("alice's GET = %d %s; want her response", status, body)
	}
	before := len(up.Requests())
	if status, body := do(http.MethodGet, "/v1/responses/"+id, "sk-bob-key", ""); status != http.StatusNotFound || gjson.Get(body, "error.message").String() != "Response with id '"+id+"' not found." {
		t.Errorf("bob's GET = %d %s; want OpenAI's 404", status, body)
	}
	if status, body := do(http.MethodPost, "/v1/responses", "sk-bob-key", `{"model":"gpt-a","input":"more","previous_response_id":"`+id+`"}`); status != http.StatusBadRequest || gjson.Get(body, "error.code").String() != "previous_response_not_found" {
		t.Errorf("bob continuing it = %d %s; want previous_response_not_found", status, body)
	}
	if n := len(up.Requests()); n != before {
		t.Errorf("the upstream got %d of bob's requests for alice's response", n-before)
	}
}
