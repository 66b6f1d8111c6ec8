package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestLiteLLMConfig runs the real binary on a LiteLLM-shaped config: Azure deployments (a key
// from credential_list, an Entra ID token on the v1 API) in front of the scripted upstream, default
// params, a bare OpenAI model name, an unusable Bedrock deployment and LiteLLM keys it ignores.
func TestLiteLLMConfig(t *testing.T) {
	backend := upstreamtest.New(t)
	azKey := upstreamtest.NewAzure(t, backend, upstreamtest.WithAzureKey("az-key"), upstreamtest.WithDeployments("gpt4o-eu"))
	azToken := upstreamtest.NewAzure(t, backend, upstreamtest.WithEntraToken("eyJ-entra"), upstreamtest.WithDeployments("o3"))
	cfg := fmt.Sprintf(`model_list:
  - model_name: gpt-azure
    litellm_params:
      model: azure/gpt4o-eu
      litellm_credential_name: azure_eu
      temperature: 0.1
      max_tokens: 500
      rpm: 100
  - model_name: gpt-azure-token
    litellm_params:
      model: azure/o3
      api_base: %s
      api_version: preview
      azure_ad_token: eyJ-entra
  - model_name: claude-bedrock
    litellm_params: {model: bedrock/anthropic.claude-3, aws_region_name: us-east-1}
  - model_name: gpt-4o
    litellm_params: {model: gpt-4o, api_base: %s, api_key: sk-openai}
credential_list:
  - credential_name: azure_eu
    credential_values: {api_base: %s, api_key: az-key, api_version: "2024-10-21"}
    credential_info: {description: EU}
sandbox_tools:
  - sandbox_tool_name: local
    litellm_params: {sandbox_provider: local, pool_size: 0}
litellm_settings:
  callbacks: ["code_interpreter_interception"]
  success_callback: ["langfuse"]
router_settings:
  routing_strategy: least-busy
  num_retries: 1
general_settings:
  master_key: %s
  alerting: ["slack"]
`, azToken.URL(), backend.URL(), azKey.URL(), testKey)
	r := start(t, "--config", writeConfig(t, t.TempDir(), cfg))

	send := func(t *testing.T, path, body string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, r.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	lastBackend := func(t *testing.T) upstreamtest.Request {
		t.Helper()
		reqs := backend.Requests()
		if len(reqs) == 0 {
			t.Fatal("the backend got no request")
		}
		return reqs[len(reqs)-1]
	}
	reply := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hi there")}}

	t.Run("azure chat completions with the credential's key and version, defaults applied", func(t *testing.T) {
		backend.Enqueue(reply)
		code, _, body := send(t, "/v1/chat/completions", `{"model":"gpt-azure","messages":[{"role":"user","content":"hi"}],"temperature":0.9}`)
		if code != 200 || !strings.Contains(body, "hi there") {
			t.Fatalf("status %d: %s", code, body)
		}
		seen := azKey.Requests()
		got := seen[len(seen)-1]
		if got.Path != "/openai/deployments/gpt4o-eu/chat/completions" || got.APIVersion != "2024-10-21" || got.APIKey != "az-key" {
			t.Errorf("azure saw %v; want the deployment path, api-version 2024-10-21 and the api-key header", got)
		}
		b := lastBackend(t)
		if string(b.Fields["temperature"]) != "0.9" || string(b.Fields["max_tokens"]) != "500" || b.Model != "gpt4o-eu" {
			t.Errorf("backend body %s; want the client's temperature, the default max_tokens and the deployment as model", b.Body)
		}
	})
	t.Run("azure responses, passed through", func(t *testing.T) {
		backend.Enqueue(reply)
		code, _, body := send(t, "/v1/responses", `{"model":"gpt-azure","input":"hi"}`)
		if code != 200 || !strings.Contains(body, "hi there") {
			t.Fatalf("status %d: %s", code, body)
		}
		seen := azKey.Requests()
		if got := seen[len(seen)-1]; got.Path != "/openai/responses" || got.APIVersion != "2024-10-21" {
			t.Errorf("azure saw %v; want /openai/responses?api-version=2024-10-21", got)
		}
		if b := lastBackend(t); string(b.Fields["max_output_tokens"]) != "500" || string(b.Fields["temperature"]) != "0.1" {
			t.Errorf("backend body %s; want max_output_tokens and temperature from the defaults", b.Body)
		}
	})
	t.Run("a bare OpenAI model name is inferred as openai", func(t *testing.T) {
		backend.Enqueue(reply)
		code, _, body := send(t, "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
		if b := lastBackend(t); code != 200 || b.Path != "/v1/chat/completions" || b.Model != "gpt-4o" || b.Header.Get("Authorization") != "Bearer sk-openai" {
			t.Errorf("status %d (%s); backend got %s model %q", code, body, b.Path, b.Model)
		}
	})
	t.Run("a deployment the proxy cannot call is a clear error", func(t *testing.T) {
		code, h, body := send(t, "/v1/responses", `{"model":"claude-bedrock","input":"hi"}`)
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		_ = json.Unmarshal([]byte(body), &e)
		if code != http.StatusNotImplemented || e.Error.Code != "deployment_not_supported" || h.Get("X-Should-Retry") != "false" ||
			!strings.Contains(e.Error.Message, "bedrock/anthropic.claude-3") || !strings.Contains(e.Error.Message, "SigV4") {
			t.Errorf("status %d, x-should-retry %q, body %s; want 501 deployment_not_supported naming the deployment and why", code, h.Get("X-Should-Retry"), body)
		}
	})
	t.Run("code interpreter over azure's v1 responses with an entra token", func(t *testing.T) {
		if err := local.Check(context.Background(), local.Options{}); err != nil {
			t.Skipf("local sandbox unavailable: %v", err)
		}
		before := len(azToken.Requests())
		backend.Enqueue(
			upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"print(6*7)"}`)}},
			upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("The answer is 42.")}},
		)
		code, _, body := send(t, "/v1/responses", `{"model":"gpt-azure-token","input":"6*7?","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"include":["code_interpreter_call.outputs"]}`)
		if code != 200 || !strings.Contains(body, `"code_interpreter_call"`) || !strings.Contains(body, "The answer is 42.") {
			t.Fatalf("status %d: %s", code, body)
		}
		seen := azToken.Requests()[before:]
		if len(seen) != 2 {
			t.Fatalf("azure saw %v; want the two loop iterations", seen)
		}
		for _, s := range seen {
			if s.Path != "/openai/v1/responses" || s.APIVersion != "preview" || s.Bearer != "eyJ-entra" || s.Status != 0 {
				t.Errorf("azure saw %v; want /openai/v1/responses?api-version=preview with the bearer token", s)
			}
		}
		reqs := backend.Requests()
		last := reqs[len(reqs)-1]
		var call struct {
			CallID string `json:"call_id"`
		}
		if calls := last.InputItems("function_call"); len(calls) == 1 {
			_ = json.Unmarshal(calls[0], &call)
		}
		if out, ok := last.FunctionOutput(call.CallID); !ok || !strings.Contains(out, "42") {
			t.Errorf("the model was told %q (found %v); want the code's output 42", out, ok)
		}
	})
}
