package upstreamtest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

func client(s *upstreamtest.Server) *openai.Client {
	c := openai.NewClient(
		option.WithBaseURL(s.URL()+"/"),
		option.WithAPIKey("sk-test"),
		option.WithMaxRetries(0),
	)
	return &c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

var pythonTool = responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
	Name:       "python",
	Parameters: map[string]any{"type": "object", "properties": map[string]any{"code": map[string]any{"type": "string"}}},
}}

// post sends a raw body and returns status and body.
func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return resp.StatusCode, b
}

// topKeys returns the keys of a JSON object in wire order.
func topKeys(t *testing.T, raw []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func TestJSONResponseDecodesWithSDK(t *testing.T) {
	s := upstreamtest.New(t)
	s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{
		upstreamtest.Text("Hello <world> & you"),
		upstreamtest.FunctionCall("python", `{"code":"print(\"é\")\n"}`),
	}, Usage: &upstreamtest.Usage{InputTokens: 10, CachedTokens: 2, OutputTokens: 5, ReasoningTokens: 1}})
	c := client(s)
	resp, err := c.Responses.New(ctx(t), responses.ResponseNewParams{
		Model: "gpt-4.1",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		Tools: []responses.ToolUnionParam{pythonTool},
	})
	if err != nil {
		t.Fatalf("Responses.New: %v", err)
	}
	if !strings.HasPrefix(resp.ID, "resp_") || len(resp.ID) != len("resp_")+48 {
		t.Errorf("ID = %q; want resp_ and 48 hex digits", resp.ID)
	}
	if resp.Status != responses.ResponseStatusCompleted || resp.Model != "gpt-4.1" {
		t.Errorf("Status, Model = %q, %q; want completed, gpt-4.1", resp.Status, resp.Model)
	}
	if got := resp.OutputText(); got != "Hello <world> & you" {
		t.Errorf("OutputText() = %q", got)
	}
	if len(resp.Output) != 2 {
		t.Fatalf("len(Output) = %d; want 2", len(resp.Output))
	}
	msg := resp.Output[0].AsMessage()
	if !strings.HasPrefix(msg.ID, "msg_") || msg.Status != "completed" {
		t.Errorf("message id, status = %q, %q", msg.ID, msg.Status)
	}
	fc := resp.Output[1].AsFunctionCall()
	if fc.Name != "python" || fc.Arguments != `{"code":"print(\"é\")\n"}` || !strings.HasPrefix(fc.CallID, "call_") || !strings.HasPrefix(fc.ID, "fc_") {
		t.Errorf("function call = %+v", fc)
	}
	u := resp.Usage
	if u.InputTokens != 10 || u.InputTokensDetails.CachedTokens != 2 || u.OutputTokens != 5 || u.OutputTokensDetails.ReasoningTokens != 1 || u.TotalTokens != 15 {
		t.Errorf("Usage = %+v", u)
	}
	if len(resp.Tools) != 1 || resp.Tools[0].Name != "python" {
		t.Errorf("Tools not echoed: %s", resp.JSON.Tools.Raw())
	}
	raw := []byte(resp.RawJSON())
	want := []string{"id", "object", "created_at", "status", "completed_at", "background", "error", "incomplete_details", "instructions",
		"max_output_tokens", "max_tool_calls", "model", "output", "parallel_tool_calls", "previous_response_id",
		"prompt_cache_key", "reasoning", "safety_identifier", "service_tier", "store", "temperature", "text",
		"tool_choice", "tools", "top_logprobs", "top_p", "truncation", "usage", "user", "metadata"}
	if got := topKeys(t, raw); !slices.Equal(got, want) {
		t.Errorf("keys = %v\nwant %v", got, want)
	}
	if !bytes.Contains(raw, []byte("<world> & you")) {
		t.Errorf("HTML escaped, unlike OpenAI: %s", raw)
	}
	if !bytes.Contains(raw, []byte(`"temperature":1.0,`)) || !bytes.Contains(raw, []byte(`"logprobs":[]`)) {
		t.Errorf("defaults differ from live traffic: %s", raw)
	}
	reqs := s.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer sk-test" || reqs[0].Stream || !reqs[0].Store {
		t.Fatalf("Requests() = %+v", reqs)
	}
	if got := reqs[0].ToolNames(); !slices.Equal(got, []string{"python"}) {
		t.Errorf("ToolNames() = %v", got)
	}
	if len(reqs[0].Input) != 1 || !strings.Contains(string(reqs[0].Input[0]), `"content":"hi"`) {
		t.Errorf("Input = %s", reqs[0].Input)
	}
}

