package intercept

// The hosted shell tool: its stand-in function, its items and events (in OpenAI's key order,
// docs/wire-openai.md), and its calls as the translator streams them.

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ciproxy/ciproxy/internal/intercept/argstream"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// shellTool is the request's shell tool as the proxy handles it.
type shellTool struct {
	fn     string // the stand-in function's name; "" without a shell tool the proxy handles
	hosted bool   // container_auto or container_reference: the proxy runs the commands
	local  bool   // environment {"type":"local"}; neither: the tool had no environment
}

// Event types of the shell tool.
const (
	evShellCommandAdded = "response.shell_call_command.added"
	evShellCommandDelta = "response.shell_call_command.delta"
	evShellCommandDone  = "response.shell_call_command.done"
	evShellOutputDelta  = "response.shell_call_output_content.delta"
	evShellOutputDone   = "response.shell_call_output_content.done"
)

// shellDescription teaches the model the stand-in for the shell tool.
const shellDescription = "Run shell commands in this conversation's container (Debian, the same one the " +
	"python tool uses, if there is one). Each command runs with bash in a fresh non-interactive shell: " +
	"working directory /mnt/data, no TTY, no stdin; cd and variables do not carry over from one command to " +
	"the next, files do. Commands run one after the other; each one's stdout, stderr and exit code (or its " +
	"timeout) come back. Files saved in /mnt/data can be given to the user: link them in your answer, e.g. " +
	"[report.txt](sandbox:/mnt/data/report.txt). "

// shellParameters is the stand-in's JSON schema, strict: all three keys are sent, null when unset.
type shellParameters struct {
	Type       string `json:"type"`
	Properties struct {
		Commands struct {
			Type        string `json:"type"`
			Items       schema `json:"items"`
			Description string `json:"description"`
		} `json:"commands"`
		TimeoutMS       schemaNullable `json:"timeout_ms"`
		MaxOutputLength schemaNullable `json:"max_output_length"`
	} `json:"properties"`
	Required             []string `json:"required"`
	AdditionalProperties bool     `json:"additionalProperties"`
}

type schema struct {
	Type string `json:"type"`
}

type schemaNullable struct {
	Type        []string `json:"type"`
	Description string   `json:"description"`
}

type shellFunctionTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  shellParameters `json:"parameters"`
	Strict      bool            `json:"strict"`
}

// shellStandIn returns the function tool that replaces the shell tool upstream.
func shellStandIn(name, description, network string) []byte {
	if description == "" {
		description = shellDescription + network
	}
	t := shellFunctionTool{Type: "function", Name: name, Description: description, Strict: true}
	p := &t.Parameters
	p.Type = "object"
	p.Properties.Commands.Type = "array"
	p.Properties.Commands.Items = schema{Type: "string"}
	p.Properties.Commands.Description = "The commands to run, in order."
	p.Properties.TimeoutMS = schemaNullable{Type: []string{"integer", "null"}, Description: "The time limit of each command in milliseconds, or null for the default."}
	p.Properties.MaxOutputLength = schemaNullable{Type: []string{"integer", "null"}, Description: "How many characters of each command's output (stdout and stderr together) to return, or null for the default."}
	p.Required = []string{"commands", "timeout_ms", "max_output_length"}
	return marshal(t)
}

// shellAction is a shell_call's action, and the stand-in's arguments.
type shellAction struct {
	Commands        []string `json:"commands"`
	MaxOutputLength *int64   `json:"max_output_length"`
	TimeoutMS       *int64   `json:"timeout_ms"`
}

// shellEnvironment is a shell_call's environment.
type shellEnvironment struct {
	Type        string `json:"type"`
	ContainerID string `json:"container_id,omitempty"`
}

type shellCallItem struct {
	ID          string            `json:"id"`
	Type        string            `json:"type"`
	Status      string            `json:"status"`
	Action      shellAction       `json:"action"`
	CallID      string            `json:"call_id"`
	Environment *shellEnvironment `json:"environment,omitempty"`
}

// shellEntry is one command's entry in a shell_call_output's output.
type shellEntry struct {
	Outcome shellOutcome `json:"outcome"`
	Stderr  string       `json:"stderr"`
	Stdout  string       `json:"stdout"`
}

type shellOutcome struct {
	Type     string `json:"type"` // "exit" or "timeout"
	ExitCode *int   `json:"exit_code,omitempty"`
}

type shellOutputItem struct {
	ID              string       `json:"id"`
	Type            string       `json:"type"`
	Status          string       `json:"status"`
	CallID          string       `json:"call_id"`
	MaxOutputLength *int64       `json:"max_output_length"`
	Output          []shellEntry `json:"output"`
}

