package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
	"github.com/ciproxy/ciproxy/internal/upstream/chat"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// chatAPI returns the chat seam over one deployment served by up.
func chatAPI(t *testing.T, up *upstreamtest.Server, opts chat.Options) *ChatAPI {
	t.Helper()
	d := config.Deployment{ModelName: "m", Provider: "openai", UpstreamModel: "m-up", APIBase: up.URL(), API: config.APIChatCompletions}
	return NewChatAPI(newTestClient(t, nil).Target([]config.Deployment{d}), opts)
}

func eventTypes(evs []string) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = gjson.Get(e, "type").String()
	}
	return out
}

// TestChatAPIAnswers: every flavour's answer, streamed or not, comes out as the events of a
// Responses upstream, ending with the same Response.
func TestChatAPIAnswers(t *testing.T) {
	turn := upstreamtest.Turn{Items: []upstreamtest.Item{
		upstreamtest.Reasoning("think"), upstreamtest.Text("Let me compute."),
		upstreamtest.FunctionCall("python", `{"code":"6 * 7"}`), upstreamtest.FunctionCall("lookup", `{"q":"x"}`),
	}}
	const req = `{"model":"m","input":"compute","tools":[{"type":"function","name":"python","parameters":{}},{"type":"function","name":"lookup","parameters":{}}]`
	for _, fl := range chatFlavours {
		for _, stream := range []bool{false, true} {
			t.Run(fl.name+map[bool]string{false: " json", true: " stream"}[stream], func(t *testing.T) {
				up := upstreamtest.New(t, fl.server...)
				up.Enqueue(turn)
				body := req + `,"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
				ev, err := chatAPI(t, up, fl.opts).Responses(context.Background(), []byte(body), http.Header{})
				if err != nil {
					t.Fatalf("Responses = %v", err)
				}
				evs, err := drain(t, ev)
				if err != nil {
					t.Fatalf("reading = %v", err)
				}
				types := eventTypes(evs)
				if !stream && len(evs) != 1 {
					t.Fatalf("JSON answer events = %v; want one terminal event", types)
				}
				if stream && (types[0] != "response.created" || !strings.Contains(strings.Join(types, ","), "response.function_call_arguments.delta")) {
					t.Errorf("stream events = %v", types)
				}
				last := evs[len(evs)-1]
				if gjson.Get(last, "type").String() != "response.completed" {
					t.Fatalf("last event = %s", last)
				}
				var out []string
				gjson.Get(last, "response.output").ForEach(func(_, it gjson.Result) bool {
					out = append(out, it.Get("type").String()+":"+it.Get("name").String())
					return true
				})
				want := "message:,function_call:python,function_call:lookup"
				if fl.thinking {
					want = "reasoning:," + want
				}
				if got := strings.Join(out, ","); got != want {
					t.Errorf("output = %s; want %s", got, want)
				}
				if a := gjson.Get(last, `response.output.#(name=="python").arguments`).String(); a != `{"code":"6 * 7"}` {
					t.Errorf("arguments = %q", a)
				}
				r := up.Requests()[0]
				if r.Path != "/v1/chat/completions" || r.Model != "m-up" {
					t.Errorf("upstream got %s for %s", r.Path, r.Model)
				}
			})
		}
	}
}