// stream posts body with "stream":true and returns the raw SSE bytes.
func stream(t *testing.T, s *upstreamtest.Server, body string) []byte {
	t.Helper()
	code, raw := post(t, s.URL()+"/responses", body)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, raw)
	}
	return raw
}

func TestStreamIsValidAndDecodesWithSDK(t *testing.T) {
	items := []upstreamtest.Item{
		upstreamtest.RawItem(`{"id":"ws_1","type":"web_search_call","status":"completed","action":{"type":"search","query":"x"}}`),
		upstreamtest.Reasoning("Thinking about é"),
		upstreamtest.FunctionCall("python", `{"code":"s = \"a\\nb\"\nprint(s, '\u00e9😀')"}`),
		upstreamtest.Text("Done: café 😀."),
	}
	s := upstreamtest.New(t)
	s.Enqueue(upstreamtest.Turn{Items: items}, upstreamtest.Turn{Items: items})

	// The raw stream passes the conformance checker.
	raw := stream(t, s, `{"model":"gpt-5","input":"hi","stream":true,"include":["reasoning.encrypted_content"],"store":false}`)
	rep, err := streamcheck.Check(raw)
	if err != nil {
		t.Fatalf("streamcheck: %v\n%s", err, raw)
	}
	if rep.Terminal != "response.completed" || len(rep.Items) != 4 {
		t.Errorf("Terminal, items = %s, %d", rep.Terminal, len(rep.Items))
	}
	if !bytes.HasPrefix(raw, []byte("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_")) {
		t.Errorf("stream starts %q", raw[:min(len(raw), 120)])
	}
	if bytes.Contains(raw, []byte("[DONE]")) {
		t.Error("stream has [DONE]")
	}
	if !bytes.Contains(rep.Items[1], []byte(`"encrypted_content":"gAAAAA`)) {
		t.Errorf("reasoning item without encrypted_content: %s", rep.Items[1])
	}

	// The SDK decodes every event, and its helpers see the same content.
	st := client(s).Responses.NewStreaming(ctx(t), responses.ResponseNewParams{
		Model: "gpt-5",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
	})
	var types []string
	var text, args strings.Builder
	var final responses.Response
	for st.Next() {
		ev := st.Current()
		if ev.AsAny() == nil {
			t.Errorf("SDK does not know event %q", ev.Type)
		}
		if int(ev.SequenceNumber) != len(types) {
			t.Errorf("sequence_number %d at event %d", ev.SequenceNumber, len(types))
		}
		types = append(types, ev.Type)
		switch e := ev.AsAny().(type) {
		case responses.ResponseTextDeltaEvent:
			text.WriteString(e.Delta)
		case responses.ResponseFunctionCallArgumentsDeltaEvent:
			args.WriteString(e.Delta)
		case responses.ResponseCompletedEvent:
			final = e.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if text.String() != "Done: café 😀." || args.String() != items[2].Arguments {
		t.Errorf("text %q, args %q", text.String(), args.String())
	}
	if final.OutputText() != "Done: café 😀." || final.Usage.TotalTokens == 0 {
		t.Errorf("final response: %s", final.RawJSON())
	}
	wantPrefix := []string{"response.created", "response.in_progress", "response.output_item.added", "response.output_item.done",
		"response.output_item.added", "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta"}
	if !slices.Equal(types[:len(wantPrefix)], wantPrefix) {
		t.Errorf("events start %v", types[:len(wantPrefix)])
	}
}

func TestArgumentDeltasSplitEscapes(t *testing.T) {
	args := `{"code":"print(\"a\\tb\")\n# é \ud83d\ude00"}`
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprint("chunk ", n), func(t *testing.T) {
			s := upstreamtest.New(t)
			s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", args)}, ArgsChunk: n})
			rep, err := streamcheck.Check(stream(t, s, `{"model":"m","input":"x","stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			var joined strings.Builder
			splitEscape := false
			for _, ev := range rep.Events {
				var d struct{ Type, Delta string }
				_ = json.Unmarshal(ev.Data, &d)
				if d.Type != "response.function_call_arguments.delta" {
					continue
				}
				if len(d.Delta) > n+3 { // at most n bytes, extended to a rune boundary
					t.Errorf("delta %q longer than %d bytes", d.Delta, n)
				}
				joined.WriteString(d.Delta)
				if inEscape(args, joined.Len()) {
					splitEscape = true
				}
			}
			if joined.String() != args {
				t.Errorf("deltas join to %q; want %q", joined.String(), args)
			}
			if !splitEscape {
				t.Error("no delta ends inside an escape")
			}
		})
	}
}

// inEscape reports whether byte position k of the JSON text s falls strictly inside an escape.
func inEscape(s string, k int) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		n := 2
		if i+1 < len(s) && s[i+1] == 'u' {
			n = 6
		}
		if k > i && k < i+n {
			return true
		}
		i += n - 1
	}
	return false
}

func TestPreviousResponseID(t *testing.T) {
	s := upstreamtest.New(t)
	c := client(s)
	s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"1+1"}`)}})
	first, err := c.Responses.New(ctx(t), responses.ResponseNewParams{
		Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("add")},
		Tools: []responses.ToolUnionParam{pythonTool},
	})
	if err != nil {
		t.Fatal(err)
	}
	callID := first.Output[0].AsFunctionCall().CallID

	t.Run("unknown id", func(t *testing.T) {
		_, err := c.Responses.New(ctx(t), responses.ResponseNewParams{
			Model: "m", PreviousResponseID: openai.String("resp_nope"),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "previous_response_not_found" || apiErr.Param != "previous_response_id" {
			t.Fatalf("err = %v; want 400 previous_response_not_found", err)
		}
	})
	t.Run("call without output", func(t *testing.T) {
		code, body := post(t, s.URL()+"/responses", fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"next"}`, first.ID))
		if code != 400 || !strings.Contains(string(body), "No tool output found for function call "+callID) {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("output without call", func(t *testing.T) {
		code, body := post(t, s.URL()+"/responses", `{"model":"m","input":[{"type":"function_call_output","call_id":"call_x","output":"2"}]}`)
		if code != 400 || !strings.Contains(string(body), "No tool call found for function call output with call_id call_x") {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("history", func(t *testing.T) {
		s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("2")}})
		resp, err := c.Responses.New(ctx(t), responses.ResponseNewParams{
			Model: "m", PreviousResponseID: openai.String(first.ID),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{{
				OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
					CallID: openai.String(callID), Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("2")},
				},
			}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.PreviousResponseID != first.ID {
			t.Errorf("previous_response_id = %q", resp.PreviousResponseID)
		}
		reqs := s.Requests()
		last := reqs[len(reqs)-1]
		if last.N != len(reqs)-1 {
			t.Errorf("N = %d; want %d", last.N, len(reqs)-1)
		}
		if out, ok := last.FunctionOutput(callID); !ok || out != "2" {
			t.Errorf("FunctionOutput(%q) = %q, %v; want \"2\", true", callID, out, ok)
		}
		var types []string
		for _, it := range last.History {
			var v struct{ Type, Role string }
			_ = json.Unmarshal(it, &v)
			types = append(types, v.Type+v.Role)
		}
		if want := []string{"user", "function_call", "function_call_output"}; !slices.Equal(types, want) {
			t.Errorf("History types = %v; want %v", types, want)
		}
		// GET returns the stored response.
		got, err := c.Responses.Get(ctx(t), resp.ID, responses.ResponseGetParams{})
		if err != nil || got.ID != resp.ID || got.OutputText() != "2" {
			t.Errorf("Get = %v, %v", got, err)
		}
		if _, err := c.Responses.Get(ctx(t), "resp_nope", responses.ResponseGetParams{}); err == nil {
			t.Error("Get(unknown) succeeded")
		}
	})
	t.Run("store false is not stored", func(t *testing.T) {
		s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("x")}})
		code, body := post(t, s.URL()+"/responses", `{"model":"m","input":"x","store":false}`)
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		var r struct{ ID string }
		_ = json.Unmarshal(body, &r)
		if _, ok := s.Response(r.ID); ok {
			t.Error("store:false response was stored")
		}
		code, _ = post(t, s.URL()+"/responses", fmt.Sprintf(`{"model":"m","input":"y","previous_response_id":%q}`, r.ID))
		if code != 400 {
			t.Errorf("previous_response_id of a store:false response: status %d; want 400", code)
		}
	})
}

func TestEncryptedReasoning(t *testing.T) {
	s := upstreamtest.New(t)
	s.Script(func(req upstreamtest.Request) upstreamtest.Turn {
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Reasoning(""), upstreamtest.Text("ok")}}
	})
	code, body := post(t, s.URL()+"/responses", `{"model":"m","input":"x","store":false,"include":["reasoning.encrypted_content"]}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var r responses.Response
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	rs := r.Output[0].AsReasoning()
	if !strings.HasPrefix(rs.ID, "rs_") || !strings.HasPrefix(rs.EncryptedContent, "gAAAAA") {
		t.Fatalf("reasoning item = %s", r.Output[0].RawJSON())
	}
	if got := topKeys(t, []byte(r.Output[0].RawJSON())); !slices.Equal(got, []string{"id", "type", "encrypted_content", "summary"}) {
		t.Errorf("reasoning keys = %v", got)
	}
	tests := []struct {
		name string
		item string
		want int
	}{
		{"encrypted content sent back", fmt.Sprintf(`{"type":"reasoning","id":%q,"summary":[],"encrypted_content":%q}`, rs.ID, rs.EncryptedContent), 200},
		{"reference to an unstored item", fmt.Sprintf(`{"type":"reasoning","id":%q,"summary":[]}`, rs.ID), 404},
		{"forged content", fmt.Sprintf(`{"type":"reasoning","id":%q,"summary":[],"encrypted_content":"gAAAAAforged"}`, rs.ID), 400},
		{"item_reference to an unstored item", fmt.Sprintf(`{"type":"item_reference","id":%q}`, rs.ID), 404},
		{"reasoning without its following item", fmt.Sprintf(`{"type":"reasoning","id":%q,"summary":[],"encrypted_content":%q}`, rs.ID, rs.EncryptedContent), 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := tt.item + `,{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]},{"role":"user","content":"more"}`
			if tt.want == 400 && strings.Contains(tt.name, "following") {
				input = tt.item + `,{"role":"user","content":"more"}`
			}
			code, body := post(t, s.URL()+"/responses", `{"model":"m","store":false,"input":[`+input+`]}`)
			if code != tt.want {
				t.Errorf("status %d; want %d (%s)", code, tt.want, body)
			}
		})
	}
	// Without the include, no encrypted content.
	_, body = post(t, s.URL()+"/responses", `{"model":"m","input":"x"}`)
	if bytes.Contains(body, []byte("encrypted_content")) {
		t.Errorf("encrypted_content without the include: %s", body)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name       string
		turn       upstreamtest.Turn
		body       string
		wantStatus int
		wantCode   string
	}{
		{"rate limit", upstreamtest.Turn{Error: upstreamtest.APIError(429, "rate_limit_exceeded", "Rate limit reached", "")}, `{"model":"m","input":"x"}`, 429, "rate_limit_exceeded"},
		{"server error", upstreamtest.Turn{Error: upstreamtest.APIError(500, "", "boom", "")}, `{"model":"m","input":"x"}`, 500, ""},
		{"bad json", upstreamtest.Turn{}, `{"model":`, 400, ""},
		{"missing model", upstreamtest.Turn{}, `{"input":"x"}`, 400, "missing_required_parameter"},
		{"tool_choice not in tools", upstreamtest.Turn{}, `{"model":"m","input":"x","tool_choice":{"type":"function","name":"python"},"tools":[]}`, 400, ""},
		{"hosted tool_choice not in tools", upstreamtest.Turn{}, `{"model":"m","input":"x","tool_choice":{"type":"code_interpreter"},"tools":[{"type":"function","name":"python"}]}`, 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := upstreamtest.New(t)
			if tt.turn.Error != nil {
				s.Enqueue(tt.turn)
			}
			code, body := post(t, s.URL()+"/responses", tt.body)
			if code != tt.wantStatus {
				t.Fatalf("status %d; want %d: %s", code, tt.wantStatus, body)
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("body %s is not an OpenAI error", body)
			}
			if got := topKeys(t, bytes.TrimSpace(body[len(`{"error":`):len(body)-1])); !slices.Equal(got, []string{"message", "type", "param", "code"}) {
				t.Errorf("error keys = %v", got)
			}
			gotCode := ""
			if e.Error.Code != nil {
				gotCode = *e.Error.Code
			}
			if gotCode != tt.wantCode {
				t.Errorf("code %q; want %q", gotCode, tt.wantCode)
			}
		})
	}
}

func TestAPIKey(t *testing.T) {
	s := upstreamtest.New(t, upstreamtest.WithAPIKey("sk-right"))
	s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("hi")}})
	_, err := client(s).Responses.New(ctx(t), responses.ResponseNewParams{Model: "m"})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Fatalf("err = %v; want 401 invalid_api_key", err)
	}
	c := openai.NewClient(option.WithBaseURL(s.URL()+"/"), option.WithAPIKey("sk-right"), option.WithMaxRetries(0))
	if _, err := c.Responses.New(ctx(t), responses.ResponseNewParams{Model: "m"}); err != nil {
		t.Fatalf("with the right key: %v", err)
	}
}

