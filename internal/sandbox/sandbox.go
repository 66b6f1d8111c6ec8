// Package sandbox is the contract between the proxy and its code-execution backends: what every
// backend offers (Provider, and FileSystem for the files under /mnt/data), what an execution returns
// (Result), the NDJSON decoder shared by all backends, the errors backends return, and the registry
// built from the config's sandbox_tools. The backends live below it (local, e2b); the OpenAI
// containers built on them (cntr_ ids, their lifecycle and files) are internal/containers. It
// imports no other package of the project but egress's policy type, so a backend compiles against
// the contract alone.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/ciproxy/ciproxy/internal/egress"
)

// Sentinel errors. Backends wrap them with %w; callers test with errors.Is.
var (
	// ErrUnavailable: a sandbox could not be created or reached (bad credentials, capacity,
	// backend down, tool not configured). Clients see 502 sandbox_unavailable.
	ErrUnavailable = errors.New("sandbox unavailable")
	// ErrNotFound: the sandbox or container is gone (expired, deleted) or belongs to someone else.
	ErrNotFound = errors.New("sandbox not found")
	// ErrTimeout: an execution did not finish within its timeout.
	ErrTimeout = errors.New("execution timed out")
	// ErrIncomplete: the execution stream ended before end_of_execution.
	ErrIncomplete = errors.New("execution stream ended early")
	// ErrRateLimited: the backend asked us to slow down.
	ErrRateLimited = errors.New("sandbox backend rate limited")
)

// Provider is one sandbox backend. Implementations are safe for concurrent use.
type Provider interface {
	// Create starts a sandbox. The handle carries everything needed to reach it later.
	Create(ctx context.Context, opts CreateOptions) (Handle, error)
	// Run executes code in the sandbox's persistent kernel and returns when it finishes.
	// A Python exception is not an error: it is Result.Error. An error return means the execution
	// could not run or complete (ErrTimeout, ErrIncomplete, ErrNotFound, ...); a Result with what
	// arrived so far is still returned alongside it.
	Run(ctx context.Context, h Handle, code string, opts RunOptions) (Result, error)
	// Delete stops the sandbox and frees its resources. Deleting what is already gone returns nil.
	Delete(ctx context.Context, h Handle) error
	// KeepAlive extends the sandbox's life to at least now+d (e2b: its timeout endpoint; local: no-op
	// or a note for the reaper).
	KeepAlive(ctx context.Context, h Handle, d time.Duration) error
}

// KernelRestarter is implemented by providers that can replace a sandbox's kernel by a fresh one
// and keep the sandbox and its files (local): the memory of an idle container's Python state is
// then given back (CreateOptions.KernelIdle). A provider that is not one (e2b) keeps its kernels
// until the container expires.
type KernelRestarter interface {
	// RestartKernel replaces the kernel of h by a fresh one, with none of the earlier executions'
	// state; a sandbox found gone is ErrNotFound.
	RestartKernel(ctx context.Context, h Handle) error
}

// Shell is implemented by providers that run shell commands in a sandbox beside its kernel, for
// the hosted shell tool. A command runs with bash (bash -c) in a fresh non-interactive shell, in
// the same sandbox as the kernel (its user, namespaces, cgroup, seccomp filter, limits and
// network), with the working directory DataDir, stdin closed, no TTY and an environment holding
// nothing of the proxy's.
type Shell interface {
	// Exec runs command in h and returns once it has ended and everything it started is gone. Its
	// stdout and stderr go to opts.OnOutput as they arrive; nothing of them is kept. At
	// opts.Timeout the command and every process it started are killed and the result says
	// TimedOut; when ctx ends they are killed too and ctx's error is returned. A command that ran
	// is not an error, whatever its exit status; an error means it could not run or its end is
	// unknown (ErrNotFound: the sandbox is gone; ErrUnavailable: the backend cannot be reached).
	Exec(ctx context.Context, h Handle, command string, opts ExecOptions) (ExecResult, error)
}

// ExecOptions are one command's choices.
type ExecOptions struct {
	// Timeout bounds the command; 0 means the backend default.
	Timeout time.Duration
	// OnOutput, when non-nil, is called with each piece of the command's output as it arrives,
	// from the goroutine that called Exec, before Exec returns. Each piece is valid UTF-8 (a
	// sequence cut between two reads is held for the next piece; invalid bytes become U+FFFD).
	OnOutput func(stream Stream, text string)
}

// Stream names one of a command's two outputs.
type Stream int

const (
	Stdout Stream = iota
	Stderr
)

// ExecResult is how a command ended.
type ExecResult struct {
	// ExitCode is the command's exit status; for a command killed by a signal, 128 plus the
	// signal's number, as a shell reports it. Meaningless when TimedOut.
	ExitCode int
	// TimedOut: the command was killed at ExecOptions.Timeout.
	TimedOut bool
}

// Handle identifies a live sandbox. It is kept in the container's store record (never shown to a
// client), so it holds only what is needed to reach the sandbox again, never a provider-wide
// credential such as an API key.
type Handle struct {
	Backend      string `json:"b"`           // "local" or "e2b"
	Tool         string `json:"t"`           // sandbox_tool_name that created it
	ID           string `json:"i"`           // backend sandbox id
	AccessToken  string `json:"a,omitempty"` // e2b envdAccessToken
	TrafficToken string `json:"r,omitempty"` // e2b trafficAccessToken
	Domain       string `json:"d,omitempty"` // e2b domain returned at create
}

