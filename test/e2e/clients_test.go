package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image/png"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// sdk returns an openai-go client for the proxy, as a user configures it: only the base URL and
// the key change.
func sdk(p *proxy, key string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(p.URL+"/v1/"),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(90*time.Second),
	)
}

// uploadUserData uploads a user_data file through the Files API with c and returns its id.
func uploadUserData(t *testing.T, c openai.Client, name, typ string, data []byte) string {
	t.Helper()
	f, err := c.Files.New(ctx(t, 30*time.Second), openai.FileNewParams{File: openai.File(bytes.NewReader(data), name, typ), Purpose: openai.FilePurposeUserData})
	if err != nil {
		t.Fatalf("Files.New(%s): %v", name, err)
	}
	return f.ID
}

// ciParams is a Responses request with the code_interpreter tool whose user message is code.
func ciParams(code string, container string) responses.ResponseNewParams {
	c := responses.ToolCodeInterpreterContainerUnionParam{OfCodeInterpreterToolAuto: &responses.ToolCodeInterpreterContainerCodeInterpreterContainerAutoParam{}}
	if container != "" {
		c = responses.ToolCodeInterpreterContainerUnionParam{OfString: openai.String(container)}
	}
	return responses.ResponseNewParams{
		Model:   clientModel,
		Input:   responses.ResponseNewParamsInputUnion{OfString: openai.String(code)},
		Tools:   []responses.ToolUnionParam{{OfCodeInterpreter: &responses.ToolCodeInterpreterParam{Container: c}}},
		Include: []responses.ResponseIncludable{responses.ResponseIncludableCodeInterpreterCallOutputs},
	}
}

// ciCall returns the response's only code_interpreter_call, failing the test unless there is
// exactly one and no function_call leaked to the client.
func ciCall(t *testing.T, r *responses.Response) responses.ResponseCodeInterpreterToolCall {
	t.Helper()
	var calls []responses.ResponseCodeInterpreterToolCall
	for _, it := range r.Output {
		switch it.Type {
		case "code_interpreter_call":
			calls = append(calls, it.AsCodeInterpreterCall())
		case "function_call":
			t.Errorf("the stand-in function call reached the client: %s", it.RawJSON())
		}
	}
	if len(calls) != 1 {
		t.Fatalf("%d code_interpreter_call items, want 1; output: %s", len(calls), r.RawJSON())
	}
	return calls[0]
}

// checkSixTimesSeven asserts what the client sees of running print(6 * 7).
func checkSixTimesSeven(t *testing.T, r *responses.Response) {
	t.Helper()
	checkSixTimesSevenUsage(t, r, true)
}

