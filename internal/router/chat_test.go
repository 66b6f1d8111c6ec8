package router

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/upstream"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// chatProxy is a router with the real engine in front of one deployment that speaks only Chat
// Completions, served by a scripted vLLM.
func chatProxy(t *testing.T) (*proxy, *upstreamtest.Server) {
	t.Helper()
	up := upstreamtest.New(t, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
	cfg := testConfig(up.URL(), func(c *config.Config) {
		c.Models[0].Provider, c.Models[0].API = "hosted_vllm", config.APIChatCompletions
	})
	p := newProxy(t, cfg, func(o *Options) {
		o.Interceptor = intercept.New(intercept.Options{Store: storetest.NewMemResponses(nil)})
	})
	return p, up
}

func TestChatDeploymentResponses(t *testing.T) {
	p, up := chatProxy(t)
	auth := []string{"Authorization", "Bearer alice"}

	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning("think"), upstreamtest.Text("Hello.")}})
	status, _, first := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","instructions":"Be brief.","input":"hi"}`, auth...)
	id := gjson.GetBytes(first, "id").String()
	if status != http.StatusOK || !strings.HasPrefix(id, "resp_") || gjson.GetBytes(first, "output.1.content.0.text").String() != "Hello." ||
		gjson.GetBytes(first, "model").String() != "gpt-test" {
		t.Fatalf("POST /v1/responses = %d %s", status, first)
	}
	if r := up.Requests()[0]; r.Path != "/v1/chat/completions" || r.Model != "gpt-test-upstream" {
		t.Fatalf("upstream got %s for %s", r.Path, r.Model)
	}

	t.Run("previous_response_id continues the kept conversation", func(t *testing.T) {
		up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Again.")}})
		status, _, got := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"more","stream":true,"previous_response_id":"`+id+`"}`, auth...)
		if status != http.StatusOK || !strings.Contains(string(got), "event: response.completed") {
			t.Fatalf("continued = %d %s", status, got)
		}
		reqs := up.Requests()
		var seen []string
		for _, it := range reqs[len(reqs)-1].History {
			seen = append(seen, gjson.GetBytes(it, "type").String()+":"+gjson.GetBytes(it, "role").String())
		}
		// Instructions are not carried over, as OpenAI does; the reasoning goes back with the
		// assistant's turn (vLLM takes reasoning_content).
		if want := "message:user,reasoning:,message:assistant,message:user"; strings.Join(seen, ",") != want {
			t.Errorf("upstream saw %v; want %s", seen, want)
		}
	})

	t.Run("an unknown or another caller's previous_response_id is not found", func(t *testing.T) {
		before := len(up.Requests())
		for _, caller := range []string{"Bearer mallory", "Bearer alice"} {
			prev := id
			if caller == "Bearer alice" {
				prev = "resp_unknown"
			}
			status, _, got := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"x","previous_response_id":"`+prev+`"}`, "Authorization", caller)
			if _, _, param, code := decodeError(t, got); status != 400 || param != "previous_response_id" || code != "previous_response_not_found" {
				t.Errorf("%s with %s = %d %s", caller, prev, status, got)
			}
		}
		if len(up.Requests()) != before {
			t.Error("a request went upstream")
		}
	})

	t.Run("GET, input_items and DELETE answer for the minted id", func(t *testing.T) {
		status, _, got := p.do(t, http.MethodGet, "/v1/responses/"+id, "", auth...)
		if status != http.StatusOK || !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(first)) {
			t.Errorf("GET = %d %s; want the response as it was returned", status, got)
		}
		status, _, got = p.do(t, http.MethodGet, "/v1/responses/"+id+"/input_items", "", auth...)
		if status != http.StatusOK || gjson.GetBytes(got, "object").Str != "list" || gjson.GetBytes(got, "data.0.content.0.text").Str != "hi" ||
			gjson.GetBytes(got, "data.0.content.0.type").Str != "input_text" || gjson.GetBytes(got, "data.#").Int() != 1 {
			t.Errorf("input_items = %d %s", status, got)
		}
		if status, _, _ := p.do(t, http.MethodGet, "/v1/responses/"+id, "", "Authorization", "Bearer mallory"); status != http.StatusNotFound {
			t.Errorf("another caller's GET = %d; want 404", status)
		}
		if status, _, got := p.do(t, http.MethodDelete, "/v1/responses/"+id, "", auth...); status != http.StatusOK || !gjson.GetBytes(got, "deleted").Bool() {
			t.Errorf("DELETE = %d %s", status, got)
		}
		if status, _, _ := p.do(t, http.MethodGet, "/v1/responses/"+id, "", auth...); status != http.StatusNotFound {
			t.Errorf("GET after DELETE = %d; want 404", status)
		}
	})

	t.Run("an id the proxy never minted is not asked upstream", func(t *testing.T) {
		before := len(up.Requests())
		for _, path := range []string{"/v1/responses/resp_elsewhere", "/v1/responses/resp_elsewhere/input_items"} {
			if status, _, got := p.do(t, http.MethodGet, path, "", auth...); status != http.StatusNotFound {
				t.Errorf("GET %s = %d %s; want 404", path, status, got)
			}
		}
		if len(up.Requests()) != before {
			t.Error("a request went upstream")
		}
	})

	t.Run("code_interpreter without interception is a 400 naming the tool", func(t *testing.T) {
		status, _, got := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, auth...)
		if _, typ, param, _ := decodeError(t, got); status != 400 || typ != "invalid_request_error" || param != "tools[0].type" {
			t.Errorf("answer = %d %s", status, got)
		}
	})

	t.Run("an upstream error keeps its status, in OpenAI's shape", func(t *testing.T) {
		up.Enqueue(upstreamtest.Turn{Error: &upstreamtest.HTTPError{Status: 400,
			Body: `{"object":"error","message":"maximum context length exceeded","type":"BadRequestError","param":null,"code":400}`}})
		status, _, got := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"x"}`, auth...)
		if msg, typ, _, _ := decodeError(t, got); status != 400 || typ != "invalid_request_error" || msg != "maximum context length exceeded" {
			t.Errorf("answer = %d %s", status, got)
		}
	})
}

// TestChatCompletionsPassThrough: /v1/chat/completions is byte passthrough whatever API the
// deployment speaks for /v1/responses.
func TestChatCompletionsPassThrough(t *testing.T) {
	const answer = `{"id":"chatcmpl-1", "object":"chat.completion","choices":[]}`
	for _, api := range []config.API{config.APIChatCompletions, config.APIResponses} {
		t.Run(string(api), func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, answer)
			})
			cfg := testConfig(up.URL+"/v1", func(c *config.Config) { c.Models[0].API = api })
			p := newProxy(t, cfg, func(o *Options) {
				o.Interceptor = intercept.New(intercept.Options{Store: storetest.NewMemResponses(nil)})
			})
			body := `{"model":"gpt-test", "messages":[{"role":"user","content":"hi"}],"top_k":3}`
			status, _, got := p.do(t, http.MethodPost, "/v1/chat/completions", body)
			if status != http.StatusOK || string(got) != answer {
				t.Errorf("answer = %d %s; want the upstream's bytes", status, got)
			}
			r := up.requests()[0]
			if want := strings.Replace(body, `"gpt-test"`, `"gpt-test-upstream"`, 1); r.Path != "/v1/chat/completions" || string(r.Body) != want {
				t.Errorf("upstream got %s %s; want %s", r.Path, r.Body, want)
			}
		})
	}
}

// TestResponsesFailoverStaysOnOneAPI: a model with a Responses and a Chat Completions deployment
// sends each request to deployments of the first one's API only.
func TestResponsesFailoverStaysOnOneAPI(t *testing.T) {
	down := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	chat := upstreamtest.New(t)
	chat.Script(func(upstreamtest.Request) upstreamtest.Turn {
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("From chat.")}}
	})
	cfg := testConfig(down.URL+"/v1", func(c *config.Config) {
		c.Models[0].API = config.APIResponses
		d := deployment("gpt-test", chat.URL())
		d.API = config.APIChatCompletions
		c.Models = append(c.Models, d)
	})
	p := newProxy(t, cfg, func(o *Options) {
		o.Interceptor = intercept.New(intercept.Options{Store: storetest.NewMemResponses(nil)})
		o.Balancer = upstream.NewBalancer()
	})
	native, translated := 0, 0
	for range 4 {
		status, _, got := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"x"}`)
		switch status {
		case http.StatusServiceUnavailable:
			native++
		case http.StatusOK:
			translated++
			if gjson.GetBytes(got, "output.0.content.0.text").String() != "From chat." {
				t.Errorf("translated answer = %s", got)
			}
		default:
			t.Errorf("answer = %d %s", status, got)
		}
	}
	if native == 0 || translated == 0 {
		t.Errorf("native answers %d, translated %d; want both (round robin, no failover across APIs)", native, translated)
	}
	for _, r := range chat.Requests() {
		if r.Path != "/v1/chat/completions" {
			t.Errorf("the chat deployment got %s", r.Path)
		}
	}
	for _, r := range down.requests() {
		if r.Path != "/v1/responses" {
			t.Errorf("the Responses deployment got %s", r.Path)
		}
	}
}

