package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandboxtest"
	"github.com/ciproxy/ciproxy/internal/sandbox/daytonatest"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/sandbox/opensandboxtest"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// The model name clients use, and the name the proxy must send upstream instead.
const (
	clientModel   = "gpt-e2e"
	upstreamModel = "e2e-upstream-model"
)

// setup describes one proxy configuration.
type setup struct {
	Upstream    string // api_base of the model
	UpstreamKey string // api_key of the model, as written in the file ("" for none)
	MasterKey   string // general_settings.master_key as written ("" for none)
	// Tool is the sandbox tool that runs code: one of sandboxTools.
	Tool string
	// E2B, when set, adds an e2b tool pointing at the emulator (with E2BKey as its key as written).
	E2B    *e2btest.Server
	E2BKey string
	// OSB, when set, adds an opensandbox tool pointing at the OpenSandbox double (its key read
	// from OSB_E2E_KEY, LiteLLM style, which OSBEnv sets).
	OSB *opensandboxtest.Server
	// Daytona, when set, adds a daytona tool pointing at the double (newDaytona), with DaytonaKey
	// as its key as written (the double's key when "").
	Daytona    *daytonatest.Server
	DaytonaKey string
	// AgentSandbox, when set, adds an agent_sandbox tool on the agent-sandbox double
	// (newAgentSandbox), reached with its kubeconfig.
	AgentSandbox *agentsandboxtest.Server
	// AgentSandboxSettings are more litellm_params lines of the agent_sandbox tool ("key: value").
	AgentSandboxSettings []string
	// MaxBody is max_request_body_size ("" for the default).
	MaxBody string
	// ExtraModels is YAML appended to model_list.
	ExtraModels string
	// WorkDir is the local tool's work_dir ("" for the default).
	WorkDir string
	// ChatOnly declares the model's upstream a Chat Completions server
	// (model_info.supported_endpoints: ["/v1/chat/completions"]).
	ChatOnly bool
	// LocalSettings are more litellm_params lines of the local tool ("key: value").
	LocalSettings []string
	// Interception are more code_interpreter_interception_params lines ("key: value").
	Interception []string
}

// yaml renders the configuration file.
func (s setup) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "model_list:\n  - model_name: %s\n    litellm_params:\n      model: openai/%s\n      api_base: %s\n",
		clientModel, upstreamModel, s.Upstream)
	if s.UpstreamKey != "" {
		fmt.Fprintf(&b, "      api_key: %s\n", s.UpstreamKey)
	}
	if s.ChatOnly {
		b.WriteString("    model_info:\n      supported_endpoints: [\"/v1/chat/completions\"]\n")
	}
	b.WriteString(s.ExtraModels)
	// pool_size 1 keeps one warm kernel per proxy: tests run many proxies side by side.
	b.WriteString("sandbox_tools:\n  - sandbox_tool_name: local\n    litellm_params:\n      sandbox_provider: local\n      pool_size: 1\n")
	if s.WorkDir != "" {
		fmt.Fprintf(&b, "      work_dir: %s\n", s.WorkDir)
	}
	for _, kv := range append(imageSandboxSettings(), s.LocalSettings...) {
		fmt.Fprintf(&b, "      %s\n", kv)
	}
	if s.E2B != nil {
		fmt.Fprintf(&b, "  - sandbox_tool_name: e2b\n    litellm_params:\n      sandbox_provider: e2b\n      api_key: %s\n      api_base: %s\n      sandbox_url: %s\n",
			s.E2BKey, s.E2B.URL(), s.E2B.SandboxURL())
	}
	if s.OSB != nil {
		fmt.Fprintf(&b, "  - sandbox_tool_name: opensandbox\n    litellm_params:\n      sandbox_provider: opensandbox\n      api_key: os.environ/OSB_E2E_KEY\n      api_base: %s\n",
			s.OSB.URL())
	}
	if s.Daytona != nil {
		key := s.DaytonaKey
		if key == "" {
			key = s.Daytona.APIKey()
		}
		fmt.Fprintf(&b, "  - sandbox_tool_name: daytona\n    litellm_params:\n      sandbox_provider: daytona\n      api_key: %s\n      api_base: %s\n",
			key, s.Daytona.URL())
	}
	if d := s.AgentSandbox; d != nil {
		fmt.Fprintf(&b, "  - sandbox_tool_name: agent_sandbox\n    litellm_params:\n      sandbox_provider: agent_sandbox\n"+
			"      kubeconfig: %s\n      namespace: %s\n      warm_pool: %s\n      process_port: %d\n      files_port: %d\n",
			d.Kubeconfig(), d.Namespace(), d.WarmPool(), d.ProcessPort(), d.FilesPort())
		for _, kv := range s.AgentSandboxSettings {
			fmt.Fprintf(&b, "      %s\n", kv)
		}
	}
	tool := s.Tool
	if tool == "" {
		tool = "local"
	}
	fmt.Fprintf(&b, "litellm_settings:\n  callbacks: [\"code_interpreter_interception\"]\n  code_interpreter_interception_params:\n    sandbox_tool_name: %s\n", tool)
	for _, kv := range s.Interception {
		fmt.Fprintf(&b, "    %s\n", kv)
	}
	b.WriteString("general_settings:\n  shutdown_grace: 10s\n")
	if s.MasterKey != "" {
		fmt.Fprintf(&b, "  master_key: %s\n", s.MasterKey)
	}
	if s.MaxBody != "" {
		fmt.Fprintf(&b, "  max_request_body_size: %s\n", s.MaxBody)
	}
	return b.String()
}