// checkSixTimesSevenUsage is checkSixTimesSeven for an upstream that reports cached tokens or
// not (llama.cpp does not).
func checkSixTimesSevenUsage(t *testing.T, r *responses.Response, cached bool) {
	t.Helper()
	if r.Status != responses.ResponseStatusCompleted {
		t.Errorf("status %q, want completed", r.Status)
	}
	if !strings.HasPrefix(r.ID, "resp_") {
		t.Errorf("id %q, want resp_...", r.ID)
	}
	if r.Model != clientModel {
		t.Errorf("model %q, want the client's %q", r.Model, clientModel)
	}
	if len(r.Tools) != 1 || r.Tools[0].Type != "code_interpreter" {
		t.Errorf("tools %s, want the client's code_interpreter tool", mustJSON(r.Tools))
	}
	call := ciCall(t, r)
	if !strings.HasPrefix(call.ID, "ci_") {
		t.Errorf("call id %q, want ci_...", call.ID)
	}
	if !strings.HasPrefix(call.ContainerID, "cntr_") {
		t.Errorf("container_id %q, want cntr_...", call.ContainerID)
	}
	if call.Code != "print(6 * 7)" {
		t.Errorf("code %q, want print(6 * 7)", call.Code)
	}
	if call.Status != responses.ResponseCodeInterpreterToolCallStatusCompleted {
		t.Errorf("call status %q, want completed", call.Status)
	}
	if len(call.Outputs) != 1 || call.Outputs[0].Type != "logs" || call.Outputs[0].AsLogs().Logs != "42\n" {
		t.Errorf("outputs %s, want one logs output \"42\\n\"", mustJSON(call.Outputs))
	}
	if got := r.OutputText(); !strings.HasPrefix(got, "Done. ") || !strings.Contains(got, "42") {
		t.Errorf("output_text %q, want the model's answer after seeing 42", got)
	}
	// Two upstream iterations: usage is their sum.
	u := r.Usage
	wantIn := int64(callUsage.InputTokens + answerUsage.InputTokens)
	wantOut := int64(callUsage.OutputTokens + answerUsage.OutputTokens)
	wantCached := int64(callUsage.CachedTokens + answerUsage.CachedTokens)
	if !cached {
		wantCached = 0
	}
	if u.InputTokens != wantIn || u.OutputTokens != wantOut || u.TotalTokens != wantIn+wantOut ||
		u.InputTokensDetails.CachedTokens != wantCached {
		t.Errorf("usage %s, want input %d (cached %d), output %d, total %d", u.RawJSON(), wantIn,
			wantCached, wantOut, wantIn+wantOut)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestCodeInterpreterOpenAIGo drives the intercepted code_interpreter tool with openai-go, for
// each sandbox tool: a JSON response, the same as a stream, a matplotlib figure, and a container
// kept across requests (and hidden from other keys).
func TestCodeInterpreterOpenAIGo(t *testing.T) {
	t.Parallel()
	for _, tool := range sandboxTools {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.New(t)
			up.Script(runUserCode)
			emu, _ := newEmulator(t)
			osb, osbEnv := newOpenSandbox(t, tool)
			wd := workDir(t)
			dt := newDaytona(t, tool)
			as := newAgentSandbox(t, tool)
			p := startProxy(t, setup{Upstream: up.URL(), Tool: tool, E2B: emu, E2BKey: emu.APIKey(), OSB: osb, WorkDir: wd, Daytona: dt, AgentSandbox: as}.yaml(), osbEnv...)
			client := sdk(p, "sk-client-a")

			var created *responses.Response
			t.Run("create", func(t *testing.T) {
				r, err := client.Responses.New(ctx(t, 90*time.Second), ciParams("print(6 * 7)", ""))
				if err != nil {
					t.Fatalf("Responses.New: %v", err)
				}
				checkSixTimesSeven(t, r)
				created = r
			})

			t.Run("stream", func(t *testing.T) {
				if created == nil {
					t.Skip("create failed")
				}
				stream := client.Responses.NewStreaming(ctx(t, 90*time.Second), ciParams("print(6 * 7)", ""))
				var code strings.Builder
				var final *responses.Response
				var types []string
				for stream.Next() {
					ev := stream.Current()
					types = append(types, ev.Type)
					if ev.AsAny() == nil {
						t.Errorf("event %q does not decode with the SDK's union: %s", ev.Type, ev.RawJSON())
					}
					switch e := ev.AsAny().(type) {
					case responses.ResponseCodeInterpreterCallCodeDeltaEvent:
						code.WriteString(e.Delta)
					case responses.ResponseCompletedEvent:
						if final != nil {
							t.Error("a second response.completed")
						}
						final = &e.Response
					}
				}
				if err := stream.Err(); err != nil {
					t.Fatalf("stream: %v", err)
				}
				if final == nil {
					t.Fatalf("no response.completed; events: %v", types)
				}
				if code.String() != "print(6 * 7)" {
					t.Errorf("code deltas join to %q, want print(6 * 7)", code.String())
				}
				for _, want := range []string{"response.created", "response.output_item.added", "response.code_interpreter_call.in_progress",
					"response.code_interpreter_call_code.done", "response.code_interpreter_call.interpreting",
					"response.code_interpreter_call.completed", "response.output_text.delta"} {
					if !contains(types, want) {
						t.Errorf("no %s event; events: %v", want, types)
					}
				}
				checkSixTimesSeven(t, final)
				// One engine, two renderings: the stream's final response is the JSON response.
				a, b := normalized(t, created.RawJSON()), normalized(t, final.RawJSON())
				if !reflect.DeepEqual(a, b) {
					t.Errorf("the stream's final response differs from Responses.New's (ids and times blanked):\nnew:    %s\nstream: %s", mustJSON(a), mustJSON(b))
				}
			})

			t.Run("previous_response_id", func(t *testing.T) {
				if created == nil {
					t.Skip("create failed")
				}
				params := ciParams("print(6 * 7)", "")
				params.PreviousResponseID = openai.String(created.ID)
				before := len(up.Requests())
				r, err := client.Responses.New(ctx(t, 90*time.Second), params)
				if err != nil {
					t.Fatalf("continuing %s: %v", created.ID, err)
				}
				checkSixTimesSeven(t, r)
				if r.PreviousResponseID != created.ID {
					t.Errorf("previous_response_id %q, want the client's %q", r.PreviousResponseID, created.ID)
				}
				// The upstream was asked to continue its own response (it answers 400 to ids it
				// never minted), so it saw the whole earlier turn.
				reqs := up.Requests()[before:]
				if len(reqs) == 0 {
					t.Fatal("the continuation never reached the upstream")
				}
				if reqs[0].PreviousResponseID == "" || reqs[0].PreviousResponseID == created.ID {
					t.Errorf("first upstream request continues %q, want the upstream's own id for %s", reqs[0].PreviousResponseID, created.ID)
				}
				if n := len(reqs[0].History); n < 4 {
					t.Errorf("the model saw %d items, want the earlier exchange too", n)
				}
			})

			t.Run("raw stream conforms", func(t *testing.T) {
				body, _ := json.Marshal(map[string]any{
					"model": clientModel, "input": "print(6 * 7)", "stream": true,
					"tools":   []any{map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}},
					"include": []string{"code_interpreter_call.outputs"},
				})
				resp := do(t, http.MethodPost, p.URL+"/v1/responses", body, "Authorization: Bearer sk-client-a")
				if resp.Status != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
					t.Fatalf("status %d, content type %q: %.500s", resp.Status, resp.Header.Get("Content-Type"), resp.Body)
				}
				if _, err := streamcheck.Check(resp.Body); err != nil {
					t.Errorf("the stream breaks OpenAI's event grammar: %v\n%s", err, resp.Body)
				}
			})

			t.Run("matplotlib figure", func(t *testing.T) {
				code := "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"
				r, err := client.Responses.New(ctx(t, 90*time.Second), ciParams(code, ""))
				if err != nil {
					t.Fatalf("Responses.New: %v", err)
				}
				call := ciCall(t, r)
				var images int
				for _, o := range call.Outputs {
					if o.Type != "image" {
						continue
					}
					images++
					url := o.AsImage().URL
					b64, ok := strings.CutPrefix(url, "data:image/png;base64,")
					if !ok {
						t.Fatalf("image url %.60q, want data:image/png;base64,...", url)
					}
					raw, err := base64.StdEncoding.DecodeString(b64)
					if err != nil {
						t.Fatalf("image url is not base64: %v", err)
					}
					img, err := png.Decode(bytes.NewReader(raw))
					if err != nil {
						t.Fatalf("image is not a PNG: %v", err)
					}
					if sz := img.Bounds().Size(); sz.X < 50 || sz.Y < 50 {
						t.Errorf("image is %v, want a rendered figure", sz)
					}
				}
				if images != 1 {
					t.Errorf("%d image outputs, want 1; outputs: %.300s", images, mustJSON(call.Outputs))
				}
			})

			t.Run("container reuse and owner isolation", func(t *testing.T) {
				c := ctx(t, 90*time.Second)
				first, err := client.Responses.New(c, ciParams("x = 41\nprint('set')", ""))
				if err != nil {
					t.Fatalf("first request: %v", err)
				}
				cntr := ciCall(t, first).ContainerID
				second, err := client.Responses.New(c, ciParams("print(x + 1)", cntr))
				if err != nil {
					t.Fatalf("second request with container %q: %v", cntr, err)
				}
				call := ciCall(t, second)
				if call.ContainerID != cntr {
					t.Errorf("container_id %q, want the reused %q", call.ContainerID, cntr)
				}
				if len(call.Outputs) != 1 || call.Outputs[0].AsLogs().Logs != "42\n" {
					t.Errorf("outputs %s, want 42 from the state the first request left", mustJSON(call.Outputs))
				}

				for name, key := range map[string]string{"another key": "sk-client-b", "no key": ""} {
					other := sdk(p, key)
					if key == "" {
						other = openai.NewClient(option.WithBaseURL(p.URL+"/v1/"), option.WithMaxRetries(0), option.WithHeaderDel("Authorization"))
					}
					_, err := other.Responses.New(c, ciParams("print(x)", cntr))
					var apiErr *openai.Error
					if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
						t.Errorf("%s using %s's container: %v, want a 404", name, "sk-client-a", err)
					}
				}
				// A forged id is refused the same way.
				forged := "cntr_" + strings.Repeat("A", len(cntr)-5)
				_, err = client.Responses.New(c, ciParams("print(1)", forged))
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
					t.Errorf("forged container id: %v, want a 404", err)
				}
				// The owner still has it.
				again, err := client.Responses.New(c, ciParams("print(x * 2)", cntr))
				if err != nil {
					t.Fatalf("owner again: %v", err)
				}
				if out := ciCall(t, again).Outputs; len(out) != 1 || out[0].AsLogs().Logs != "82\n" {
					t.Errorf("owner's third use: outputs %s, want 82", mustJSON(out))
				}
			})

			// Shutdown deletes every local sandbox the proxy created. e2b sandboxes outlive it
			// (recorded in the store, they reopen by id after a restart), so none may be lost:
			// e2b itself ends each one at the lifetime the proxy kept, the idle timeout plus a
			// margin.
			// A live local provider holds its directory and its lock file there (the sandboxes'
			// /mnt/data are tmpfs of their own, inside their namespaces).
			if tool == "local" && len(entries(wd)) < 2 {
				t.Errorf("the local tool's work_dir holds %v while containers live: the leak check below would prove nothing", entries(wd))
			}
			p.Stop()
			checkNoLeftovers(t, wd)
			if tool == "e2b" {
				if emu.Creates() == 0 {
					t.Error("the e2b tool never created a sandbox in the emulator")
				}
				if n := emu.Live(); n > emu.Creates() {
					t.Errorf("%d e2b sandboxes live after the proxy stopped, more than it created", n)
				}
				emu.Advance(20*time.Minute + 2*time.Minute)
				if n := emu.Live(); n != 0 {
					t.Errorf("%d e2b sandboxes still live past their idle timeout after the proxy stopped", n)
				}
			} else if emu.Creates() != 0 {
				t.Errorf("the %s tool created %d sandboxes in e2b", tool, emu.Creates())
			}
			if osb != nil {
				if osb.Creates() == 0 {
					t.Error("the opensandbox tool never created a sandbox in the double")
				}
				osb.Advance(20*time.Minute + 2*time.Minute)
				if n := osb.Live(); n != 0 {
					t.Errorf("%d OpenSandbox sandboxes still live past their idle timeout after the proxy stopped", n)
				}
			}
			checkDaytonaAfterStop(t, dt)
			checkAgentSandboxAfterStop(t, as)
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// normalized decodes a response and blanks what differs between two runs of the same script:
// ids, container ids, timestamps, and the text of the model's answer (which quotes the output).
func normalized(t *testing.T, raw string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("response JSON: %v", err)
	}
	var walk func(any)
	walk = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			for k, val := range x {
				switch k {
				case "id", "container_id", "created_at", "completed_at", "call_id":
					x[k] = "*"
				default:
					walk(val)
				}
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return v
}