func TestStreamFailures(t *testing.T) {
	items := []upstreamtest.Item{upstreamtest.Text("partial"), upstreamtest.Text("never")}
	t.Run("error event then response.failed", func(t *testing.T) {
		s := upstreamtest.New(t)
		s.Enqueue(upstreamtest.Turn{Items: items, Fail: &upstreamtest.Failure{After: 1, Code: "insufficient_quota", Message: "quota"}})
		raw := stream(t, s, `{"model":"m","input":"x","stream":true}`)
		rep, err := streamcheck.Check(raw)
		if err != nil {
			t.Fatalf("streamcheck: %v\n%s", err, raw)
		}
		if rep.Terminal != "response.failed" || len(rep.Items) != 1 {
			t.Errorf("Terminal %s, %d items", rep.Terminal, len(rep.Items))
		}
		if !bytes.Contains(raw, []byte(`"type":"error","sequence_number":`)) || !bytes.Contains(raw, []byte(`"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"quota","param":null}`)) {
			t.Errorf("error event not in the live nested form:\n%s", raw)
		}
		// The SDK ends the stream with a StreamError.
		s.Enqueue(upstreamtest.Turn{Items: items, Fail: &upstreamtest.Failure{After: 1}})
		st := client(s).Responses.NewStreaming(ctx(t), responses.ResponseNewParams{Model: "m"})
		for st.Next() {
		}
		var se *ssestream.StreamError
		if !errors.As(st.Err(), &se) {
			t.Errorf("SDK stream error = %v; want *ssestream.StreamError", st.Err())
		}
	})
	t.Run("failed without error event", func(t *testing.T) {
		s := upstreamtest.New(t)
		s.Enqueue(upstreamtest.Turn{Items: items, Fail: &upstreamtest.Failure{Code: "rate_limit_exceeded", NoErrorEvent: true}})
		raw := stream(t, s, `{"model":"m","input":"x","stream":true}`)
		events, err := streamcheck.Parse(raw)
		if err != nil || len(events) != 3 || events[2].Name != "response.failed" {
			t.Fatalf("events %v, %v", events, err)
		}
	})
	t.Run("incomplete", func(t *testing.T) {
		s := upstreamtest.New(t)
		s.Enqueue(upstreamtest.Turn{Items: items[:1], Incomplete: "max_output_tokens"})
		rep, err := streamcheck.Check(stream(t, s, `{"model":"m","input":"x","stream":true}`))
		if err != nil || rep.Terminal != "response.incomplete" || !bytes.Contains(rep.Response, []byte(`"incomplete_details":{"reason":"max_output_tokens"}`)) {
			t.Fatalf("%v %s %s", err, rep.Terminal, rep.Response)
		}
	})
	t.Run("cut", func(t *testing.T) {
		s := upstreamtest.New(t)
		s.Enqueue(upstreamtest.Turn{Items: items, Cut: true, CutAfter: 4})
		st := client(s).Responses.NewStreaming(ctx(t), responses.ResponseNewParams{Model: "m"})
		n := 0
		for st.Next() {
			n++
		}
		if st.Err() == nil || n != 4 {
			t.Errorf("read %d events, err %v; want 4 and an error", n, st.Err())
		}
	})
	t.Run("cut JSON", func(t *testing.T) {
		s := upstreamtest.New(t)
		s.Enqueue(upstreamtest.Turn{Items: items, Cut: true, CutAfter: 50})
		_, err := client(s).Responses.New(ctx(t), responses.ResponseNewParams{Model: "m"})
		if err == nil {
			t.Error("no error from a cut JSON body")
		}
	})
	t.Run("failed JSON", func(t *testing.T) {
		s := upstreamtest.New(t)
		s.Enqueue(upstreamtest.Turn{Items: items, Fail: &upstreamtest.Failure{After: 1}})
		resp, err := client(s).Responses.New(ctx(t), responses.ResponseNewParams{Model: "m"})
		if err != nil || resp.Status != "failed" || resp.Error.Code != "server_error" || len(resp.Output) != 1 {
			t.Errorf("%v %+v", err, resp)
		}
	})
}

