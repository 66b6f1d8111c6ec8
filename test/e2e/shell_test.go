package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// runUserCommands is the scripted model of the shell tests: each line of the user's message is
// a command, which it runs with the stand-in "shell"; when it has seen the output it answers
// "Done." followed by it.
func runUserCommands(req upstreamtest.Request) upstreamtest.Turn {
	if len(req.History) > 0 && itemType(req.History[len(req.History)-1]) == "function_call_output" {
		return runUserCode(req)
	}
	args, _ := json.Marshal(map[string]any{"commands": strings.Split(lastUserText(req), "\n"), "timeout_ms": 3000, "max_output_length": nil})
	return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("shell", string(args))}, Usage: callUsage}
}

func shellParams(commands string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: clientModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(commands)},
		Tools: []responses.ToolUnionParam{{OfShell: &responses.FunctionShellToolParam{
			Environment: responses.FunctionShellToolEnvironmentUnionParam{OfContainerAuto: &responses.ContainerAutoParam{}}}}},
	}
}

// TestShellOpenAIGo drives the hosted shell tool with openai-go through the real binary, for each
// sandbox backend: the commands really run in the container's sandbox (exit codes, stderr, a
// timeout with its partial output, no proxy secret in the environment, no network), files they
// write are container files, the stream decodes with the SDK's union and keeps OpenAI's grammar,
// and the streamed and JSON renderings agree.
func TestShellOpenAIGo(t *testing.T) {
	t.Parallel()
	for _, tool := range sandboxTools {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.New(t)
			up.Script(runUserCommands)
			emu, _ := newEmulator(t)
			osb, osbEnv := newOpenSandbox(t, tool)
			p := startProxy(t, setup{Upstream: up.URL(), Tool: tool, E2B: emu, E2BKey: emu.APIKey(), OSB: osb, Daytona: newDaytona(t, tool), AgentSandbox: newAgentSandbox(t, tool), WorkDir: workDir(t)}.yaml(), osbEnv...)
			client := sdk(p, "sk-client-a")
			commands := strings.Join([]string{
				"echo hello; echo oops >&2; exit 3",
				"pwd; printf 'a\\nb\\n' > made.txt; wc -l < made.txt",
				"env | grep -ci -e sk- -e key -e secret -e token || true",
				"python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)' 2>&1 | tail -1",
				"echo started; sleep 30",
			}, "\n")

			r, err := client.Responses.New(ctx(t, 120*time.Second), shellParams(commands))
			if err != nil {
				t.Fatalf("Responses.New: %v", err)
			}
			if len(r.Output) != 3 || r.Output[0].Type != "shell_call" || r.Output[1].Type != "shell_call_output" {
				t.Fatalf("output %s", r.RawJSON())
			}
			call, out := r.Output[0].AsShellCall(), r.Output[1].AsShellCallOutput()
			if !strings.HasPrefix(call.Environment.ContainerID, "cntr_") || out.CallID != call.CallID || len(out.Output) != 5 {
				t.Fatalf("call %s\noutput %s", call.RawJSON(), out.RawJSON())
			}
			e := out.Output
			if e[0].Stdout != "hello\n" || e[0].Stderr != "oops\n" || e[0].Outcome.Type != "exit" || e[0].Outcome.ExitCode != 3 {
				t.Errorf("command 0: %s", e[0].RawJSON())
			}
			if e[1].Stdout != "/mnt/data\n2\n" || e[1].Outcome.ExitCode != 0 {
				t.Errorf("command 1: %s", e[1].RawJSON())
			}
			if strings.TrimSpace(e[2].Stdout) != "0" {
				t.Errorf("the commands' environment names a key, secret or token: %q", e[2].Stdout)
			}
			if !strings.Contains(e[3].Stdout, "Error") {
				t.Errorf("a connection out of the sandbox: %q; want an error", e[3].Stdout)
			}
			if e[4].Outcome.Type != "timeout" || e[4].Stdout != "started\n" {
				t.Errorf("command 4: %s; want a timeout with its partial output", e[4].RawJSON())
			}
			files, err := client.Containers.Files.List(ctx(t, 30*time.Second), call.Environment.ContainerID, openai.ContainerFileListParams{})
			if err != nil || len(files.Data) != 1 || files.Data[0].Path != "/mnt/data/made.txt" || files.Data[0].Source != "assistant" {
				t.Errorf("container files %+v, %v; want made.txt", files, err)
			}

			stream := client.Responses.NewStreaming(ctx(t, 120*time.Second), shellParams(commands))
			var final *responses.Response
			var deltas strings.Builder
			for stream.Next() {
				ev := stream.Current()
				if ev.AsAny() == nil {
					t.Errorf("event %q does not decode with the SDK's union: %s", ev.Type, ev.RawJSON())
				}
				switch ev := ev.AsAny().(type) {
				case responses.ResponseShellCallOutputContentDeltaEvent:
					deltas.WriteString(ev.Delta.Stdout)
				case responses.ResponseCompletedEvent:
					final = &ev.Response
				}
			}
			if err := stream.Err(); err != nil || final == nil {
				t.Fatalf("stream: %v (final %v)", err, final != nil)
			}
			if !strings.HasPrefix(deltas.String(), "hello\n/mnt/data\n2\n") {
				t.Errorf("stdout deltas %q", deltas.String())
			}
			if got := final.Output[1].AsShellCallOutput().Output; len(got) != 5 || got[0].Outcome.ExitCode != 3 {
				t.Errorf("the stream's output %s", final.Output[1].RawJSON())
			}

			// A client that leaves while a command runs: the command and what it started are
			// killed, and the container runs the next call.
			t.Run("disconnect", func(t *testing.T) {
				c, cancel := context.WithCancel(ctx(t, 120*time.Second))
				defer cancel()
				params := shellParams("echo started; (sleep 300 &); sleep 300")
				params.Tools[0].OfShell.Environment = responses.FunctionShellToolEnvironmentUnionParam{
					OfContainerReference: &responses.ContainerReferenceParam{ContainerID: call.Environment.ContainerID}}
				stream := client.Responses.NewStreaming(c, params)
				for stream.Next() {
					if ev, ok := stream.Current().AsAny().(responses.ResponseShellCallOutputContentDeltaEvent); ok && ev.Delta.Stdout == "started\n" {
						cancel()
					}
				}
				// The probe's own sleep shows that it sees the container's processes.
				probe := shellParams("sleep 2 & ps -eo comm= | grep -cx sleep; kill %1")
				probe.Tools = params.Tools
				testutil.Eventually(t, "the left command's processes to be gone", func() bool {
					r, err := client.Responses.New(ctx(t, 60*time.Second), probe)
					if err != nil || len(r.Output) < 2 {
						t.Fatalf("probe: %v", err)
					}
					out := r.Output[1].AsShellCallOutput().Output
					if len(out) != 1 {
						t.Fatalf("probe output %s", r.Output[1].RawJSON())
					}
					t.Logf("sleep processes in the container: %q", out[0].Stdout)
					return strings.TrimSpace(out[0].Stdout) == "1"
				})
			})

			body, _ := json.Marshal(map[string]any{"model": clientModel, "input": "echo raw", "stream": true,
				"tools": []any{map[string]any{"type": "shell", "environment": map[string]any{"type": "container_auto"}}}})
			resp := do(t, http.MethodPost, p.URL+"/v1/responses", body, "Authorization: Bearer sk-client-a")
			if resp.Status != http.StatusOK {
				t.Fatalf("raw stream: %d %.300s", resp.Status, resp.Body)
			}
			if _, err := streamcheck.Check(resp.Body); err != nil {
				t.Errorf("the stream breaks OpenAI's event grammar: %v\n%s", err, resp.Body)
			}
		})
	}
}

