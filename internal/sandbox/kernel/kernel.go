// Package kernel holds the persistent Python kernel every backend that brings its own interpreter
// runs (kernel.py): the local backend inside its bubblewrap sandboxes, and the backends whose
// engines run processes but no interpreter, from the sandbox image that carries it. One copy means
// results, images and tracebacks are the same bytes on each.
//
// The protocol (kernel.py's header says it whole): JSON request lines on stdin, the NDJSON of e2b's
// code-interpreter server on stdout, one {"type": "ready"} line once it can take code.
//
// kerneld.py wraps kernel.py for engines whose processes live only as long as one call: a daemon
// holds the kernel and a client per execution relays one request and its replies.
package kernel

import _ "embed"

//go:embed kernel.py
var source []byte

// Path is where a sandbox image carries kernel.py, and where the local backend binds it.
const Path = "/opt/ciproxy/kernel.py"

// Source returns kernel.py. The slice is shared: callers must not modify it.
func Source() []byte { return source }

//go:embed kerneld.py
var daemonSource []byte

// DaemonPath is where a sandbox image carries kerneld.py, beside kernel.py: the daemon that keeps
// one kernel alive across the short-lived processes of an engine that binds each process to one
// call (agent-sandbox's sandboxd), and its client (kerneld.py's header says how).
const DaemonPath = "/opt/ciproxy/kerneld.py"

// DaemonSource returns kerneld.py. The slice is shared: callers must not modify it.
func DaemonSource() []byte { return daemonSource }
