package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/ciproxy/ciproxy/internal/testutil/streamcheck"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// The operator's stand-in for the shell tool in TestShellMatrix: a name and a description of its
// own, which the model must be offered instead of the built-in ones.
const (
	matrixShellName = "run_shell"
	matrixShellDesc = "Runs the e2e test's shell commands in its container."
)

// shellScenarios is the scripted model of TestShellMatrix: the user's message names a scenario,
// and the number of outputs the model has seen since that message says how far it is.
func shellScenarios(req upstreamtest.Request) upstreamtest.Turn {
	seen, last := outputsSinceUser(req.History)
	sh := func(args string) upstreamtest.Item { return upstreamtest.FunctionCall(matrixShellName, args) }
	answer := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Done. " + last)}, Usage: answerUsage}
	call := func(items ...upstreamtest.Item) upstreamtest.Turn {
		return upstreamtest.Turn{Items: items, Usage: callUsage}
	}
	switch lastUserText(req) {
	case "share": // shell writes a file, code reads it, the answer cites it
		switch seen {
		case 0:
			return call(sh(`{"commands":["echo 42 > n.txt"],"timeout_ms":null,"max_output_length":null}`))
		case 1:
			return call(upstreamtest.FunctionCall("python", `{"code":"print(open('/mnt/data/n.txt').read().strip() + '!')"}`))
		}
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Here: [n](sandbox:/mnt/data/n.txt)")}, Usage: answerUsage}
	case "reuse": // the container of the conversation, with the file of "share"
		if seen == 0 {
			return call(sh(`{"commands":["cat n.txt"],"timeout_ms":null,"max_output_length":null}`))
		}
	case "bound": // more output than the call's max_output_length
		if seen == 0 {
			return call(sh(`{"commands":["seq 1 3000"],"timeout_ms":null,"max_output_length":120}`))
		}
	case "slow": // a timeout_ms above the operator's execution_timeout
		if seen == 0 {
			return call(sh(`{"commands":["echo started; sleep 30"],"timeout_ms":600000,"max_output_length":null}`))
		}
	case "two": // two calls in one turn, past max_calls_per_turn 1
		if seen == 0 {
			return call(sh(`{"commands":["echo one"],"timeout_ms":null,"max_output_length":null}`),
				sh(`{"commands":["echo two"],"timeout_ms":null,"max_output_length":null}`))
		}
	case "stream": // a command the model writes in pieces
		if seen == 0 {
			return call(sh(`{"commands":["echo streamed","echo twice"],"timeout_ms":null,"max_output_length":null}`))
		}
	}
	return answer
}

// outputsSinceUser counts the function outputs after the last user message of history, and
// returns the last one's text.
func outputsSinceUser(history []json.RawMessage) (n int, last string) {
	for i := len(history) - 1; i >= 0; i-- {
		switch itemType(history[i]) {
		case "function_call_output":
			if n == 0 {
				var out struct {
					Output json.RawMessage `json:"output"`
				}
				_ = json.Unmarshal(history[i], &out)
				if json.Unmarshal(out.Output, &last) != nil {
					last = string(out.Output)
				}
			}
			n++
		case "message":
			var m struct{ Role string }
			if json.Unmarshal(history[i], &m) == nil && m.Role == "user" {
				return n, last
			}
		}
	}
	return n, last
}