// TestShellContainersAPIChatOpenAIGo: a container made with the Containers API is named by
// container_reference, for a model whose upstream speaks only Chat Completions; the file the
// commands write is downloaded through the Containers API, and the answer cites it.
func TestShellContainersAPIChatOpenAIGo(t *testing.T) {
	t.Parallel()
	chatUp := upstreamtest.New(t, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
	chatUp.Script(func(req upstreamtest.Request) upstreamtest.Turn {
		if n := len(req.History); n > 0 && itemType(req.History[n-1]) == "function_call_output" {
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Here: [primes](sandbox:/mnt/data/primes.txt)")}, Usage: answerUsage}
		}
		return runUserCommands(req)
	})
	const chatModel = clientModel + "-chat"
	entry := "  - model_name: " + chatModel + "\n    litellm_params:\n      model: openai/" + upstreamModel + "\n      api_base: " + chatUp.URL() +
		"\n    model_info:\n      supported_endpoints: [\"/v1/chat/completions\"]\n"
	p := startProxy(t, setup{Upstream: chatUp.URL(), WorkDir: workDir(t), ExtraModels: entry}.yaml())
	client := sdk(p, "sk-client-a")
	made, err := client.Containers.New(ctx(t, 60*time.Second), openai.ContainerNewParams{Name: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	params := shellParams("seq 2 100 | awk '{p=1; for (i=2; i*i<=$1; i++) if ($1%i==0) p=0; if (p) print}' > primes.txt; wc -l < primes.txt")
	params.Model = chatModel
	params.Tools[0].OfShell.Environment = responses.FunctionShellToolEnvironmentUnionParam{
		OfContainerReference: &responses.ContainerReferenceParam{ContainerID: made.ID}}
	r, err := client.Responses.New(ctx(t, 120*time.Second), params)
	if err != nil {
		t.Fatalf("Responses.New: %v", err)
	}
	if len(r.Output) != 3 || r.Output[0].AsShellCall().Environment.ContainerID != made.ID {
		t.Fatalf("output %s", r.RawJSON())
	}
	if out := r.Output[1].AsShellCallOutput().Output; len(out) != 1 || out[0].Stdout != "25\n" || out[0].Outcome.ExitCode != 0 {
		t.Errorf("output %s", r.Output[1].RawJSON())
	}
	ann := r.Output[2].AsMessage().Content[0].AsOutputText().Annotations
	if len(ann) != 1 || ann[0].Type != "container_file_citation" || ann[0].ContainerID != made.ID {
		t.Fatalf("annotations %+v; want a container_file_citation of primes.txt", ann)
	}
	resp, err := client.Containers.Files.Content.Get(ctx(t, 30*time.Second), made.ID, ann[0].FileID)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if lines := strings.Split(strings.TrimSpace(string(body)), "\n"); len(lines) != 25 || lines[0] != "2" || lines[24] != "97" {
		t.Errorf("primes.txt = %q", body)
	}
	if reqs := chatUp.Requests(); len(reqs) != 2 || reqs[0].Path != "/v1/chat/completions" {
		t.Errorf("the chat upstream got %d requests", len(reqs))
	}
}

// TestShellLocalTwoTurns: a shell tool with a local environment, or none, runs nothing in the
// proxy; the client gets the shell_call, runs it itself, and continues with previous_response_id
// and the shell_call_output, which the model then sees as its function's output. An output
// naming a call the conversation does not hold is OpenAI's 400, before the model is asked.
func TestShellLocalTwoTurns(t *testing.T) {
	t.Parallel()
	for name, tool := range map[string]map[string]any{
		"local":   {"type": "shell", "environment": map[string]any{"type": "local"}},
		"omitted": {"type": "shell"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.New(t)
			up.Script(runUserCommands)
			p := startProxy(t, setup{Upstream: up.URL(), WorkDir: workDir(t)}.yaml())
			tools := []any{tool}
			body, _ := json.Marshal(map[string]any{"model": clientModel, "input": "uname -s", "tools": tools})
			first := do(t, http.MethodPost, p.URL+"/v1/responses", body)
			var r1 struct {
				ID     string `json:"id"`
				Output []struct {
					Type        string          `json:"type"`
					CallID      string          `json:"call_id"`
					Environment json.RawMessage `json:"environment"`
					Action      struct {
						Commands []string `json:"commands"`
					} `json:"action"`
				} `json:"output"`
			}
			if err := json.Unmarshal(first.Body, &r1); err != nil || first.Status != 200 || len(r1.Output) != 1 ||
				r1.Output[0].Type != "shell_call" || strings.Join(r1.Output[0].Action.Commands, ";") != "uname -s" {
				t.Fatalf("first turn: %d %s", first.Status, first.Body)
			}
			// OpenAI names a local environment, and writes no environment key without one.
			wantEnv := `{"type":"local"}`
			if name == "omitted" {
				wantEnv = ""
			}
			if got := string(r1.Output[0].Environment); got != wantEnv {
				t.Errorf("the call's environment %q; want %q", got, wantEnv)
			}
			turn := func(callID string) rawResponse {
				body, _ := json.Marshal(map[string]any{"model": clientModel, "previous_response_id": r1.ID, "tools": tools,
					"input": []any{map[string]any{"type": "shell_call_output", "call_id": callID, "max_output_length": nil,
						"output": []any{map[string]any{"stdout": "Plan9\n", "stderr": "", "outcome": map[string]any{"type": "exit", "exit_code": 0}}}}}})
				return do(t, http.MethodPost, p.URL+"/v1/responses", body)
			}
			asked := len(up.Requests())
			bad := turn("call_unknown")
			if _, _, msg := apiError(t, bad.Body); bad.Status != 400 || msg != "No tool call found for shell call output with call_id call_unknown." {
				t.Errorf("a wrong call_id: %d %s", bad.Status, bad.Body)
			}
			if len(up.Requests()) != asked {
				t.Error("the model was asked for a refused turn")
			}
			good := turn(r1.Output[0].CallID)
			if good.Status != 200 || !strings.Contains(string(good.Body), `Done. [{\"outcome\":{\"type\":\"exit\",\"exit_code\":0},\"stderr\":\"\",\"stdout\":\"Plan9\\n\"}]`) {
				t.Errorf("the right call_id: %d %.2000s", good.Status, good.Body)
			}
		})
	}
}
