package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestNodeOpenAIClient runs test/node/responses.test.mjs, which drives the proxy with the official
// openai npm package (responses.create, responses.stream, previous_response_id, retrieve,
// inputItems.list, delete), once against a model whose upstream speaks the Responses API and once
// against one whose upstream speaks only Chat Completions (as vLLM serves it), and
// test/node/agents.test.mjs, which runs an OpenAI Agents SDK agent with codeInterpreterTool
// against the latter. Each scripted model runs print(6 * 7) and then answers. It needs node and
// test/node/node_modules (scripts/deps.sh); it runs when CIPROXY_CLIENT_TESTS=1 (make test), and
// then their absence is a failure.
func TestNodeOpenAIClient(t *testing.T) {
	node := nodeForClientTests(t)
	dir := filepath.Join(repoRoot, "test", "node")
	for _, pkg := range []string{"openai", filepath.Join("@openai", "agents")} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			t.Fatalf("CIPROXY_CLIENT_TESTS=1 but the %s npm package is not installed; run scripts/deps.sh: %v", pkg, err)
		}
	}

	script := func(req upstreamtest.Request) upstreamtest.Turn {
		if n := len(req.History); n > 0 && itemType(req.History[n-1]) == "function_call_output" {
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("6 times 7 is 42.")}, Usage: answerUsage}
		}
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"print(6 * 7)"}`)}, Usage: callUsage}
	}
	up := upstreamtest.New(t)
	up.Script(script)
	chatUp := upstreamtest.New(t, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
	chatUp.Script(script)
	const chatModel = clientModel + "-chat"
	chatEntry := "  - model_name: " + chatModel + "\n    litellm_params:\n      model: openai/" + upstreamModel + "\n      api_base: " + chatUp.URL() +
		"\n    model_info:\n      supported_endpoints: [\"/v1/chat/completions\"]\n"
	p := startProxy(t, setup{Upstream: up.URL(), MasterKey: "sk-node-master", ExtraModels: chatEntry}.yaml())

	c, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, node, "--test", "--test-reporter=spec", "responses.test.mjs", "agents.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"CIPROXY_BASE_URL="+p.URL+"/v1",
		"CIPROXY_MODELS="+clientModel+","+chatModel,
		"CIPROXY_AGENTS_MODEL="+chatModel,
		"CIPROXY_API_KEY=sk-node-master",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test responses.test.mjs agents.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the Node client tests failed: %v", err)
	}

	// Every client request went through the proxy, two upstream iterations each: per model three
	// openai requests plus the continuation; for the chat model two agent runs besides.
	for _, tc := range []struct {
		name string
		up   *upstreamtest.Server
		want int
		path string
	}{{"Responses", up, 8, "/v1/responses"}, {"Chat Completions", chatUp, 12, "/v1/chat/completions"}} {
		reqs := tc.up.Requests()
		if len(reqs) != tc.want {
			t.Errorf("the %s upstream got %d requests, want %d (two per client request)", tc.name, len(reqs), tc.want)
		}
		streamed := 0
		for _, r := range reqs {
			if r.Path != tc.path {
				t.Errorf("the %s upstream got %s", tc.name, r.Path)
			}
			var stream bool
			_ = json.Unmarshal(r.Fields["stream"], &stream)
			if stream {
				streamed++
			}
		}
		if streamed == 0 {
			t.Errorf("no request to the %s upstream was streamed: streaming did not stream end to end", tc.name)
		}
	}
}

// TestNodeFilesRoundTrip runs test/node/files.test.mjs with the openai npm package on each
// backend: the Files API upload, the code that reads the CSV and writes a CSV and a PNG
// (filesModel), the citations, and the downloads through the Containers API.
func TestNodeFilesRoundTrip(t *testing.T) {
	node := nodeForClientTests(t)
	dir := filepath.Join(repoRoot, "test", "node")
	for _, tool := range sandboxTools {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.New(t)
			up.Script(filesModel)
			emu, _ := newEmulator(t)
			osb, osbEnv := newOpenSandbox(t, tool)
			p := startProxy(t, setup{Upstream: up.URL(), Tool: tool, E2B: emu, E2BKey: emu.APIKey(), OSB: osb, Daytona: newDaytona(t, tool), AgentSandbox: newAgentSandbox(t, tool), WorkDir: workDir(t), MasterKey: "sk-node-files"}.yaml(), osbEnv...)
			c, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(c, node, "--test", "--test-reporter=spec", "files.test.mjs")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "CIPROXY_BASE_URL="+p.URL+"/v1", "CIPROXY_MODEL="+clientModel, "CIPROXY_API_KEY=sk-node-files")
			out, err := cmd.CombinedOutput()
			t.Logf("node --test files.test.mjs:\n%s", out)
			if err != nil {
				t.Fatalf("the Node files test failed: %v", err)
			}
		})
	}
}

// TestNodeShell runs test/node/shell.test.mjs: the hosted shell tool with the openai npm package
// (create and stream) and the Agents SDK's shellTool, hosted and local, against a scripted model
// that runs `echo hi from shell` and then answers with what it saw, on each sandbox backend and
// each upstream API.
func TestNodeShell(t *testing.T) {
	node := nodeForClientTests(t)
	script := func(req upstreamtest.Request) upstreamtest.Turn {
		if n := len(req.History); n > 0 && itemType(req.History[n-1]) == "function_call_output" {
			return runUserCode(req) // "Done. " and what the model was told
		}
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("shell", `{"commands":["echo hi from shell"],"timeout_ms":null,"max_output_length":null}`)}, Usage: callUsage}
	}
	for _, tool := range sandboxTools {
		for _, api := range []string{"responses", "chat"} {
			t.Run(tool+"/"+api, func(t *testing.T) {
				t.Parallel()
				var opts []upstreamtest.Option
				if api == "chat" {
					opts = append(opts, upstreamtest.WithChatFlavour(upstreamtest.ChatVLLM))
				}
				up := upstreamtest.New(t, opts...)
				up.Script(script)
				emu, _ := newEmulator(t)
				osb, osbEnv := newOpenSandbox(t, tool)
				p := startProxy(t, setup{Upstream: up.URL(), Tool: tool, E2B: emu, E2BKey: emu.APIKey(), OSB: osb, Daytona: newDaytona(t, tool), AgentSandbox: newAgentSandbox(t, tool), WorkDir: workDir(t),
					ChatOnly: api == "chat", MasterKey: "sk-node-master"}.yaml(), osbEnv...)
				c, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(c, node, "--test", "--test-reporter=spec", "shell.test.mjs")
				cmd.Dir = filepath.Join(repoRoot, "test", "node")
				cmd.Env = append(os.Environ(), "CIPROXY_BASE_URL="+p.URL+"/v1", "CIPROXY_MODEL="+clientModel, "CIPROXY_API_KEY=sk-node-master")
				out, err := cmd.CombinedOutput()
				t.Logf("node --test shell.test.mjs:\n%s", out)
				if err != nil {
					t.Fatalf("the Node shell tests failed: %v", err)
				}
				if reqs := up.Requests(); len(reqs) == 0 || (api == "chat") != (reqs[0].Path == "/v1/chat/completions") {
					t.Errorf("the upstream got %d requests, not on the %s API", len(reqs), api)
				}
			})
		}
	}
}

// nodeForClientTests returns node for a test of the Node clients, which runs in parallel with
// the others; without CIPROXY_CLIENT_TESTS=1 the test is skipped, and with it a missing node fails.
func nodeForClientTests(t *testing.T) string {
	t.Helper()
	if os.Getenv("CIPROXY_CLIENT_TESTS") != "1" {
		t.Skip("the Node client test runs with CIPROXY_CLIENT_TESTS=1 (make test), after scripts/deps.sh installed test/node")
	}
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("CIPROXY_CLIENT_TESTS=1 but node is not installed (scripts/deps.sh installs it): %v", err)
	}
	return node
}
