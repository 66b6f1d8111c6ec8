package e2e

import (
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox/daytonatest"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/opensandboxtest"
)

// sandboxTools are the sandbox backends every suite runs on: the embedded bubblewrap sandbox,
// e2b, Daytona and OpenSandbox through their doubles (each executing through a local sandbox of
// its own), and agent-sandbox through its double (bubblewrap pods running the kernel).
var sandboxTools = []string{"local", "e2b", "daytona", "opensandbox", "agent_sandbox"}

// engineDouble is a remote sandbox engine's double as the suites that inject its faults and
// account for its sandboxes and its key see it (TestReplicas, TestNoSecretLeaks): the e2b
// emulator, the Daytona double or the OpenSandbox double, behind a thin adapter each.
type engineDouble interface {
	// Tool is the sandbox tool's name in the configuration ("e2b", "daytona", "opensandbox").
	Tool() string
	// Configure adds the engine's sandbox tool to s, its key written as an os.environ/ reference,
	// and returns the environment the proxy needs for it.
	Configure(s *setup) []string
	// Key is the engine's API key: it belongs in the proxy's requests to the engine, nowhere else.
	Key() string
	// URL is the engine's API address, which a sandbox must not reach.
	URL() string
	// Live reports how many sandboxes the engine holds; Creates how many it created.
	Live() int
	Creates() int
	// FailNextCreates makes the next n creates answer status.
	FailNextCreates(n, status int)
	// Received returns the last request of each route the proxy creates and runs code through,
	// for a check that no proxy secret reached the engine; a route never called is missing.
	Received() []received
}

// received is one request an engine double received.
type received struct {
	Route string
	Text  string // its headers and body
	// InSandbox tells a request served inside the sandbox (e2b's envd, OpenSandbox's execd),
	// which must not carry the engine's key either.
	InSandbox bool
}

// newEngine starts the double of tool's engine, closed after every proxy the test starts later;
// nil for "local", which needs none.
func newEngine(t *testing.T, tool string) engineDouble {
	t.Helper()
	switch tool {
	case "e2b":
		emu, _ := newEmulator(t)
		return e2bEngine{emu}
	case "daytona":
		return daytonaEngine{newDaytona(t, tool)}
	case "opensandbox":
		osb, _ := newOpenSandbox(t, tool)
		return osbEngine{osb}
	case "agent_sandbox":
		return asEngine{newAgentSandbox(t, tool)}
	case "local":
		return nil
	}
	t.Fatalf("no engine double for the sandbox tool %q", tool)
	return nil
}

// e2bEngine adapts the e2b emulator.
type e2bEngine struct{ *e2btest.Server }

func (e e2bEngine) Tool() string { return "e2b" }
func (e e2bEngine) Key() string  { return e.APIKey() }

func (e e2bEngine) Configure(s *setup) []string {
	s.E2B, s.E2BKey = e.Server, "os.environ/E2E_E2B_KEY"
	return []string{"E2E_E2B_KEY=" + e.APIKey()}
}

func (e e2bEngine) FailNextCreates(n, status int) { e.Server.FailNextCreates(n, status, 0) }

func (e e2bEngine) Received() []received {
	var out []received
	for _, route := range []string{"POST /sandboxes", "49999 POST /execute"} {
		if req, ok := e.LastRequest(route); ok {
			out = append(out, received{route, mustJSON(req.Header) + string(req.Body), route != "POST /sandboxes"})
		}
	}
	return out
}

// daytonaEngine adapts the Daytona double.
type daytonaEngine struct{ *daytonatest.Server }

func (e daytonaEngine) Tool() string { return "daytona" }
func (e daytonaEngine) Key() string  { return e.APIKey() }

func (e daytonaEngine) Configure(s *setup) []string {
	s.Daytona, s.DaytonaKey = e.Server, "os.environ/E2E_DAYTONA_KEY"
	return []string{"E2E_DAYTONA_KEY=" + e.APIKey()}
}

func (e daytonaEngine) FailNextCreates(n, status int) { e.FailCreates(n, status) }

// Received holds the create's body only: the double records no more (the toolbox is reached
// through Daytona's proxy, with the API key, by design).
func (e daytonaEngine) Received() []received {
	if b := e.LastCreate(); b != nil {
		return []received{{"POST /sandbox", string(b), false}}
	}
	return nil
}

// osbEngine adapts the OpenSandbox double.
type osbEngine struct{ *opensandboxtest.Server }

func (e osbEngine) Tool() string { return "opensandbox" }
func (e osbEngine) Key() string  { return e.APIKey() }

func (e osbEngine) Configure(s *setup) []string {
	s.OSB = e.Server
	return []string{"OSB_E2E_KEY=" + e.APIKey()}
}

func (e osbEngine) FailNextCreates(n, status int) {
	for range n {
		e.Server.FailNextCreates(status)
	}
}

func (e osbEngine) Received() []received {
	var out []received
	for _, route := range []string{"POST /sandboxes", "POST /code"} {
		if h := e.LastHeader(route); h != nil {
			out = append(out, received{route, mustJSON(h) + string(e.LastBody(route)), route != "POST /sandboxes"})
		}
	}
	return out
}

// Compile-time checks: each adapter is an engineDouble.
var (
	_ engineDouble = e2bEngine{}
	_ engineDouble = daytonaEngine{}
	_ engineDouble = osbEngine{}
)
