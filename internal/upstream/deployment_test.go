package upstream

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
)

func params(kv ...string) []config.Param {
	var out []config.Param
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, config.Param{Name: kv[i], Value: json.RawMessage(kv[i+1])})
	}
	return out
}

func TestDeploymentBody(t *testing.T) {
	defaults := config.Deployment{UpstreamModel: "up", Params: params(
		"temperature", "0.2", "max_tokens", "1024", "seed", "42", "stop", `["</a>"]`,
		"reasoning_effort", `"low"`, "user", `"ops"`, "metadata", `{"team":"a"}`, "top_k", "20",
	), ExtraBody: params("chat_template_kwargs", `{"enable_thinking":false}`)}
	tests := []struct {
		name string
		d    config.Deployment
		path string
		in   string
		want string
	}{
		{"chat takes every default the client did not set", defaults, "/chat/completions",
			`{"model":"alias","messages":[]}`,
			`{"model":"up","messages":[],"temperature":0.2,"max_tokens":1024,"seed":42,"stop":["</a>"],"reasoning_effort":"low","user":"ops","metadata":{"team":"a"},"top_k":20,"chat_template_kwargs":{"enable_thinking":false}}`},
		{"the client's own values win, whole", defaults, "/chat/completions",
			`{"model":"alias","temperature":1,"metadata":{"x":1},"seed":null,"chat_template_kwargs":{}}`,
			`{"model":"up","temperature":1,"metadata":{"x":1},"seed":null,"chat_template_kwargs":{},"max_tokens":1024,"stop":["</a>"],"reasoning_effort":"low","user":"ops","top_k":20}`},
		{"max_completion_tokens of the client stands for max_tokens", defaults, "/chat/completions",
			`{"model":"alias","max_completion_tokens":5,"temperature":0}`,
			`{"model":"up","max_completion_tokens":5,"temperature":0,"seed":42,"stop":["</a>"],"reasoning_effort":"low","user":"ops","metadata":{"team":"a"},"top_k":20,"chat_template_kwargs":{"enable_thinking":false}}`},
		{"responses takes what it has, under its names", defaults, "/responses",
			`{"model":"alias","input":"hi"}`,
			`{"model":"up","input":"hi","temperature":0.2,"max_output_tokens":1024,"reasoning":{"effort":"low"},"user":"ops","metadata":{"team":"a"},"chat_template_kwargs":{"enable_thinking":false}}`},
		{"responses: a reasoning object without effort gets it", defaults, "/responses",
			`{"model":"alias","reasoning":{"summary":"auto"},"max_output_tokens":9}`,
			`{"model":"up","reasoning":{"summary":"auto","effort":"low"},"max_output_tokens":9,"temperature":0.2,"user":"ops","metadata":{"team":"a"},"chat_template_kwargs":{"enable_thinking":false}}`},
		{"responses: the client's effort wins", config.Deployment{UpstreamModel: "up", Params: params("reasoning_effort", `"high"`, "verbosity", `"low"`)}, "/responses",
			`{"model":"alias","reasoning":{"effort":"minimal"},"text":{"format":{"type":"text"}}}`,
			`{"model":"up","reasoning":{"effort":"minimal"},"text":{"format":{"type":"text"},"verbosity":"low"}}`},
		{"completions takes its sampling params", defaults, "/v1/../completions",
			`{"model":"alias","prompt":"x"}`,
			`{"model":"up","prompt":"x","temperature":0.2,"max_tokens":1024,"seed":42,"stop":["</a>"],"user":"ops","top_k":20,"chat_template_kwargs":{"enable_thinking":false}}`},
		{"embeddings only user", defaults, "/embeddings",
			`{"model":"alias","input":"x"}`,
			`{"model":"up","input":"x","user":"ops","chat_template_kwargs":{"enable_thinking":false}}`},
		{"an empty object", defaults, "/embeddings", ` { } `, ` { "user":"ops","chat_template_kwargs":{"enable_thinking":false}} `},
		{"other paths get only the model", defaults, "/responses/resp_1/cancel", `{"model":"alias"}`, `{"model":"up"}`},
		{"a body that is not an object is sent as it is", defaults, "/chat/completions", `[1]`, `[1]`},
		{"no defaults: only the model", config.Deployment{UpstreamModel: "up"}, "/chat/completions", `{"model":"a","x":1}`, `{"model":"up","x":1}`},
		{"an extra_body key is escaped", config.Deployment{UpstreamModel: "up", ExtraBody: params("we\"ird\n", "1")}, "/chat/completions", `{"model":"a"}`, `{"model":"up","we\"ird\u000a":1}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in)
			orig := bytes.Clone(in)
			got := DeploymentBody(tc.d, tc.path, in)
			if string(got) != tc.want {
				t.Errorf("DeploymentBody =\n%s\nwant\n%s", got, tc.want)
			}
			if !bytes.Equal(in, orig) {
				t.Errorf("the client's body was modified: %s", in)
			}
			if json.Valid(orig) && !json.Valid(got) {
				t.Errorf("the result is not JSON: %s", got)
			}
		})
	}
}

func TestEndpointURL(t *testing.T) {
	azure := func(base, version string) config.Deployment {
		return config.Deployment{Provider: "azure", UpstreamModel: "my gpt", APIBase: base, APIVersion: version}
	}
	const res = "https://contoso.openai.azure.com"
	tests := []struct {
		name  string
		d     config.Deployment
		path  string
		query string
		want  string
	}{
		{"openai joins api_base", config.Deployment{Provider: "openai", APIBase: "https://api.openai.com/v1"}, "/chat/completions", "a=1", "https://api.openai.com/v1/chat/completions?a=1"},
		{"azure chat goes to the deployment", azure(res, "2024-10-21"), "/chat/completions", "", res + "/openai/deployments/my%20gpt/chat/completions?api-version=2024-10-21"},
		{"azure embeddings and completions likewise", azure(res+"/", "2024-10-21"), "/embeddings", "", res + "/openai/deployments/my%20gpt/embeddings?api-version=2024-10-21"},
		{"azure legacy completions", azure(res, "2024-10-21"), "/completions", "", res + "/openai/deployments/my%20gpt/completions?api-version=2024-10-21"},
		{"azure chat default version", azure(res, ""), "/chat/completions", "", res + "/openai/deployments/my%20gpt/chat/completions?api-version=2025-02-01-preview"},
		{"azure responses with a dated version", azure(res, "2025-04-01-preview"), "/responses", "", res + "/openai/responses?api-version=2025-04-01-preview"},
		{"azure responses default: the v1 API, preview", azure(res, ""), "/responses", "", res + "/openai/v1/responses?api-version=preview"},
		{"azure preview: every route on v1", azure(res, "preview"), "/chat/completions", "", res + "/openai/v1/chat/completions?api-version=preview"},
		{"azure latest", azure(res, "latest"), "/responses/resp_1/input_items", "limit=2", res + "/openai/v1/responses/resp_1/input_items?api-version=latest&limit=2"},
		{"azure v1: no api-version", azure(res, "v1"), "/responses", "", res + "/openai/v1/responses"},
		{"azure api_base naming the v1 API", azure(res+"/openai/v1/", ""), "/chat/completions", "", res + "/openai/v1/chat/completions"},
		{"azure api_base ending in /openai", azure(res+"/openai", "2024-10-21"), "/responses/resp_1", "", res + "/openai/responses/resp_1?api-version=2024-10-21"},
		{"the client cannot choose the api-version", azure(res, "2024-10-21"), "/chat/completions", "api-version=2023-01-01&x=y", res + "/openai/deployments/my%20gpt/chat/completions?api-version=2024-10-21&x=y"},
		{"an api-version in api_base is kept", azure(res+"?api-version=2024-06-01", "2024-10-21"), "/chat/completions", "", res + "/openai/deployments/my%20gpt/chat/completions?api-version=2024-06-01"},
		{"a deployment name is one segment", config.Deployment{Provider: "azure", UpstreamModel: "a/b?c", APIBase: res, APIVersion: "2024-10-21"}, "/chat/completions", "", res + "/openai/deployments/a%2Fb%3Fc/chat/completions?api-version=2024-10-21"},
		{"azure paths cannot climb", azure(res, "2024-10-21"), "/../../x", "", res + "/openai/x?api-version=2024-10-21"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := endpointURL(tc.d, tc.path, tc.query)
			if err != nil {
				t.Fatal(err)
			}
			if u.String() != tc.want {
				t.Errorf("endpointURL = %s\nwant          %s", u, tc.want)
			}
		})
	}
}

func TestDeploymentHeaders(t *testing.T) {
	tests := []struct {
		name string
		d    config.Deployment
		in   http.Header
		want http.Header
	}{
		{"bearer key and extra headers", config.Deployment{APIKey: "sk", ExtraHeaders: []config.Header{{Name: "X-Team", Value: "a"}, {Name: "OpenAI-Organization", Value: "org"}}},
			http.Header{}, http.Header{"Authorization": {"Bearer sk"}, "X-Team": {"a"}, "Openai-Organization": {"org"}}},
		{"the client's header wins over an extra header", config.Deployment{ExtraHeaders: []config.Header{{Name: "X-Team", Value: "a"}}},
			http.Header{"X-Team": {"client"}}, http.Header{"X-Team": {"client"}}},
		{"azure key as api-key", config.Deployment{APIKey: "k", KeyHeader: config.KeyHeaderAzure},
			http.Header{}, http.Header{"Api-Key": {"k"}}},
		{"an extra Authorization header stands when there is no key", config.Deployment{ExtraHeaders: []config.Header{{Name: "Authorization", Value: "Basic x"}}},
			http.Header{}, http.Header{"Authorization": {"Basic x"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.in.Clone()
			setDeploymentHeaders(h, tc.d)
			if len(h) != len(tc.want) {
				t.Errorf("headers = %v; want %v", h, tc.want)
			}
			for k, v := range tc.want {
				if h.Get(k) != v[0] {
					t.Errorf("%s = %q; want %q (all: %v)", k, h.Get(k), v[0], h)
				}
			}
		})
	}
}