// TestPassthroughOpenAIGo: requests without code_interpreter reach the upstream and come back as
// the upstream answered: a chat completion (JSON and streamed) and a plain response.
func TestPassthroughOpenAIGo(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t, upstreamtest.WithAPIKey("sk-upstream-pass"))
	up.Script(runUserCode)
	p := startProxy(t, setup{Upstream: up.URL(), UpstreamKey: "sk-upstream-pass"}.yaml())
	client := sdk(p, "sk-client-pass")
	c := ctx(t, 60*time.Second)

	chat, err := client.Chat.Completions.New(c, openai.ChatCompletionNewParams{
		Model:    clientModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	})
	if err != nil {
		t.Fatalf("chat completion: %v", err)
	}
	if len(chat.Choices) != 1 || chat.Choices[0].Message.Content != "plain answer" {
		t.Errorf("chat completion %s, want the upstream's plain answer", chat.RawJSON())
	}

	stream := client.Chat.Completions.NewStreaming(c, openai.ChatCompletionNewParams{
		Model:    clientModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	})
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("chat stream: %v", err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "plain answer" {
		t.Errorf("streamed chat completion: %s, want the plain answer", mustJSON(acc.Choices))
	}

	r, err := client.Responses.New(c, responses.ResponseNewParams{
		Model: clientModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
	})
	if err != nil {
		t.Fatalf("plain response: %v", err)
	}
	if r.OutputText() != "plain answer" || r.Status != responses.ResponseStatusCompleted {
		t.Errorf("plain response %s", r.RawJSON())
	}

	// The upstream saw its own key and model name, never the client's.
	reqs := up.Requests()
	if len(reqs) != 3 {
		t.Fatalf("the upstream got %d requests, want 3", len(reqs))
	}
	for _, rq := range reqs {
		if got := rq.Header.Get("Authorization"); got != "Bearer sk-upstream-pass" {
			t.Errorf("upstream request %d: Authorization %q, want the upstream key", rq.N, got)
		}
		if rq.Model != upstreamModel {
			t.Errorf("upstream request %d: model %q, want %q", rq.N, rq.Model, upstreamModel)
		}
		if bytes.Contains(rq.Body, []byte("sk-client-pass")) || strings.Contains(mustJSON(rq.Header), "sk-client-pass") {
			t.Errorf("upstream request %d carries the client's key", rq.N)
		}
	}
}