// workDir returns a fresh directory for the local tool's sandboxes, which the sandbox user (not
// the test's) can traverse.
func workDir(t *testing.T) string {
	t.Helper()
	// Not under t.TempDir(): its parent is private to the test's user.
	// With an image under test (imageShare set), the directory is where the container sees it too,
	// and writable to the proxy's user there, like /tmp.
	dir, err := os.MkdirTemp(imageShare, "ciproxy-e2e-work-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	mode := os.FileMode(0o711)
	if testImage != "" {
		mode = 0o777 | os.ModeSticky
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "sandboxes")
}

// checkNoLeftovers fails the test when the local tool left anything in its work_dir (to be called
// after the proxy stopped: every sandbox must be gone with it).
func checkNoLeftovers(t *testing.T, dir string) {
	t.Helper()
	if left := entries(dir); len(left) > 0 {
		t.Errorf("the stopped proxy left %d entries in its sandbox work_dir, e.g. %s", len(left), left[0])
	}
}

// entries lists everything under dir.
func entries(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && path != dir {
			out = append(out, path)
		}
		return nil
	})
	return out
}

// newEmulator starts an e2b emulator executing through a real local sandbox. It is closed after
// every proxy the test starts later (cleanups run last-in first-out), so a proxy's shutdown can
// still delete its sandboxes there.
func newEmulator(t *testing.T) (*e2btest.Server, *local.Provider) {
	t.Helper()
	exec, err := local.New(local.Options{PoolSize: 1})
	if err != nil {
		t.Fatalf("local sandbox for the e2b emulator: %v", err)
	}
	emu := e2btest.New(exec)
	t.Cleanup(func() {
		emu.Close()
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec.Close(c); err != nil {
			t.Errorf("closing the emulator's sandboxes: %v", err)
		}
	})
	return emu, exec
}

// newOpenSandbox starts an OpenSandbox double executing through a real local sandbox, closed after
// every proxy the test starts later. With tool "opensandbox" it returns the double and the
// environment the proxy needs for it; else nil and none.
func newOpenSandbox(t *testing.T, tool string) (*opensandboxtest.Server, []string) {
	t.Helper()
	if tool != "opensandbox" {
		return nil, nil
	}
	exec, err := local.New(local.Options{PoolSize: 1})
	if err != nil {
		t.Fatalf("local sandbox for the OpenSandbox double: %v", err)
	}
	osb := opensandboxtest.New(exec)
	t.Cleanup(func() {
		osb.Close()
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec.Close(c); err != nil {
			t.Errorf("closing the double's sandboxes: %v", err)
		}
	})
	return osb, []string{"OSB_E2E_KEY=" + osb.APIKey()}
}

// Usage the scripted model reports for its two turns; the client must see the sums.
var (
	callUsage   = &upstreamtest.Usage{InputTokens: 100, CachedTokens: 20, OutputTokens: 10}
	answerUsage = &upstreamtest.Usage{InputTokens: 150, CachedTokens: 40, OutputTokens: 5}
)

// runUserCode is the scripted model used by most tests: the user's message is Python code, which
// the model runs with the stand-in function "python"; when it has seen the output it answers
// "Done." followed by that output.
func runUserCode(req upstreamtest.Request) upstreamtest.Turn {
	if len(req.History) > 0 {
		last := req.History[len(req.History)-1]
		if itemType(last) == "function_call_output" {
			var out struct {
				Output json.RawMessage `json:"output"`
			}
			_ = json.Unmarshal(last, &out)
			var s string
			if json.Unmarshal(out.Output, &s) != nil {
				s = string(out.Output)
			}
			return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Done. " + s)}, Usage: answerUsage}
		}
	}
	if req.Tool("python") == nil {
		// No code interpreter: a plain answer (pass-through requests).
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("plain answer")}, Usage: answerUsage}
	}
	args, _ := json.Marshal(map[string]string{"code": lastUserText(req)})
	return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", string(args))}, Usage: callUsage}
}

// lastUserText returns the text of the last user message in the request's history.
func lastUserText(req upstreamtest.Request) string {
	for i := len(req.History) - 1; i >= 0; i-- {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(req.History[i], &m) != nil || m.Role != "user" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var parts []struct{ Type, Text string }
		_ = json.Unmarshal(m.Content, &parts)
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

func itemType(raw json.RawMessage) string {
	var v struct{ Type, Role string }
	_ = json.Unmarshal(raw, &v)
	if v.Type == "" && v.Role != "" {
		return "message"
	}
	return v.Type
}

// peakRSS is the process's peak resident memory, in bytes (VmHWM).
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/pid/status")
	return 0
}
