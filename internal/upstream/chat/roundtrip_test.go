package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// chatFlavours are the servers the round trips run against, with the options a deployment of
// each would get.
var chatFlavours = []struct {
	name     string
	server   []upstreamtest.Option
	opts     Options
	thinking bool // the server sends reasoning text
}{
	{"OpenAI", nil, Options{MaxCompletionTokens: true}, false},
	{"vLLM", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM)}, Options{ReasoningField: "reasoning_content"}, true},
	{"vLLM 0.10", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM), upstreamtest.WithChatReasoningField("reasoning")}, Options{ReasoningField: "reasoning"}, true},
	{"llama.cpp", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatLlamaCpp)}, Options{ReasoningField: "reasoning_content"}, true},
	{"OpenAI with the SDK's nulls", []upstreamtest.Option{upstreamtest.WithChatNulls()}, Options{MaxCompletionTokens: true}, false},
	{"vLLM with the SDK's nulls", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM), upstreamtest.WithChatNulls()}, Options{ReasoningField: "reasoning_content"}, true},
}

// exchange posts the translated request to the scripted server and translates its answer into
// the final Response (from the stream's terminal event when streaming).
func exchange(t *testing.T, s *upstreamtest.Server, r *Request) ([]byte, error) {
	t.Helper()
	resp, err := http.Post(s.URL()+"/chat/completions", "application/json", bytes.NewReader(r.Body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, UpstreamError(resp.StatusCode, resp.Header, body)
	}
	if !r.Stream {
		return r.Response(body, "resp_rt", 1767225600)
	}
	raw, err := translateStream(t, r, body)
	rep := streamcheck.Must(t, raw)
	return rep.Response, err
}

// TestChatRoundTrip runs a two-turn conversation with calls through the translation and the
// scripted server of each flavour, which refuses what its real counterpart refuses: the second
// turn sends the first one's output back with the calls' outputs, as the intercept loop does.
func TestChatRoundTrip(t *testing.T) {
	for _, fl := range chatFlavours {
		for _, stream := range []bool{false, true} {
			name := fl.name + "/json"
			if stream {
				name = fl.name + "/stream"
			}
			t.Run(name, func(t *testing.T) {
				s := upstreamtest.New(t, fl.server...)
				s.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{
					upstreamtest.Reasoning("The user wants code run."),
					upstreamtest.Text("Let me run it."),
					upstreamtest.FunctionCall("python", `{"code":"print(\"é\")"}`),
					upstreamtest.FunctionCall("lookup", `{"q":"x"}`),
				}, Usage: &upstreamtest.Usage{InputTokens: 20, CachedTokens: 8, OutputTokens: 10, ReasoningTokens: 4}},
					upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("It printed é.")}})

				tools := `[{"type":"function","name":"python","parameters":{"type":"object","properties":{"code":{"type":"string"}},"required":["code"],"additionalProperties":false},"strict":true},` +
					`{"type":"function","name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}]`
				first := `{"model":"m","instructions":"Use the tools.","input":"run it","tools":` + tools +
					`,"tool_choice":"auto","parallel_tool_calls":true,"max_output_tokens":256,"store":false,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
				opts := fl.opts
				opts.NewID = counterIDs()
				r, err := NewRequest([]byte(first), opts)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := exchange(t, s, r)
				if err != nil {
					t.Fatalf("first turn: %v", err)
				}
				out := gjson.GetBytes(resp, "output").Array()
				var kinds []string
				for _, it := range out {
					kinds = append(kinds, it.Get("type").String())
				}
				want := "message function_call function_call"
				if fl.thinking {
					want = "reasoning " + want
				}
				if strings.Join(kinds, " ") != want {
					t.Fatalf("output %s; want %s", gjson.GetBytes(resp, "output").Raw, want)
				}
				calls := out[len(out)-2:]
				if calls[0].Get("arguments").String() != `{"code":"print(\"é\")"}` || calls[1].Get("name").String() != "lookup" || calls[0].Get("call_id").String() == "" {
					t.Errorf("calls %s", gjson.GetBytes(resp, "output").Raw)
				}
				if u := gjson.GetBytes(resp, "usage"); u.Get("input_tokens").Int() != 20 || u.Get("output_tokens").Int() != 10 || u.Get("total_tokens").Int() != 30 {
					t.Errorf("usage %s", u.Raw)
				}
				if gjson.GetBytes(resp, "status").String() != "completed" || gjson.GetBytes(resp, "tools.0.name").String() != "python" {
					t.Errorf("response %s", resp)
				}

				// Turn two: the model's whole turn back, with the outputs.
				input := []json.RawMessage{json.RawMessage(`{"role":"user","content":"run it"}`)}
				for _, it := range out {
					input = append(input, json.RawMessage(it.Raw))
				}
				for k, c := range calls {
					o, _ := json.Marshal(map[string]string{"type": "function_call_output", "call_id": c.Get("call_id").String(), "output": []string{"é\n", "found"}[k]})
					input = append(input, o)
				}
				in, _ := json.Marshal(input)
				second := strings.Replace(first, `"input":"run it"`, `"input":`+string(in), 1)
				r2, err := NewRequest([]byte(second), opts)
				if err != nil {
					t.Fatal(err)
				}
				resp2, err := exchange(t, s, r2)
				if err != nil {
					t.Fatalf("second turn refused: %v\nbody %s", err, r2.Body)
				}
				if got := gjson.GetBytes(resp2, "output.0.content.0.text").String(); got != "It printed é." {
					t.Errorf("second answer %s", resp2)
				}
				req := s.Requests()[1]
				if o, ok := req.FunctionOutput(calls[0].Get("call_id").String()); !ok || o != "é\n" {
					t.Errorf("the model was told %q, %v", o, ok)
				}
				var histKinds []string
				for _, it := range req.History {
					histKinds = append(histKinds, gjson.GetBytes(it, "type").String()+":"+gjson.GetBytes(it, "role").String())
				}
				wantHist := "message:system message:user message:assistant function_call: function_call: function_call_output: function_call_output:"
				if fl.thinking {
					wantHist = "message:system message:user reasoning: message:assistant function_call: function_call: function_call_output: function_call_output:"
				}
				if strings.Join(histKinds, " ") != wantHist {
					t.Errorf("the model saw %v; want %s", histKinds, wantHist)
				}
			})
		}
	}
}

// TestChatRoundTripFailures: the scripted servers' ways of failing reach the caller as typed
// errors.
func TestChatRoundTripFailures(t *testing.T) {
	tests := []struct {
		name     string
		server   []upstreamtest.Option
		turn     upstreamtest.Turn
		stream   bool
		sentinel error
		status   int
	}{
		{"an OpenAI error chunk", nil, upstreamtest.Turn{Fail: &upstreamtest.Failure{After: 1}, Items: []upstreamtest.Item{upstreamtest.Text("a")}}, true, ErrStream, 502},
		{"a vLLM error chunk", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM)},
			upstreamtest.Turn{Fail: &upstreamtest.Failure{}}, true, ErrStream, 500},
		{"llama.cpp's error line, which SSE ignores", []upstreamtest.Option{upstreamtest.WithChatFlavour(upstreamtest.ChatLlamaCpp)},
			upstreamtest.Turn{Fail: &upstreamtest.Failure{}}, true, ErrStreamCut, 502},
		{"a cut stream", nil, upstreamtest.Turn{Cut: true, CutAfter: 2, Items: []upstreamtest.Item{upstreamtest.Text("abcdefghij")}}, true, ErrStreamCut, 502},
		{"a cut JSON answer", nil, upstreamtest.Turn{Cut: true, CutAfter: 20, Items: []upstreamtest.Item{upstreamtest.Text("abc")}}, false, ErrShape, 502},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := upstreamtest.New(t, tt.server...)
			s.Enqueue(tt.turn)
			body := `{"model":"m","input":"x","stream":false}`
			if tt.stream {
				body = `{"model":"m","input":"x","stream":true}`
			}
			r := newTestChatRequest(t, body, Options{})
			resp, err := http.Post(s.URL()+"/chat/completions", "application/json", bytes.NewReader(r.Body))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body) // a cut connection ends the body early
			resp.Body.Close()
			if tt.stream {
				_, err = translateStream(t, r, raw)
			} else {
				_, err = r.Response(raw, "resp_x", 1)
			}
			if !errors.Is(err, tt.sentinel) {
				t.Fatalf("error = %v; want %v", err, tt.sentinel)
			}
			if ae := apiErr(err); ae == nil || ae.Status != tt.status {
				t.Errorf("error %+v; want status %d", ae, tt.status)
			}
		})
	}
}

func apiErr(err error) *apierror.Error {
	var ae *apierror.Error
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}