// TestContinueWithoutCodeInterpreter: a conversation the interceptor served (its id minted by
// the proxy) continues by previous_response_id without the code_interpreter tool, as at OpenAI:
// the upstream is sent the id of its own last response, never the proxy's.
func TestContinueWithoutCodeInterpreter(t *testing.T) {
	up := upstreamtest.New(t)
	cfg := testConfig(up.URL(), func(c *config.Config) {
		c.Interception.Enabled, c.Callbacks = true, []string{"code_interpreter_interception"}
	})
	p := newProxy(t, cfg, func(o *Options) {
		o.Interceptor = intercept.New(intercept.Options{Store: storetest.NewMemResponses(nil)})
	})
	auth := []string{"Authorization", "Bearer alice"}

	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("No code needed.")}})
	status, _, first := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"hi","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, auth...)
	id := gjson.GetBytes(first, "id").String()
	if status != http.StatusOK || id == "" {
		t.Fatalf("intercepted request = %d %s", status, first)
	}
	for _, stream := range []string{"false", "true"} {
		up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Summed up.")}})
		status, _, got := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"sum up","stream":`+stream+`,"previous_response_id":"`+id+`"}`, auth...)
		if status != http.StatusOK || !strings.Contains(string(got), "Summed up.") {
			t.Errorf("continued without the tool (stream %s) = %d %s", stream, status, got)
		}
		reqs := up.Requests()
		if prev := reqs[len(reqs)-1].PreviousResponseID; prev == id || prev == "" {
			t.Errorf("upstream was sent previous_response_id %q; the proxy's id is %s", prev, id)
		}
	}
}