// environment is what the calls of the request's shell tool show: the container for a hosted
// tool (container_auto too: the only variant that names it), local, or none.
func (t *translator) environment() *shellEnvironment {
	switch {
	case t.req.shell.hosted:
		return &shellEnvironment{Type: "container_reference", ContainerID: t.container}
	case t.req.shell.local:
		return &shellEnvironment{Type: "local"}
	}
	return nil
}

// commandEvent is shell_call_command.added and .done.
type commandEvent struct {
	head
	OutputIndex  int    `json:"output_index"`
	CommandIndex int    `json:"command_index"`
	Command      string `json:"command"`
}

func (e commandEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendMarshalled(dst, e)
}

// commandDeltaEvent is shell_call_command.delta.
type commandDeltaEvent struct {
	head
	OutputIndex  int    `json:"output_index"`
	CommandIndex int    `json:"command_index"`
	Delta        string `json:"delta"`
	Obfuscation  string `json:"obfuscation,omitempty"`
}

func (e commandDeltaEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendMarshalled(dst, e)
}

// outputDelta is what shell_call_output_content.delta carries: only the stream that has text.
type outputDelta struct {
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
}

type outputDeltaEvent struct {
	head
	ItemID       string      `json:"item_id"`
	OutputIndex  int         `json:"output_index"`
	CommandIndex int         `json:"command_index"`
	Delta        outputDelta `json:"delta"`
}

func (e outputDeltaEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendMarshalled(dst, e)
}

type outputDoneEvent struct {
	head
	ItemID       string       `json:"item_id"`
	OutputIndex  int          `json:"output_index"`
	CommandIndex int          `json:"command_index"`
	Output       []shellEntry `json:"output"`
}

func (e outputDoneEvent) appendJSON(dst []byte, seq int) []byte {
	e.SequenceNumber = seq
	return appendMarshalled(dst, e)
}

// obfuscation pads a command delta as OpenAI's delta events are padded, so that their sizes do
// not give their content away; stream_options.include_obfuscation false turns it off.
func obfuscation(delta string) string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	n := 16 - len(delta)%16
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return string(b)
}

// startShellCall announces a stand-in call of the shell tool as a shell_call: in progress, no
// commands yet, and the environment (the container handed over) it runs in.
func (t *translator) startShellCall(s *slot) []Event {
	s.dec = argstream.NewStrings("commands")
	s.ciID = t.mint("sh_")
	t.started++
	item := shellCallItem{ID: s.ciID, Type: "shell_call", Status: "in_progress", Action: shellAction{Commands: []string{}},
		CallID: s.callID, Environment: t.environment()}
	if t.req.shell.hosted {
		t.reserveOutput(s)
	}
	return []Event{newItemEvent(evItemAdded, s.index, marshal(item))}
}

// reserveOutput keeps the client output_index after hosted call s for its shell_call_output.
// An upstream that numbered a later item before this one has taken it: the output then goes
// after every item, where it cannot collide.
func (t *translator) reserveOutput(s *slot) {
	for _, o := range t.slots {
		if o != nil && o != s && o.index == s.index+1 {
			return
		}
	}
	s.outIndex = s.index + 1
	for len(t.out) <= s.outIndex {
		t.out = append(t.out, nil)
	}
}

// feedCommands streams a chunk of a shell call's arguments as command events: each command
// added, its deltas, its done, before the next one is added.
func (t *translator) feedCommands(s *slot, chunk string) []Event {
	var evs []Event
	for _, p := range s.dec.Pieces(chunk) {
		if p.Elem == len(s.commands) {
			s.commands = append(s.commands, "")
			evs = append(evs, t.commandEvent(evShellCommandAdded, s, p.Elem, ""))
		}
		if p.Text != "" {
			s.commands[p.Elem] += p.Text
			evs = append(evs, t.commandDelta(s, p.Elem, p.Text))
		}
		if p.Done {
			s.cmdDone = p.Elem + 1
			evs = append(evs, t.commandEvent(evShellCommandDone, s, p.Elem, s.commands[p.Elem]))
		}
	}
	return evs
}

func (t *translator) commandEvent(typ string, s *slot, k int, command string) Event {
	return Event{Type: typ, minted: commandEvent{head: head{Type: typ}, OutputIndex: s.index, CommandIndex: k, Command: command}}
}

