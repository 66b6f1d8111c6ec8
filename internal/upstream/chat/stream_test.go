package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/sse"
	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

const defaultStreamRequest = `{"model":"m","input":"hi","stream":true}`

// counterIDs mints predictable ids: prefix, then a counter.
func counterIDs() func(string) string {
	n := 0
	return func(prefix string) string {
		n++
		return fmt.Sprintf("%s%04d", prefix, n)
	}
}

// translateStream feeds a chat SSE stream through a Stream, as the integration will: Next
// per event, End at EOF, Fail on any error. It returns the Responses SSE bytes and the error.
func translateStream(t testing.TB, req *Request, chat []byte) ([]byte, error) {
	t.Helper()
	s := req.NewStream("resp_test", 0)
	var out bytes.Buffer
	write := func(evs []sse.Event) {
		for _, ev := range evs {
			fmt.Fprintf(&out, "event: %s\ndata: %s\n\n", ev.Name, ev.Data)
		}
	}
	rd := sse.NewReader(bytes.NewReader(chat))
	var err error
	for {
		ev, rerr := rd.Next()
		var evs []sse.Event
		if rerr == io.EOF {
			evs, err = s.End()
		} else if rerr != nil {
			t.Fatal(rerr)
		} else {
			evs, err = s.Next(ev.Data)
		}
		write(evs)
		if err != nil {
			write(s.Fail(err))
			break
		}
		if rerr == io.EOF || s.Done() {
			break
		}
	}
	return out.Bytes(), err
}

func newTestChatRequest(t testing.TB, body string, opts Options) *Request {
	t.Helper()
	if opts.NewID == nil {
		opts.NewID = counterIDs()
	}
	if opts.Now == nil {
		opts.Now = func() time.Time { return time.Unix(1767225700, 0) }
	}
	r, err := NewRequest([]byte(body), opts)
	if err != nil {
		t.Fatalf("NewRequest(%s): %v", body, err)
	}
	return r
}

// TestChatStreamGolden replays testdata/<case>.chat.sse (a chat stream as vLLM,
// llama.cpp, DeepSeek, Gemini or OpenAI send it) through the translator, for the request in
// <case>.request.json (default: a plain streamed request), and compares the Responses stream with
// <case>.responses.sse. Every output must pass the Responses stream checker. -update rewrites the
// expected streams.
func TestChatStreamGolden(t *testing.T) {
	cases, _ := filepath.Glob("testdata/*.chat.sse")
	if len(cases) < 10 {
		t.Fatalf("%d golden cases; want the whole set", len(cases))
	}
	for _, in := range cases {
		name := strings.TrimSuffix(in, ".chat.sse")
		t.Run(filepath.Base(name), func(t *testing.T) {
			chat, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			body := defaultStreamRequest
			if b, err := os.ReadFile(name + ".request.json"); err == nil {
				body = string(b)
			}
			got, _ := translateStream(t, newTestChatRequest(t, body, Options{}), chat)
			if _, err := streamcheck.Check(got); err != nil {
				t.Fatalf("streamcheck: %v\n%s", err, got)
			}
			golden := name + ".responses.sse"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("stream differs from %s (run with -update and review the diff):\n%s", golden, got)
			}
		})
	}
}

