package upstream

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// azureDeployment is an Azure deployment of az, as config parses "azure/<name>".
func azureDeployment(az *upstreamtest.Azure, name, version, key string) config.Deployment {
	return config.Deployment{ModelName: "gpt-azure", Provider: "azure", UpstreamModel: name, APIBase: az.URL(),
		APIVersion: version, APIKey: key, KeyHeader: config.KeyHeaderAzure, API: config.APIResponses, Line: 7}
}

func TestAzurePassThrough(t *testing.T) {
	backend := upstreamtest.New(t)
	az := upstreamtest.NewAzure(t, backend, upstreamtest.WithAzureKey("az-key"), upstreamtest.WithDeployments("gpt4o-eu"))
	c := newTestClient(t, nil)
	d := azureDeployment(az, "gpt4o-eu", "2024-10-21", "az-key")
	d.Params = params("temperature", "0.3", "max_tokens", "77")
	srv := proxyServer(t, c, []config.Deployment{d})

	tests := []struct {
		name, path, body     string
		wantPath, wantVerion string
		wantBackend          string
		check                func(t *testing.T, r upstreamtest.Request)
	}{
		{"chat completions", "/v1/chat/completions", `{"model":"gpt-azure","messages":[{"role":"user","content":"hi"}]}`,
			"/openai/deployments/gpt4o-eu/chat/completions", "2024-10-21", "/v1/chat/completions",
			func(t *testing.T, r upstreamtest.Request) {
				if string(r.Fields["temperature"]) != "0.3" || string(r.Fields["max_tokens"]) != "77" {
					t.Errorf("defaults not applied: %s", r.Body)
				}
			}},
		{"responses, streamed", "/v1/responses", `{"model":"gpt-azure","input":"hi","stream":true,"temperature":1}`,
			"/openai/responses", "2024-10-21", "/v1/responses",
			func(t *testing.T, r upstreamtest.Request) {
				if string(r.Fields["temperature"]) != "1" || string(r.Fields["max_output_tokens"]) != "77" || r.Fields["max_tokens"] != nil {
					t.Errorf("want the client's temperature and max_output_tokens from max_tokens: %s", r.Body)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(az.Requests())
			backend.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hello from azure")}})
			req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer client-key")
			resp, err := plainClient(t).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "hello from azure") {
				t.Fatalf("status %d, body %s; want 200 with the model's text", resp.StatusCode, body)
			}
			seen := az.Requests()[before:]
			if len(seen) != 1 {
				t.Fatalf("azure saw %v; want one request", seen)
			}
			got := seen[0]
			if got.Path != tc.wantPath || got.APIVersion != tc.wantVerion || got.APIKey != "az-key" || got.Bearer != "" {
				t.Errorf("azure saw %v; want %s?api-version=%s with the api-key header only", got, tc.wantPath, tc.wantVerion)
			}
			reqs := backend.Requests()
			r := reqs[len(reqs)-1]
			if r.Path != tc.wantBackend || r.Model != "gpt4o-eu" {
				t.Errorf("backend got %s for model %q; want %s for the deployment", r.Path, r.Model, tc.wantBackend)
			}
			tc.check(t, r)
		})
	}
}

// TestAzurePost is the intercept engine's call (Target.Post to /responses) on Azure's v1 API with
// an Entra ID token.
func TestAzurePost(t *testing.T) {
	backend := upstreamtest.New(t)
	az := upstreamtest.NewAzure(t, backend, upstreamtest.WithEntraToken("eyJ-token"), upstreamtest.WithDeployments("o3"))
	c := newTestClient(t, nil)
	d := azureDeployment(az, "o3", "preview", "eyJ-token")
	d.KeyHeader = "" // azure_ad_token: a bearer token
	d.Params = params("reasoning_effort", `"high"`, "seed", "1")
	backend.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"1+1"}`)}})

	resp, got, err := c.Target([]config.Deployment{d}).Post(context.Background(), "/responses",
		[]byte(`{"model":"gpt-azure","input":"add","tools":[{"type":"function","name":"python","parameters":{"type":"object"}}]}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || got.UpstreamModel != "o3" || !strings.Contains(string(body), `"function_call"`) {
		t.Fatalf("status %d from %s: %s", resp.StatusCode, got.Name(), body)
	}
	seen := az.Requests()
	if len(seen) != 1 || seen[0].Path != "/openai/v1/responses" || seen[0].APIVersion != "preview" || seen[0].Bearer != "eyJ-token" || seen[0].APIKey != "" {
		t.Errorf("azure saw %v; want POST /openai/v1/responses?api-version=preview with the bearer token", seen)
	}
	r := backend.Requests()[0]
	var reasoning struct{ Effort string }
	_ = json.Unmarshal(r.Reasoning, &reasoning)
	if reasoning.Effort != "high" || r.Fields["seed"] != nil {
		t.Errorf("backend body %s; want reasoning.effort from the default and no seed (Responses has none)", r.Body)
	}
}

// TestAzureErrorsPassThrough: what Azure refuses reaches the client as Azure said it.
func TestAzureErrorsPassThrough(t *testing.T) {
	backend := upstreamtest.New(t)
	az := upstreamtest.NewAzure(t, backend, upstreamtest.WithAzureKey("right"), upstreamtest.WithDeployments("dep"))
	c := newTestClient(t, nil)
	for _, tc := range []struct {
		name string
		d    config.Deployment
		want int
	}{
		{"wrong key", azureDeployment(az, "dep", "2024-10-21", "wrong"), http.StatusUnauthorized},
		{"unknown deployment", azureDeployment(az, "nope", "2024-10-21", "right"), http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _, err := c.Target([]config.Deployment{tc.d}).Post(context.Background(), "/chat/completions", []byte(`{"model":"x","messages":[]}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want || !strings.Contains(string(body), `"error"`) {
				t.Errorf("status %d, body %s; want %d with Azure's error", resp.StatusCode, body, tc.want)
			}
		})
	}
	if n := len(backend.Requests()); n != 0 {
		t.Errorf("the backend got %d requests; want none", n)
	}
}