func (t *translator) commandDelta(s *slot, k int, delta string) Event {
	ev := commandDeltaEvent{head: head{Type: evShellCommandDelta}, OutputIndex: s.index, CommandIndex: k, Delta: delta}
	if t.req.obfuscate {
		ev.Obfuscation = obfuscation(delta)
	}
	return Event{Type: evShellCommandDelta, minted: ev}
}

// commandsDone fixes a shell call's action from its complete arguments, and sends the command
// events the stream did not (arguments that came whole, or commands cut short).
func (t *translator) commandsDone(s *slot, args string) []Event {
	if s.parseErr = t.sizeErr(s, len(args)); s.parseErr == nil {
		s.action, s.parseErr = parseShellArgs(args)
	}
	if s.parseErr != nil {
		s.action = shellAction{Commands: s.commands} // nothing runs; shown as far as it was read
	}
	if s.action.Commands == nil {
		s.action.Commands = []string{}
	}
	var evs []Event
	for k, cmd := range s.action.Commands {
		if k == len(s.commands) {
			s.commands = append(s.commands, "")
			evs = append(evs, t.commandEvent(evShellCommandAdded, s, k, ""))
		}
		if k < s.cmdDone {
			continue
		}
		if rest, ok := strings.CutPrefix(cmd, s.commands[k]); ok && rest != "" {
			evs = append(evs, t.commandDelta(s, k, rest))
		}
		s.commands[k] = cmd
		evs = append(evs, t.commandEvent(evShellCommandDone, s, k, cmd))
		s.cmdDone = k + 1
	}
	return evs
}

// parseShellArgs reads the stand-in's arguments: a non-empty list of commands, and the two
// optional numbers (null or absent: unset). Keys match exactly, as the model was told them.
func parseShellArgs(args string) (shellAction, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		return shellAction{}, err
	}
	var a shellAction
	if err := json.Unmarshal(m["commands"], &a.Commands); err != nil || len(a.Commands) == 0 {
		return shellAction{}, errors.New(`"commands" must be a non-empty array of strings`)
	}
	for _, f := range []struct {
		key string
		dst **int64
	}{{"timeout_ms", &a.TimeoutMS}, {"max_output_length", &a.MaxOutputLength}} {
		raw, ok := m[f.key]
		if !ok || string(raw) == "null" {
			continue
		}
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
			return shellAction{}, fmt.Errorf("%q must be a non-negative integer or null", f.key)
		}
		*f.dst = &n
	}
	return a, nil
}

// shellCallDone sends the finished shell_call.
func (t *translator) shellCallDone(s *slot) []Event {
	item := marshal(shellCallItem{ID: s.ciID, Type: "shell_call", Status: statusCompleted, Action: s.action, CallID: s.callID, Environment: t.environment()})
	t.out[s.index] = item
	return []Event{newItemEvent(evItemDone, s.index, item)}
}

// shellRun is the shell_call_output of one call as it is produced: its item follows the call.
type shellRun struct {
	index  int
	id     string
	callID string
	max    *int64
	output []shellEntry
}

// startShellOutput opens the shell_call_output of call ref.
func (t *translator) startShellOutput(ref int) (*shellRun, Event) {
	s := t.slots[ref]
	run := &shellRun{index: s.outIndex, id: t.mint("sho_"), callID: s.callID, max: s.action.MaxOutputLength, output: []shellEntry{}}
	if run.index < 0 || t.out[run.index] != nil {
		run.index = len(t.out)
		t.out = append(t.out, nil)
	}
	return run, newItemEvent(evItemAdded, run.index, run.item(statusCompleted))
}

func (run *shellRun) item(status string) []byte {
	return marshal(shellOutputItem{ID: run.id, Type: "shell_call_output", Status: status, CallID: run.callID, MaxOutputLength: run.max, Output: run.output})
}

// delta is a piece of command k's output.
func (run *shellRun) delta(k int, st sandbox.Stream, text string) Event {
	d := outputDelta{Stdout: text}
	if st == sandbox.Stderr {
		d = outputDelta{Stderr: text}
	}
	return Event{Type: evShellOutputDelta, minted: outputDeltaEvent{head{Type: evShellOutputDelta}, run.id, run.index, k, d}}
}

// commandDone records command k's entry.
func (run *shellRun) commandDone(k int, e shellEntry) Event {
	run.output = append(run.output, e)
	return Event{Type: evShellOutputDone, minted: outputDoneEvent{head{Type: evShellOutputDone}, run.id, run.index, k, []shellEntry{e}}}
}

// done closes the item.
func (t *translator) shellOutputDone(run *shellRun, status string) Event {
	item := run.item(status)
	t.out[run.index] = item
	return newItemEvent(evItemDone, run.index, item)
}