// CreateOptions are per-sandbox choices.
type CreateOptions struct {
	// Name is the container's name, as the Containers API shows it. Providers ignore it.
	Name string
	// MemoryLimit is the request's container.memory_limit ("1g", "4g", ...); "" means the tool default.
	MemoryLimit string
	// Lifetime is how long the backend should keep the sandbox without a KeepAlive (e2b timeout).
	// 0 means the tool default.
	Lifetime time.Duration
	// Metadata is attached where the backend supports it. MetadataContainerID in it names the
	// container the sandbox is for.
	Metadata map[string]string
	// KernelIdle is how long the container's kernel may stay unused before containers.Manager restarts it
	// (a KernelRestarter's), keeping the files; 0: never. Providers ignore it.
	KernelIdle time.Duration
	// NetworkPolicy is the container's network_policy as its request asked it (nil: it asked
	// none), which containers.Manager narrows into Network (sandbox.NetworkPolicy). Providers
	// enforce Network; NetworkPolicy tells them only whether the request asked anything (a
	// backend with an operator-wide internet switch keeps it for the containers that asked none).
	NetworkPolicy *egress.Policy
	// Network is the container's network policy, already narrowed to the provider's bound
	// (Networked); the zero value is no network. A provider that is not Networked is given none.
	Network egress.Policy
}

// Networked is implemented by providers whose sandboxes can reach the network under a container's
// policy (CreateOptions.Network). A provider that is not one runs every sandbox without network,
// and a policy that opens any is refused before it is asked.
type Networked interface {
	// NetworkBound is the operator's bound on its containers' policies.
	NetworkBound() egress.Bound
	// DomainSecrets reports whether the provider can add domain secrets to its sandboxes'
	// requests; a policy with secrets is refused by one that cannot.
	DomainSecrets() bool
}

// RunOptions are per-execution choices.
type RunOptions struct {
	// Timeout bounds the execution; 0 means the backend default.
	Timeout time.Duration
	// OnMessage, when non-nil, is called for every decoded message as it arrives, from the goroutine
	// that called Run, before Run returns. It must not retain msg.
	OnMessage func(msg Message)
}

// Result is one execution's outcome, shaped like e2b's Execution.
type Result struct {
	Stdout         string     `json:"stdout"`
	Stderr         string     `json:"stderr"`
	Results        []Output   `json:"results"`
	Error          *ExecError `json:"error"`
	ExecutionCount int        `json:"execution_count"`
	// Truncated reports that output went over the cap and was cut (a note is appended to Stdout).
	Truncated bool `json:"truncated,omitempty"`
	// KernelRestarted reports that the container's kernel was restarted while idle
	// (CreateOptions.KernelIdle) since its last execution: this one ran without the Python state
	// of the earlier ones. Set by Container.Run.
	KernelRestarted bool `json:"-"`
}

// Output is one rich result (Jupyter execute_result or display_data).
type Output struct {
	Text         string          `json:"text,omitempty"`
	HTML         string          `json:"html,omitempty"`
	Markdown     string          `json:"markdown,omitempty"`
	SVG          string          `json:"svg,omitempty"`
	PNG          string          `json:"png,omitempty"`  // base64
	JPEG         string          `json:"jpeg,omitempty"` // base64
	PDF          string          `json:"pdf,omitempty"`
	LaTeX        string          `json:"latex,omitempty"`
	JSON         json.RawMessage `json:"json,omitempty"`
	JavaScript   string          `json:"javascript,omitempty"`
	Data         json.RawMessage `json:"data,omitempty"`
	Chart        json.RawMessage `json:"chart,omitempty"`
	Extra        json.RawMessage `json:"extra,omitempty"`
	IsMainResult bool            `json:"is_main_result"`
}

// ExecError is a Python exception raised by the executed code.
type ExecError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Message is one NDJSON line of e2b's code-interpreter /execute stream, which the local kernel
// also speaks. Type is one of stdout, stderr, result, error, number_of_executions, keepalive,
// end_of_execution; other types are passed through and otherwise ignored.
//
// Which fields are set depends on Type:
//   - stdout, stderr: Text (the chunk) and Timestamp.
//   - result: Output. The wire's "text" of a result lands in Output.Text, never in Text.
//   - error: ExecError.
//   - number_of_executions: ExecutionCount.
//
// Message has its own JSON methods because Text and Output.Text share the wire name "text": the
// default encoding would put a result's text into Message.Text. MarshalJSON writes the exact
// per-type shape e2b's server sends (fields in its order, None fields dropped, "extra" always present
// on a result).
type Message struct {
	Type           string `json:"type"`
	Text           string `json:"text,omitempty"`      // stdout/stderr chunk
	Timestamp      string `json:"timestamp,omitempty"` // stdout/stderr
	ExecutionCount int    `json:"execution_count,omitempty"`
	Output                // result fields (Output.Text is the result's text/plain)
	ExecError             // error fields
}

// MetadataContainerID is the CreateOptions.Metadata key naming the container a sandbox is created
// for: backends that keep metadata (e2b) store it, so that a sandbox whose record was never
// written (its process died in between) can be found by listing the backend's sandboxes; others
// use it to name the container in their logs.
const MetadataContainerID = "ciproxy_container_id"