// assembleChat builds the chat.completion a server would have answered without streaming, from
// its stream: what the JSON path of the same completion receives.
func assembleChat(t testing.TB, chat []byte) []byte {
	t.Helper()
	type call struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Fn   struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	var (
		id, model, finish, tier       string
		created                       int64
		content, reasoning, refusal   strings.Builder
		hasContent, hasReason, hasRef bool
		calls                         = map[int64]*call{}
		usage, logprobs               []json.RawMessage
		lastIdx                       int64 = -1
	)
	rd := sse.NewReader(bytes.NewReader(chat))
	for {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		root := gjson.ParseBytes(ev.Data)
		if !root.IsObject() {
			continue
		}
		id, model, created = root.Get("id").String(), root.Get("model").String(), root.Get("created").Int()
		if v := root.Get("service_tier").String(); v != "" {
			tier = v
		}
		if u := root.Get("usage"); u.IsObject() {
			usage = []json.RawMessage{json.RawMessage(u.Raw)}
		}
		ch := root.Get("choices.0")
		d := ch.Get("delta")
		if r := d.Get("reasoning_content"); r.Type == gjson.String && r.Str != "" {
			reasoning.WriteString(r.Str)
			hasReason = true
		} else if r := d.Get("reasoning"); r.Type == gjson.String && r.Str != "" {
			reasoning.WriteString(r.Str)
			hasReason = true
		}
		if c := d.Get("content"); c.Type == gjson.String && c.Str != "" {
			content.WriteString(c.Str)
			hasContent = true
		}
		if c := d.Get("refusal"); c.Type == gjson.String && c.Str != "" {
			refusal.WriteString(c.Str)
			hasRef = true
		}
		ch.Get("logprobs.content").ForEach(func(_, lp gjson.Result) bool {
			logprobs = append(logprobs, json.RawMessage(lp.Raw))
			return true
		})
		d.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
			idx := lastIdx + 1
			if i := tc.Get("index"); i.Exists() {
				idx = i.Int()
			}
			lastIdx = max(lastIdx, idx)
			c := calls[idx]
			if c == nil {
				c = &call{Type: "function"}
				calls[idx] = c
			}
			if v := tc.Get("id").String(); v != "" {
				c.ID = v
			}
			if v := tc.Get("function.name").String(); v != "" {
				c.Fn.Name = v
			}
			c.Fn.Arguments += tc.Get("function.arguments").String()
			return true
		})
		if f := ch.Get("finish_reason").String(); f != "" {
			finish = f
		}
	}
	msg := map[string]any{"role": "assistant", "content": nil}
	if hasContent {
		msg["content"] = content.String()
	}
	if hasReason {
		msg["reasoning_content"] = reasoning.String()
	}
	if hasRef {
		msg["refusal"] = refusal.String()
	}
	if len(calls) > 0 {
		keys := make([]int64, 0, len(calls))
		for k := range calls {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
		var list []*call
		for _, k := range keys {
			list = append(list, calls[k])
		}
		msg["tool_calls"] = list
	}
	choice := map[string]any{"index": 0, "message": msg, "finish_reason": finish, "logprobs": nil}
	if logprobs != nil {
		choice["logprobs"] = map[string]any{"content": logprobs}
	}
	out := map[string]any{"id": id, "object": "chat.completion", "created": created, "model": model, "choices": []any{choice}}
	if usage != nil {
		out["usage"] = usage[0]
	}
	if tier != "" {
		out["service_tier"] = tier
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestChatStreamMatchesJSON: for every golden stream that completes, the JSON translation of
// the same completion is the stream's final Response, byte for byte (one engine, two
// renderings). Streams whose items interleave text and calls are left out: a stream shows them
// as they came, the JSON answer cannot.
func TestChatStreamMatchesJSON(t *testing.T) {
	cases, _ := filepath.Glob("testdata/*.chat.sse")
	for _, in := range cases {
		name := strings.TrimSuffix(in, ".chat.sse")
		if strings.HasSuffix(name, "text_after_call") {
			continue
		}
		t.Run(filepath.Base(name), func(t *testing.T) {
			chat, _ := os.ReadFile(in)
			body := defaultStreamRequest
			if b, err := os.ReadFile(name + ".request.json"); err == nil {
				body = string(b)
			}
			got, err := translateStream(t, newTestChatRequest(t, body, Options{}), chat)
			if err != nil {
				t.Skipf("the stream fails (%v); covered by TestChatStreamErrors", err)
			}
			rep := streamcheck.Must(t, got)
			resp, err := newTestChatRequest(t, body, Options{}).Response(assembleChat(t, chat), "resp_test", 0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(resp, rep.Response) {
				t.Errorf("JSON translation:\n%s\nstream's final response:\n%s", resp, rep.Response)
			}
		})
	}
}

// TestChatStreamEvents asserts, case by case, what the golden files show.
func TestChatStreamEvents(t *testing.T) {
	tests := []struct {
		name  string
		check func(t *testing.T, rep streamcheck.Report)
	}{
		{"text_vllm", func(t *testing.T, rep streamcheck.Report) {
			wantTypes(t, rep, "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.delta", "response.output_text.done", "response.content_part.done",
				"response.output_item.done", "response.completed")
			if got := gjson.GetBytes(rep.Items[0], "content.0.text").String(); got != "Hello <world> & café \"q\"\n😀" {
				t.Errorf("text = %q", got)
			}
			if !bytes.Contains(rep.Events[4].Data, []byte(`"delta":"Hello <world> & "`)) {
				t.Errorf("delta escaped or changed: %s", rep.Events[4].Data)
			}
			wantUsage(t, rep, `{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":8,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":20}`)
			if m := gjson.GetBytes(rep.Response, "model").String(); m != "Qwen/Qwen3-8B" {
				t.Errorf("model = %q", m)
			}
		}},
		{"reasoning_deepseek", func(t *testing.T, rep streamcheck.Report) {
			if len(rep.Items) != 2 || gjson.GetBytes(rep.Items[0], "type").String() != "reasoning" {
				t.Fatalf("items = %s", rep.Items)
			}
			if got := gjson.GetBytes(rep.Items[0], "content.0").Raw; got != `{"type":"reasoning_text","text":"The user says hi."}` {
				t.Errorf("reasoning content = %s", got)
			}
			if n := countType(rep, "response.reasoning_text.delta"); n != 2 {
				t.Errorf("%d reasoning_text deltas; want 2", n)
			}
			wantUsage(t, rep, `{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":30,"output_tokens_details":{"reasoning_tokens":22},"total_tokens":40}`)
		}},
		{"reasoning_field_vllm", func(t *testing.T, rep streamcheck.Report) {
			if got := gjson.GetBytes(rep.Items[0], "content.0.text").String(); got != "Need the sum." {
				t.Errorf("reasoning = %q; want the text once, though the server sent both fields", got)
			}
		}},
		{"calls_vllm", func(t *testing.T, rep streamcheck.Report) {
			if len(rep.Items) != 2 {
				t.Fatalf("items = %s", rep.Items)
			}
			want := []string{
				`{"id":"fc_0001","type":"function_call","status":"completed","arguments":"{\"code\": \"print(1)\\n\"}","call_id":"chatcmpl-tool-4e2a9c","name":"python"}`,
				`{"id":"fc_0002","type":"function_call","status":"completed","arguments":"{\"city\": \"Paris\"}","call_id":"chatcmpl-tool-77b1d0","name":"get_weather"}`,
			}
			for i, w := range want {
				if string(rep.Items[i]) != w {
					t.Errorf("item %d = %s\nwant %s", i, rep.Items[i], w)
				}
			}
			// The first call is done before the second starts, and its arguments streamed live.
			if i, j := indexOf(rep, "response.output_item.done", 0), indexOf(rep, "response.output_item.added", 1); i < 0 || j < i {
				t.Errorf("item 0 done at event %d, item 1 added at %d", i, j)
			}
			if n := countType(rep, "response.function_call_arguments.delta"); n != 5 {
				t.Errorf("%d argument deltas; want 5 (one per upstream piece)", n)
			}
			r := rep.Response
			for path, want := range map[string]string{
				"instructions": `"Be brief."`, "temperature": "0.2", "max_output_tokens": "512", "metadata": `{"k":"v"}`,
				"store": "false", "tool_choice": `"auto"`, "parallel_tool_calls": "true", "tools.1.name": `"get_weather"`,
				"usage.input_tokens_details.cached_tokens": "256",
			} {
				if got := gjson.GetBytes(r, path).Raw; got != want {
					t.Errorf("response %s = %s; want %s", path, got, want)
				}
			}
		}},
		{"calls_llamacpp", func(t *testing.T, rep streamcheck.Report) {
			types := []string{"reasoning", "message", "function_call"}
			for i, it := range rep.Items {
				if got := gjson.GetBytes(it, "type").String(); got != types[i] {
					t.Errorf("item %d type %s; want %s", i, got, types[i])
				}
			}
			if got := gjson.GetBytes(rep.Items[2], "arguments").String(); got != `{"code":"2**10"}` {
				t.Errorf("arguments %q", got)
			}
			if got := gjson.GetBytes(rep.Items[2], "call_id").String(); got != "Zk3x9QmB1TbHc2" {
				t.Errorf("call_id %q; want the upstream's", got)
			}
		}},
		{"calls_interleaved", func(t *testing.T, rep streamcheck.Report) {
			if len(rep.Items) != 2 {
				t.Fatalf("items = %s", rep.Items)
			}
			for i, want := range []string{`{"code":"1+1"}`, `{"q":"x"}`} {
				if got := gjson.GetBytes(rep.Items[i], "arguments").String(); got != want {
					t.Errorf("item %d arguments %q; want %q", i, got, want)
				}
			}
			// One item at a time: the second call's output_item.added follows the first's done.
			if i, j := indexOf(rep, "response.output_item.done", 0), indexOf(rep, "response.output_item.added", 1); j < i {
				t.Errorf("item 1 added (event %d) before item 0 done (event %d)", j, i)
			}
		}},
		{"text_after_call", func(t *testing.T, rep streamcheck.Report) {
			if len(rep.Items) != 2 || gjson.GetBytes(rep.Items[0], "type").String() != "function_call" ||
				gjson.GetBytes(rep.Items[1], "content.0.text").String() != "(thinking aloud)" {
				t.Errorf("items = %s", rep.Items)
			}
		}},
		{"length", func(t *testing.T, rep streamcheck.Report) {
			if rep.Terminal != "response.incomplete" || gjson.GetBytes(rep.Response, "incomplete_details.reason").String() != "max_output_tokens" {
				t.Errorf("terminal %s, response %s", rep.Terminal, rep.Response)
			}
			if gjson.GetBytes(rep.Items[0], "status").String() != "incomplete" {
				t.Errorf("item = %s; want status incomplete", rep.Items[0])
			}
		}},
		{"content_filter", func(t *testing.T, rep streamcheck.Report) {
			if rep.Terminal != "response.incomplete" || gjson.GetBytes(rep.Response, "incomplete_details.reason").String() != "content_filter" {
				t.Errorf("terminal %s, response %s", rep.Terminal, rep.Response)
			}
		}},
		{"refusal", func(t *testing.T, rep streamcheck.Report) {
			if got := gjson.GetBytes(rep.Items[0], "content").Raw; got != `[{"type":"refusal","refusal":"I can't help with that."}]` {
				t.Errorf("content = %s", got)
			}
			if countType(rep, "response.refusal.delta") != 2 || gjson.GetBytes(rep.Response, "service_tier").String() != "default" {
				t.Errorf("events %v", types(rep))
			}
		}},
		{"no_done", func(t *testing.T, rep streamcheck.Report) {
			if rep.Terminal != "response.completed" || len(rep.Items) != 2 || gjson.GetBytes(rep.Items[1], "call_id").String() != "function-call-1" {
				t.Errorf("terminal %s, items %s", rep.Terminal, rep.Items)
			}
		}},
		{"logprobs", func(t *testing.T, rep streamcheck.Report) {
			want := `[{"token":"Yes","logprob":-0.01,"bytes":[89,101,115],"top_logprobs":[{"token":"Yes","logprob":-0.01,"bytes":[89,101,115]}]},{"token":".","logprob":-0.2,"bytes":[46],"top_logprobs":[{"token":".","logprob":-0.2,"bytes":[46]}]}]`
			if got := gjson.GetBytes(rep.Items[0], "content.0.logprobs").Raw; got != want {
				t.Errorf("logprobs = %s", got)
			}
		}},
		{"error_chunk", func(t *testing.T, rep streamcheck.Report) {
			if rep.Terminal != "response.failed" || gjson.GetBytes(rep.Response, "error").Raw != `{"code":"server_overloaded","message":"The server is overloaded."}` {
				t.Errorf("terminal %s, response %s", rep.Terminal, rep.Response)
			}
			if len(rep.Items) != 0 {
				t.Errorf("unfinished items shown: %s", rep.Items)
			}
		}},
		{"cut", func(t *testing.T, rep streamcheck.Report) {
			if rep.Terminal != "response.failed" || gjson.GetBytes(rep.Response, "error.code").String() != "upstream_error" {
				t.Errorf("terminal %s, response %s", rep.Terminal, rep.Response)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := "testdata/" + tt.name
			chat, err := os.ReadFile(base + ".chat.sse")
			if err != nil {
				t.Fatal(err)
			}
			body := defaultStreamRequest
			if b, err := os.ReadFile(base + ".request.json"); err == nil {
				body = string(b)
			}
			got, _ := translateStream(t, newTestChatRequest(t, body, Options{}), chat)
			tt.check(t, streamcheck.Must(t, got))
		})
	}
}

func types(rep streamcheck.Report) []string {
	var out []string
	for _, ev := range rep.Events {
		out = append(out, ev.Name)
	}
	return out
}

func wantTypes(t *testing.T, rep streamcheck.Report, want ...string) {
	t.Helper()
	if got := types(rep); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("events:\n%v\nwant\n%v", got, want)
	}
}

func countType(rep streamcheck.Report, typ string) int {
	n := 0
	for _, ev := range rep.Events {
		if ev.Name == typ {
			n++
		}
	}
	return n
}

// indexOf returns the position of the first event typ about output_index i, or -1.
func indexOf(rep streamcheck.Report, typ string, i int) int {
	for k, ev := range rep.Events {
		if ev.Name == typ && gjson.GetBytes(ev.Data, "output_index").Int() == int64(i) {
			return k
		}
	}
	return -1
}

func wantUsage(t *testing.T, rep streamcheck.Report, want string) {
	t.Helper()
	if got := gjson.GetBytes(rep.Response, "usage").Raw; got != want {
		t.Errorf("usage = %s\nwant %s", got, want)
	}
}

// TestChatStreamErrors: how a failing stream is reported, as a typed error.
func TestChatStreamErrors(t *testing.T) {
	chunk := func(delta string, finish string) string {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		return `{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}]}`
	}
	tests := []struct {
		name      string
		events    []string // data of each event; "EOF" calls End
		sentinel  error
		status    int
		code      string
		wantInMsg string
	}{
		{"an OpenAI-shaped error chunk", []string{`{"error":{"message":"boom","type":"server_error","code":"server_error"}}`}, ErrStream, 502, "server_error", "boom"},
		{"a vLLM error chunk", []string{chunk(`{"content":"a"}`, ""), `{"object":"error","message":"len","type":"BadRequestError","param":null,"code":400}`}, ErrStream, 400, "", "len"},
		{"Ollama's error string", []string{`{"error":"model crashed"}`}, ErrStream, 502, "", "model crashed"},
		{"a cut before finish_reason", []string{chunk(`{"content":"a"}`, ""), "EOF"}, ErrStreamCut, 502, "upstream_error", "ended early"},
		{"[DONE] before finish_reason", []string{chunk(`{"content":"a"}`, ""), "[DONE]"}, ErrStreamCut, 502, "upstream_error", "ended early"},
		{"nothing at all", []string{"EOF"}, ErrStreamCut, 502, "upstream_error", "ended early"},
		{"a chunk that is not JSON", []string{`{"choices":`}, ErrShape, 502, "upstream_error", "could not be read"},
		{"a chunk that is an array", []string{`[1]`}, ErrShape, 502, "upstream_error", "could not be read"},
		{"a delta that is a string", []string{chunk(`"x"`, "")}, ErrShape, 502, "upstream_error", ""},
		{"a tool call without a name", []string{chunk(`{"tool_calls":[{"index":0,"id":"c","function":{"arguments":"{}"}}]}`, "tool_calls")}, ErrShape, 502, "upstream_error", ""},
		{"content after finish_reason", []string{chunk(`{"content":"a"}`, "stop"), chunk(`{"content":"b"}`, "")}, ErrShape, 502, "upstream_error", ""},
		{"arguments after a complete call", []string{
			chunk(`{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{}"}}]}`, ""),
			chunk(`{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{}"}}]}`, ""),
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"x"}}]}`, ""),
		}, ErrShape, 502, "upstream_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestChatRequest(t, defaultStreamRequest, Options{}).NewStream("resp_x", 1)
			var raw bytes.Buffer
			var err error
			for _, d := range tt.events {
				var evs []sse.Event
				if d == "EOF" {
					evs, err = s.End()
				} else {
					evs, err = s.Next([]byte(d))
				}
				for _, ev := range evs {
					fmt.Fprintf(&raw, "event: %s\ndata: %s\n\n", ev.Name, ev.Data)
				}
				if err != nil {
					break
				}
			}
			if !errors.Is(err, tt.sentinel) {
				t.Fatalf("error = %v; want %v", err, tt.sentinel)
			}
			var ae *apierror.Error
			if !errors.As(err, &ae) || ae.Status != tt.status || ae.Code != tt.code || !strings.Contains(ae.Message, tt.wantInMsg) {
				t.Errorf("error = %+v; want status %d, code %q, message with %q", ae, tt.status, tt.code, tt.wantInMsg)
			}
			if _, again := s.Next([]byte(chunk(`{"content":"z"}`, ""))); again != err {
				t.Errorf("Next after the error = %v; want the same error", again)
			}
			for _, ev := range s.Fail(err) {
				fmt.Fprintf(&raw, "event: %s\ndata: %s\n\n", ev.Name, ev.Data)
			}
			rep := streamcheck.Must(t, raw.Bytes())
			if rep.Terminal != "response.failed" {
				t.Errorf("terminal %s", rep.Terminal)
			}
			if s.Fail(err) != nil || !s.Done() {
				t.Error("Fail after Fail sent more events")
			}
		})
	}
}