// TestEventsArriveOneByOne holds the stream before event 5 and reads events 0-4 meanwhile, so
// every event is flushed as it is written.
func TestEventsArriveOneByOne(t *testing.T) {
	s := upstreamtest.New(t)
	gate := make(chan struct{})
	held5 := make(chan struct{}) // closed when the server holds event 5
	var mu sync.Mutex
	var seen []int
	s.Enqueue(upstreamtest.Turn{
		Items: []upstreamtest.Item{upstreamtest.Text("one two three")},
		BeforeEvent: func(ctx context.Context, seq int, typ string) error {
			mu.Lock()
			seen = append(seen, seq)
			mu.Unlock()
			if seq == 5 {
				close(held5)
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		},
	})
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, s.URL()+"/responses", strings.NewReader(`{"model":"m","input":"x","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("Content-Type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	readEvent := func() string {
		var name string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if line == "\n" {
				return name
			}
			if n, ok := strings.CutPrefix(line, "event: "); ok {
				name = strings.TrimSpace(n)
			}
		}
	}
	for i := range 5 {
		readEvent()
		_ = i
	}
	// Event 4 may arrive before the server asks about event 5.
	select {
	case <-held5:
	case <-ctx(t).Done():
		t.Fatal("the server never reached event 5")
	}
	mu.Lock()
	held := slices.Clone(seen)
	mu.Unlock()
	if !slices.Equal(held, []int{0, 1, 2, 3, 4, 5}) {
		t.Errorf("BeforeEvent calls before the gate opened: %v", held)
	}
	close(gate)
	rest, _ := io.ReadAll(br)
	if !bytes.Contains(rest, []byte("event: response.completed")) {
		t.Errorf("stream did not finish after the gate opened: %s", rest)
	}
}

func TestHoldAndWait(t *testing.T) {
	s := upstreamtest.New(t)
	release := make(chan struct{})
	s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("late")}, Hold: release})
	done := make(chan error, 1)
	go func() {
		_, err := client(s).Responses.New(ctx(t), responses.ResponseNewParams{Model: "m"})
		done <- err
	}()
	reqs, err := s.Wait(ctx(t), 1)
	if err != nil || len(reqs) != 1 {
		t.Fatalf("Wait: %v %d", err, len(reqs))
	}
	select {
	case err := <-done:
		t.Fatalf("answered before the hold was released: %v", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.Pending() != 0 {
		t.Errorf("Pending() = %d", s.Pending())
	}
}

// recordingTB records Errorf calls instead of failing.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestUnscriptedRequestFailsTheTest(t *testing.T) {
	tb := &recordingTB{TB: t}
	s := upstreamtest.New(tb)
	code, _ := post(t, s.URL()+"/responses", `{"model":"m","input":"x"}`)
	if code != 500 {
		t.Errorf("status %d; want 500", code)
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if len(tb.errs) != 1 || !strings.Contains(tb.errs[0], "no turn scripted") {
		t.Errorf("Errorf calls = %q", tb.errs)
	}
}

func TestChatCompletions(t *testing.T) {
	s := upstreamtest.New(t)
	c := client(s)
	turn := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Hi there, café"), upstreamtest.FunctionCall("lookup", `{"q":"x"}`)}}
	s.Enqueue(turn, turn)
	params := openai.ChatCompletionNewParams{Model: "gpt-4.1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	resp, err := c.Chat.Completions.New(ctx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	ch := resp.Choices[0]
	if ch.Message.Content != "Hi there, café" || ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 ||
		ch.Message.ToolCalls[0].Function.Arguments != `{"q":"x"}` || resp.Usage.TotalTokens == 0 {
		t.Errorf("chat completion = %s", resp.RawJSON())
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := c.Chat.Completions.NewStreaming(ctx(t), params)
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.Content; got != "Hi there, café" {
		t.Errorf("streamed content %q", got)
	}
	if tc := acc.Choices[0].Message.ToolCalls; len(tc) != 1 || tc[0].Function.Arguments != `{"q":"x"}` || tc[0].Function.Name != "lookup" {
		t.Errorf("streamed tool calls %+v", tc)
	}
	if acc.Usage.TotalTokens == 0 {
		t.Error("no usage chunk")
	}
	reqs := s.Requests()
	if len(reqs) != 2 || reqs[1].Path != "/v1/chat/completions" || !reqs[1].Stream || len(reqs[1].Messages) != 1 {
		t.Errorf("requests = %+v", reqs)
	}
}

func TestDeterministicIDs(t *testing.T) {
	ids := func() string {
		s := upstreamtest.New(t, upstreamtest.WithSeed(7), upstreamtest.WithClock(func() time.Time { return time.Unix(1757603567, 0) }))
		s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("x")}})
		_, body := post(t, s.URL()+"/responses", `{"model":"m","input":"x"}`)
		return string(body)
	}
	a, b := ids(), ids()
	if a != b {
		t.Errorf("same seed, different responses:\n%s\n%s", a, b)
	}
	if !strings.Contains(a, `"created_at":1757603567`) {
		t.Errorf("clock not used: %s", a)
	}
}

func TestUnknownRoute(t *testing.T) {
	s := upstreamtest.New(t)
	code, body := post(t, s.URL()+"/embeddings", `{"model":"m"}`)
	if code != 404 || !strings.Contains(string(body), "Invalid URL (POST /v1/embeddings)") {
		t.Errorf("%d %s", code, body)
	}
}

func TestObfuscation(t *testing.T) {
	tests := []struct {
		name string
		body string
		want bool
	}{
		{"default", `{"model":"m","input":"x","stream":true}`, true},
		{"include_obfuscation false", `{"model":"m","input":"x","stream":true,"stream_options":{"include_obfuscation":false}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := upstreamtest.New(t)
			s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("some text"), upstreamtest.FunctionCall("f", `{"a":1}`)}})
			raw := stream(t, s, tt.body)
			if got := bytes.Contains(raw, []byte(`"obfuscation":"`)); got != tt.want {
				t.Errorf("obfuscation present = %v; want %v", got, tt.want)
			}
			if _, err := streamcheck.Check(raw); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestScriptedLoop shows the usual script for the proxy's loop: call the function until its
// output comes back, then answer with what the model was told.
func TestScriptedLoop(t *testing.T) {
	s := upstreamtest.New(t)
	s.Script(func(req upstreamtest.Request) upstreamtest.Turn {
		last := req.History[len(req.History)-1]
		var it struct {
			Type   string `json:"type"`
			CallID string `json:"call_id"`
		}
		_ = json.Unmarshal(last, &it)
		if it.Type != "function_call_output" {
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"1+1"}`)}}
		}
		out, _ := req.FunctionOutput(it.CallID)
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("The result is " + out)}}
	})
	code, body := post(t, s.URL()+"/responses", `{"model":"m","input":"add"}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var first responses.Response
	_ = json.Unmarshal(body, &first)
	call := first.Output[0].AsFunctionCall()
	code, body = post(t, s.URL()+"/responses", fmt.Sprintf(
		`{"model":"m","previous_response_id":%q,"input":[{"type":"function_call_output","call_id":%q,"output":"2"}]}`, first.ID, call.CallID))
	var second responses.Response
	_ = json.Unmarshal(body, &second)
	if code != 200 || second.OutputText() != "The result is 2" {
		t.Fatalf("%d %s", code, body)
	}
}