func TestChatAPIErrors(t *testing.T) {
	vllm := `{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}`
	openai := `{"error":{"message":"Slow down.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	tests := []struct {
		name     string
		turn     upstreamtest.Turn
		status   int
		body     string // the StatusError's body; "" when mapped (checked by message)
		message  string
		wantType string
	}{
		{"an OpenAI error keeps its bytes", upstreamtest.Turn{Error: &upstreamtest.HTTPError{Status: 429, Body: openai, Header: http.Header{"Retry-After": {"2"}}}},
			429, openai, "Slow down.", "requests"},
		{"vLLM's error is mapped into OpenAI's shape", upstreamtest.Turn{Error: &upstreamtest.HTTPError{Status: 400, Body: vllm}},
			400, "", "This model's maximum context length is 4096 tokens.", "invalid_request_error"},
		{"a plain-text 503 is mapped", upstreamtest.Turn{Error: &upstreamtest.HTTPError{Status: 503, Body: "upstream overloaded"}},
			503, "", "upstream overloaded", "server_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := upstreamtest.New(t, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
			up.Enqueue(tt.turn)
			_, err := chatAPI(t, up, chat.Options{}).Responses(context.Background(), []byte(`{"model":"m","input":"x"}`), http.Header{})
			var se *StatusError
			if !errors.As(err, &se) || se.Status != tt.status {
				t.Fatalf("Responses = %v; want a StatusError %d", err, tt.status)
			}
			if tt.body != "" && string(se.Body) != tt.body {
				t.Errorf("body = %s; want it as it came", se.Body)
			}
			e := gjson.GetBytes(se.Body, "error")
			if e.Get("message").String() != tt.message || e.Get("type").String() != tt.wantType || !e.Get("param").Exists() || !e.Get("code").Exists() {
				t.Errorf("body = %s; want OpenAI's shape with message %q and type %s", se.Body, tt.message, tt.wantType)
			}
			if tt.turn.Error.Header != nil && se.Header.Get("Retry-After") != "2" {
				t.Errorf("Retry-After lost: %v", se.Header)
			}
		})
	}

	t.Run("a redirect is malformed, and an oversized error body is replaced", func(t *testing.T) {
		for _, tc := range []struct {
			status int
			body   string
		}{{http.StatusFound, ""}, {http.StatusBadRequest, strings.Repeat("x", maxErrorBody+1)}} {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "http://127.0.0.1:1/elsewhere")
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			d := config.Deployment{ModelName: "m", Provider: "openai", UpstreamModel: "m-up", APIBase: up.URL, API: config.APIChatCompletions}
			_, err := NewChatAPI(newTestClient(t, nil).Target([]config.Deployment{d}), chat.Options{}).Responses(context.Background(), []byte(`{"model":"m","input":"x"}`), http.Header{})
			var se *StatusError
			switch {
			case tc.status < 400 && !errors.Is(err, ErrMalformed):
				t.Errorf("%d: Responses = %v; want ErrMalformed", tc.status, err)
			case tc.status >= 400 && (!errors.As(err, &se) || len(se.Body) > 1024 || !strings.Contains(string(se.Body), "error body over")):
				t.Errorf("%d: Responses = %v; want a StatusError with a short body", tc.status, err)
			}
		}
	})

	t.Run("an untranslatable field is a 400 naming it, and nothing is sent", func(t *testing.T) {
		up := upstreamtest.New(t)
		_, err := chatAPI(t, up, chat.Options{}).Responses(context.Background(), []byte(`{"model":"m","input":"x","tools":[{"type":"web_search"}]}`), http.Header{})
		var ae *apierror.Error
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != "tools[0].type" || !errors.Is(err, chat.ErrUnsupported) {
			t.Errorf("Responses = %v; want a 400 naming tools[0].type", err)
		}
		if n := len(up.Requests()); n != 0 {
			t.Errorf("upstream got %d requests", n)
		}
	})

	for _, fl := range chatFlavours {
		t.Run(fl.name+" an error chunk ends the stream as a Responses upstream fails", func(t *testing.T) {
			up := upstreamtest.New(t, fl.server...)
			up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("partial")}, Fail: &upstreamtest.Failure{After: 1, Code: "server_error", Message: "boom"}})
			ev, err := chatAPI(t, up, chat.Options{}).Responses(context.Background(), []byte(`{"model":"m","input":"x","stream":true}`), http.Header{})
			if err != nil {
				t.Fatal(err)
			}
			evs, err := drain(t, ev)
			types := eventTypes(evs)
			if fl.name == "llama.cpp" {
				// llama.cpp's "error:" line is not SSE: the stream just ends, cut.
				if !errors.Is(err, chat.ErrStreamCut) {
					t.Errorf("reading = %v after %v; want chat.ErrStreamCut", err, types)
				}
				return
			}
			n := len(types)
			if err != nil || n < 2 || types[n-2] != "error" || types[n-1] != "response.failed" {
				t.Fatalf("events = %v, %v; want the error event and response.failed", types, err)
			}
			if m := gjson.Get(evs[n-2], "error.message").String(); m != "boom" {
				t.Errorf("error event = %s", evs[n-2])
			}
		})
	}

	for _, cut := range []int{0, 25} {
		t.Run(fmt.Sprintf("a JSON answer cut after %d bytes ended early", cut), func(t *testing.T) {
			up := upstreamtest.New(t, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
			up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hello there")}, Cut: true, CutAfter: cut})
			_, err := chatAPI(t, up, chat.Options{}).Responses(context.Background(), []byte(`{"model":"m","input":"x"}`), http.Header{})
			var ae *apierror.Error
			if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != "upstream_error" || ae.Message != "The upstream's response ended early." {
				t.Errorf("Responses = %v; want 502 upstream_error, ended early", err)
			}
		})
	}

	t.Run("a stream cut before finish_reason is an error", func(t *testing.T) {
		up := upstreamtest.New(t, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
		up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hello there")}, Cut: true, CutAfter: 2})
		ev, err := chatAPI(t, up, chat.Options{}).Responses(context.Background(), []byte(`{"model":"m","input":"x","stream":true}`), http.Header{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := drain(t, ev); err == nil {
			t.Error("a cut stream read to its end without an error")
		}
	})
}

// TestChatAPITooDeep: a chunk or a JSON answer nesting deeper than jsondepth.Max is malformed,
// never handed to gjson's recursive validator.
func TestChatAPITooDeep(t *testing.T) {
	deep := strings.Repeat("[", jsondepth.Max+1) + strings.Repeat("]", jsondepth.Max+1)
	for _, tt := range []struct {
		name, ct, body string
		stream         bool
	}{
		{"a chunk", "text/event-stream", "data: {\"choices\":" + deep + "}\n\n", true},
		{"a JSON answer", "application/json", `{"choices":` + deep + `}`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", tt.ct)
				_, _ = io.WriteString(w, tt.body)
			})
			d := config.Deployment{ModelName: "m", UpstreamModel: "m-up", APIBase: up.URL + "/v1", API: config.APIChatCompletions}
			api := NewChatAPI(newTestClient(t, nil).Target([]config.Deployment{d}), chat.Options{})
			ev, err := api.Responses(context.Background(), []byte(`{"model":"m","input":"x","stream":`+map[bool]string{false: "false", true: "true"}[tt.stream]+`}`), http.Header{})
			if err == nil {
				_, err = drain(t, ev)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("err = %v; want ErrMalformed", err)
			}
		})
	}
}

func TestChatOptionsFor(t *testing.T) {
	tests := []struct {
		provider, base string
		want           chat.Options
	}{
		{"openai", "https://api.openai.com/v1", chat.Options{MaxCompletionTokens: true}},
		{"openai", "http://llama:8080/v1", chat.Options{ReasoningField: "reasoning_content"}},
		{"", "http://sglang:30000/v1", chat.Options{ReasoningField: "reasoning_content"}},
		{"azure", "https://r.openai.azure.com", chat.Options{MaxCompletionTokens: true}},
		{"deepseek", "https://api.deepseek.com/v1", chat.Options{ReasoningField: "reasoning_content"}},
		{"hosted_vllm", "http://vllm:8000/v1", chat.Options{ReasoningField: "reasoning_content"}},
		{"openrouter", "https://openrouter.ai/api/v1", chat.Options{ReasoningField: "reasoning"}},
		{"ollama", "http://localhost:11434/v1", chat.Options{ReasoningField: "reasoning"}},
		{"mistral", "https://api.mistral.ai/v1", chat.Options{}},
		{"gemini", "https://generativelanguage.googleapis.com/v1beta/openai", chat.Options{}},
		{"anthropic", "https://api.anthropic.com/v1", chat.Options{}},
	}
	for _, tt := range tests {
		got := ChatOptionsFor(config.Deployment{Provider: tt.provider, APIBase: tt.base})
		if got.ReasoningField != tt.want.ReasoningField || got.MaxCompletionTokens != tt.want.MaxCompletionTokens || got.NewID != nil {
			t.Errorf("ChatOptionsFor(%s at %s) = %+v; want %+v", tt.provider, tt.base, got, tt.want)
		}
	}
}

func TestSameRequest(t *testing.T) {
	chat := func(provider string) config.Deployment {
		return config.Deployment{Provider: provider, APIBase: "http://" + provider, API: config.APIChatCompletions}
	}
	native := config.Deployment{Provider: "openai", APIBase: "https://api.openai.com/v1", API: config.APIResponses}
	tests := []struct {
		name string
		deps []config.Deployment
		want []string
	}{
		{"responses first keeps the native ones", []config.Deployment{native, chat("deepseek"), native}, []string{"openai", "openai"}},
		{"chat first keeps chat with the same options", []config.Deployment{chat("deepseek"), native, chat("hosted_vllm"), chat("mistral")}, []string{"deepseek", "hosted_vllm"}},
		{"none", nil, nil},
	}
	for _, tt := range tests {
		var got []string
		for _, d := range SameRequest(tt.deps) {
			got = append(got, d.Provider)
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("%s: SameRequest = %v; want %v", tt.name, got, tt.want)
		}
	}
}

// shape returns the keys of a JSON object, in order, each with its value's kind; a nested
// object's keys follow its own as "key.sub".
func shape(v gjson.Result, prefix string) []string {
	var out []string
	v.ForEach(func(k, x gjson.Result) bool {
		kind := x.Type.String()
		switch {
		case x.IsObject():
			kind = "object"
		case x.IsArray():
			kind = "array"
		case x.Type == gjson.Number && x.Raw != strconv.FormatInt(x.Int(), 10):
			kind = "float"
		}
		out = append(out, prefix+k.Str+":"+kind)
		if x.IsObject() && k.Str != "metadata" {
			out = append(out, shape(x, prefix+k.Str+".")...)
		}
		return true
	})
	return out
}

// TestChatResponseShape: a Response translated from a chat completion has the keys of a native
// one, in the same order and of the same types (completed_at included), JSON and in the streamed
// response.completed, and so do its output items.
func TestChatResponseShape(t *testing.T) {
	turn := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hi"), upstreamtest.FunctionCall("lookup", `{"q":"x"}`)},
		Usage: &upstreamtest.Usage{InputTokens: 3, OutputTokens: 4}}
	const req = `{"model":"m","input":"x","tools":[{"type":"function","name":"lookup","parameters":{}}]`
	final := func(t *testing.T, ev ResponseEvents, err error) gjson.Result {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		evs, err := drain(t, ev)
		if err != nil {
			t.Fatal(err)
		}
		last := gjson.Parse(evs[len(evs)-1])
		if last.Get("type").Str != "response.completed" {
			t.Fatalf("last event %s", last.Raw)
		}
		return last.Get("response")
	}
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			up := upstreamtest.New(t)
			up.Enqueue(turn, turn)
			body := []byte(req + `,"stream":` + strconv.FormatBool(stream) + `}`)
			d := config.Deployment{ModelName: "m", Provider: "openai", UpstreamModel: "m-up", APIBase: up.URL()}
			nev, err := newTestClient(t, nil).Target([]config.Deployment{d}).Responses(context.Background(), body, http.Header{})
			native := final(t, nev, err)
			tev, err := chatAPI(t, up, chat.Options{}).Responses(context.Background(), body, http.Header{})
			translated := final(t, tev, err)
			if n, tr := shape(native, ""), shape(translated, ""); !slices.Equal(n, tr) {
				t.Errorf("Response shapes differ:\nnative:     %v\ntranslated: %v", n, tr)
			}
			for i := range 2 {
				if n, tr := shape(native.Get("output."+strconv.Itoa(i)), ""), shape(translated.Get("output."+strconv.Itoa(i)), ""); !slices.Equal(n, tr) {
					t.Errorf("output[%d] shapes differ:\nnative:     %v\ntranslated: %v", i, n, tr)
				}
			}
			if c := translated.Get("completed_at"); c.Type != gjson.Number || c.Int() < translated.Get("created_at").Int() {
				t.Errorf("completed_at = %s; want the integer time it completed", c.Raw)
			}
		})
	}
}

// chunk is one data line of a chat stream with one choice: delta, finish_reason (raw JSON, ""
// for none) and more top-level members (raw, "" for none).
func chunk(delta, finish, more string) string {
	var b strings.Builder
	b.WriteString(`data: {"object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`)
	b.WriteString(delta)
	if finish != "" {
		b.WriteString(`,"logprobs":null,"finish_reason":`)
		b.WriteString(finish)
	}
	b.WriteString("}]")
	if more != "" {
		b.WriteString(",")
		b.WriteString(more)
	}
	b.WriteString("}\n\n")
	return b.String()
}

func apiErr(err error) *apierror.Error {
	var ae *apierror.Error
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

// chatFlavours are the servers the seam is run against (chat's round trips use the same), with the options a deployment of
// each would get.
var chatFlavours = []struct {
	name     string
	server   []upstreamtest.Option
	opts     chat.Options
	thinking bool // the server sends reasoning text
}{
	{"OpenAI", nil, chat.Options{MaxCompletionTokens: true}, false},
	{"vLLM", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM)}, chat.Options{ReasoningField: "reasoning_content"}, true},
	{"vLLM 0.10", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM), upstreamtest.WithChatReasoningField("reasoning")}, chat.Options{ReasoningField: "reasoning"}, true},
	{"llama.cpp", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatLlamaCpp)}, chat.Options{ReasoningField: "reasoning_content"}, true},
	{"OpenAI with the SDK's nulls", []upstreamtest.Option{upstreamtest.WithChatNulls()}, chat.Options{MaxCompletionTokens: true}, false},
	{"vLLM with the SDK's nulls", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM), upstreamtest.WithChatNulls()}, chat.Options{ReasoningField: "reasoning_content"}, true},
}