// TestShellMatrix drives the hosted shell tool through the real binary with openai-go, on each
// sandbox backend and each upstream API, with an operator's configuration (its own stand-in name
// and description, execution_timeout 5s, max_calls_per_turn 1): shell and code interpreter
// sharing a container in one request, a file the commands wrote cited and downloaded,
// container_auto reusing the conversation's container through previous_response_id and on a
// stateless replay, output bounded by max_output_length, timeout_ms capped by execution_timeout,
// shell calls counted by the per-turn budget, a forced tool_choice, and the command deltas'
// obfuscation as stream_options says.
func TestShellMatrix(t *testing.T) {
	t.Parallel()
	for _, tool := range sandboxTools {
		for _, api := range []string{"responses", "chat"} {
			t.Run(tool+"/"+api, func(t *testing.T) {
				t.Parallel()
				var opts []upstreamtest.Option
				if api == "chat" {
					opts = append(opts, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
				}
				up := upstreamtest.New(t, opts...)
				up.Script(shellScenarios)
				emu, _ := newEmulator(t)
				osb, osbEnv := newOpenSandbox(t, tool)
				p := startProxy(t, setup{Upstream: up.URL(), Tool: tool, E2B: emu, E2BKey: emu.APIKey(), OSB: osb, Daytona: newDaytona(t, tool), AgentSandbox: newAgentSandbox(t, tool), WorkDir: workDir(t), ChatOnly: api == "chat",
					Interception: []string{"execution_timeout: 5s", "max_calls_per_turn: 1", "shell_function_name: " + matrixShellName,
						"shell_function_description: " + matrixShellDesc}}.yaml(), osbEnv...)
				client := sdk(p, "sk-client-a")
				wantPath := "/v1/responses"
				if api == "chat" {
					wantPath = "/v1/chat/completions"
				}
				lastRequest := func(t *testing.T) upstreamtest.Request {
					t.Helper()
					reqs := up.Requests()
					if len(reqs) == 0 || reqs[len(reqs)-1].Path != wantPath {
						t.Fatalf("the upstream got %d requests, the last not to %s", len(reqs), wantPath)
					}
					return reqs[len(reqs)-1]
				}

				// Shell and code interpreter in one request share the container; the file the
				// commands wrote is the code's to read, and a container file the answer cites.
				share := shellParams("share")
				share.Tools = append(share.Tools, responses.ToolUnionParam{OfCodeInterpreter: &responses.ToolCodeInterpreterParam{
					Container: responses.ToolCodeInterpreterContainerUnionParam{OfCodeInterpreterToolAuto: &responses.ToolCodeInterpreterContainerCodeInterpreterContainerAutoParam{}}}})
				share.Include = []responses.ResponseIncludable{responses.ResponseIncludableCodeInterpreterCallOutputs}
				r, err := client.Responses.New(ctx(t, 120*time.Second), share)
				if err != nil {
					t.Fatalf("share: %v", err)
				}
				if len(r.Output) != 4 || r.Output[0].Type != "shell_call" || r.Output[1].Type != "shell_call_output" ||
					r.Output[2].Type != "code_interpreter_call" || r.Output[3].Type != "message" {
					t.Fatalf("share: output %s", r.RawJSON())
				}
				cntr := r.Output[0].AsShellCall().Environment.ContainerID
				ci := r.Output[2].AsCodeInterpreterCall()
				if !strings.HasPrefix(cntr, "cntr_") || ci.ContainerID != cntr {
					t.Errorf("share: shell ran in %q, code in %q; want one container", cntr, ci.ContainerID)
				}
				if len(ci.Outputs) != 1 || ci.Outputs[0].Logs != "42!\n" {
					t.Errorf("share: the code's outputs %s; want the file the commands wrote", ci.RawJSON())
				}
				ann := r.Output[3].AsMessage().Content[0].AsOutputText().Annotations
				if len(ann) != 1 || ann[0].Type != "container_file_citation" || ann[0].ContainerID != cntr || ann[0].Filename != "n.txt" {
					t.Fatalf("share: annotations %+v; want a citation of n.txt", ann)
				}
				content, err := client.Containers.Files.Content.Get(ctx(t, 30*time.Second), cntr, ann[0].FileID)
				if err != nil {
					t.Fatalf("share: download: %v", err)
				}
				body, _ := io.ReadAll(content.Body)
				content.Body.Close()
				if string(body) != "42\n" {
					t.Errorf("share: n.txt = %q", body)
				}
				req := lastRequest(t)
				if fn := req.Tool(matrixShellName); !bytes.Contains(fn, []byte(`"description":"`+matrixShellDesc+`"`)) {
					t.Errorf("the model was offered %s; want the operator's description", fn)
				}
				if req.Tool("shell") != nil {
					t.Error("the model was offered the built-in stand-in name besides the operator's")
				}

				// container_auto continues in the conversation's container: along
				// previous_response_id, and on a stateless replay of the same items.
				reuse := shellParams("reuse")
				reuse.PreviousResponseID = openai.String(r.ID)
				r2, err := client.Responses.New(ctx(t, 120*time.Second), reuse)
				if err != nil {
					t.Fatalf("reuse: %v", err)
				}
				if got := r2.Output[0].AsShellCall().Environment.ContainerID; got != cntr || r2.Output[1].AsShellCallOutput().Output[0].Stdout != "42\n" {
					t.Errorf("reuse along previous_response_id: container %s, output %s; want %s and its file", got, r2.Output[1].RawJSON(), cntr)
				}
				input := []json.RawMessage{json.RawMessage(`{"role":"user","content":"share"}`)}
				for _, it := range r.Output {
					input = append(input, json.RawMessage(it.RawJSON()))
				}
				input = append(input, json.RawMessage(`{"role":"user","content":"reuse"}`))
				replay, _ := json.Marshal(map[string]any{"model": clientModel, "store": false, "input": input,
					"tools": []any{map[string]any{"type": "shell", "environment": map[string]any{"type": "container_auto"}}}})
				raw := do(t, http.MethodPost, p.URL+"/v1/responses", replay, "Authorization: Bearer sk-client-a")
				var r3 responses.Response
				if err := json.Unmarshal(raw.Body, &r3); err != nil || raw.Status != 200 || len(r3.Output) < 2 {
					t.Fatalf("replay: %d %.1000s", raw.Status, raw.Body)
				}
				if got := r3.Output[0].AsShellCall().Environment.ContainerID; got != cntr || r3.Output[1].AsShellCallOutput().Output[0].Stdout != "42\n" {
					t.Errorf("reuse on a stateless replay: container %s, output %s; want %s and its file", got, r3.Output[1].RawJSON(), cntr)
				}

				// The call's max_output_length bounds what is kept: the start and the end of
				// the output around the mark of the cut, echoed on both items.
				r4, err := client.Responses.New(ctx(t, 120*time.Second), shellParams("bound"))
				if err != nil {
					t.Fatalf("bound: %v", err)
				}
				call4, out4 := r4.Output[0].AsShellCall(), r4.Output[1].AsShellCallOutput()
				got := out4.Output[0].Stdout
				if call4.Action.MaxOutputLength != 120 || out4.MaxOutputLength != 120 || !strings.HasPrefix(got, "1\n2\n3\n") ||
					!strings.HasSuffix(got, "2999\n3000\n") || !strings.Contains(got, "characters omitted") || len(got) > 220 {
					t.Errorf("bound: call %s\noutput %s", call4.RawJSON(), out4.RawJSON())
				}

				// A timeout_ms above execution_timeout is held to it: the command is stopped
				// after 5 s, with what it printed kept.
				r5, err := client.Responses.New(ctx(t, 120*time.Second), shellParams("slow"))
				if err != nil {
					t.Fatalf("slow: %v", err)
				}
				if call5, e := r5.Output[0].AsShellCall(), r5.Output[1].AsShellCallOutput().Output; call5.Action.TimeoutMs != 600000 ||
					len(e) != 1 || e[0].Outcome.Type != "timeout" || e[0].Stdout != "started\n" {
					t.Errorf("slow: %s; want the model's timeout_ms echoed and the command stopped by execution_timeout", r5.RawJSON())
				}

				// Shell calls count in max_calls_per_turn: the second call of the turn is
				// shown, not run, and the model is told why. Each call is followed by its output.
				r6, err := client.Responses.New(ctx(t, 120*time.Second), shellParams("two"))
				if err != nil {
					t.Fatalf("two: %v", err)
				}
				types := make([]string, len(r6.Output))
				for i, it := range r6.Output {
					types[i] = it.Type
				}
				if strings.Join(types, ",") != "shell_call,shell_call_output,shell_call,shell_call_output,message" {
					t.Fatalf("two: output %s", r6.RawJSON())
				}
				first, second := r6.Output[1].AsShellCallOutput(), r6.Output[3].AsShellCallOutput()
				if first.Status != "completed" || first.Output[0].Stdout != "one\n" || second.Status != "incomplete" || len(second.Output) != 0 {
					t.Errorf("two: outputs %s\n%s", first.RawJSON(), second.RawJSON())
				}
				if body := lastRequest(t).Body; !bytes.Contains(body, []byte("max_calls_per_turn")) || bytes.Contains(body, []byte(`two\\n`)) {
					t.Errorf("two: the model was told %.2000s; want the per-turn limit, and no output of the second call", body)
				}

				// tool_choice {"type":"shell"} forces the operator's stand-in on the upstream
				// and is echoed as sent.
				forced := shellParams("stream")
				forced.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{OfSpecificShellToolChoice: &responses.ToolChoiceShellParam{}}
				before := len(up.Requests())
				r7, err := client.Responses.New(ctx(t, 120*time.Second), forced)
				if err != nil {
					t.Fatalf("forced: %v", err)
				}
				if r7.ToolChoice.RawJSON() != `{"type":"shell"}` {
					t.Errorf("forced: tool_choice echoed as %s", r7.ToolChoice.RawJSON())
				}
				want := `{"type":"function","name":"` + matrixShellName + `"}`
				if api == "chat" {
					want = `{"type":"function","function":{"name":"` + matrixShellName + `"}}`
				}
				reqs := up.Requests()
				if len(reqs) < before+2 {
					t.Fatalf("forced: %d upstream requests", len(reqs)-before)
				}
				if got := string(reqs[before].ToolChoice); got != want {
					t.Errorf("forced: the first turn's tool_choice %s; want %s", got, want)
				}
				if got := string(reqs[before+1].ToolChoice); got == want {
					t.Errorf("forced: the turn after the call still forces the stand-in (%s), so the model could never answer", got)
				}

				// Command deltas carry obfuscation unless stream_options turns it off.
				for _, obfuscate := range []bool{true, false} {
					fields := map[string]any{"model": clientModel, "input": "stream", "stream": true,
						"tools": []any{map[string]any{"type": "shell", "environment": map[string]any{"type": "container_reference", "container_id": cntr}}}}
					if !obfuscate {
						fields["stream_options"] = map[string]any{"include_obfuscation": false}
					}
					body, _ := json.Marshal(fields)
					resp := do(t, http.MethodPost, p.URL+"/v1/responses", body, "Authorization: Bearer sk-client-a")
					if _, err := streamcheck.Check(resp.Body); resp.Status != 200 || err != nil {
						t.Fatalf("stream (obfuscation %v): %d %v\n%.2000s", obfuscate, resp.Status, err, resp.Body)
					}
					deltas, padded := 0, 0
					sc := bufio.NewScanner(bytes.NewReader(resp.Body))
					for sc.Scan() {
						data, ok := strings.CutPrefix(sc.Text(), "data: ")
						if !ok {
							continue
						}
						var ev struct {
							Type        string  `json:"type"`
							Obfuscation *string `json:"obfuscation"`
						}
						if json.Unmarshal([]byte(data), &ev) != nil || ev.Type != "response.shell_call_command.delta" {
							continue
						}
						deltas++
						if ev.Obfuscation != nil {
							padded++
						}
					}
					if deltas == 0 || (obfuscate && padded != deltas) || (!obfuscate && padded != 0) {
						t.Errorf("stream (obfuscation %v): %d command deltas, %d with obfuscation", obfuscate, deltas, padded)
					}
				}
			})
		}
	}
}
