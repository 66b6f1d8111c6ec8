package intercept

// The hosted shell tool: its stand-in function, its items and events (in OpenAI's key order,
// docs/wire-openai.md), and the bound on what one command's output keeps.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/intercept/argstream"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
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

// shellOutput gathers one command's output under its bound: the first and the last characters
// of each stream are kept, whatever the command writes, in memory bounded by the limit.
type shellOutput struct {
	limit    int // characters of stdout and stderr together
	streamed int // characters streamed to the client so far
	streams  [2]boundedText
}

func newShellOutput(limit int) *shellOutput {
	o := &shellOutput{limit: limit}
	o.streams[sandbox.Stdout].keep = limit
	o.streams[sandbox.Stderr].keep = limit
	return o
}

// add takes a piece of output and returns the part of it to stream: none once the command has
// streamed its bound.
func (o *shellOutput) add(s sandbox.Stream, text string) string {
	o.streams[s].add(text)
	left := o.limit - o.streamed
	if left <= 0 {
		return ""
	}
	n := utf8.RuneCountInString(text)
	if n > left {
		text = cutRunes(text, left)
		n = left
	}
	o.streamed += n
	return text
}

// entry returns the command's output entry: each stream whole when both fit the bound together,
// else each cut to its share (half the bound, and what the other leaves unused) with its head and
// tail kept around a line that says how much was left out.
func (o *shellOutput) entry(outcome shellOutcome) shellEntry {
	out, errs := &o.streams[sandbox.Stdout], &o.streams[sandbox.Stderr]
	if out.n+errs.n <= o.limit {
		return shellEntry{Outcome: outcome, Stdout: out.head.String(), Stderr: errs.head.String()}
	}
	outShare, errShare := o.limit/2, o.limit-o.limit/2
	switch {
	case out.n < outShare:
		errShare = o.limit - out.n
	case errs.n < errShare:
		outShare = o.limit - errs.n
	}
	return shellEntry{Outcome: outcome, Stdout: out.text(outShare), Stderr: errs.text(errShare)}
}

// boundedText keeps the first keep characters of a stream and its last ones (up to keep).
type boundedText struct {
	keep int
	n    int // characters seen
	head strings.Builder
	tail []byte // the stream's end, at most about 4 bytes per kept character
}

func (b *boundedText) add(text string) {
	for text != "" {
		if room := b.keep - b.n; room > 0 {
			part := cutRunes(text, room)
			b.head.WriteString(part)
			b.n += utf8.RuneCountInString(part)
			text = text[len(part):]
			continue
		}
		b.n += utf8.RuneCountInString(text)
		b.tail = append(b.tail, text...)
		if max := 8 * b.keep; len(b.tail) > max {
			cut := len(b.tail) - 4*b.keep
			for cut < len(b.tail) && !utf8.RuneStart(b.tail[cut]) {
				cut++
			}
			b.tail = append(b.tail[:0], b.tail[cut:]...)
		}
		return
	}
}

// text is the stream in at most share characters, its middle replaced by a line saying how many
// characters were left out (the line is not counted).
func (b *boundedText) text(share int) string {
	if b.n <= share {
		return b.head.String() + string(b.tail)
	}
	headN := share / 2
	head := cutRunes(b.head.String(), headN)
	all := b.head.String() + string(b.tail)
	tail := lastRunes(all, share-headN)
	omitted := b.n - utf8.RuneCountInString(head) - utf8.RuneCountInString(tail)
	return head + fmt.Sprintf("\n[… %d characters omitted …]\n", omitted) + tail
}

// cutRunes returns the first n characters of s.
func cutRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// lastRunes returns the last n characters of s.
func lastRunes(s string, n int) string {
	i := len(s)
	for i > 0 && n > 0 {
		_, size := utf8.DecodeLastRuneInString(s[:i])
		i -= size
		n--
	}
	return s[i:]
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

// wantsShell reports whether tools holds a shell tool.
func wantsShell(root gjson.Result) bool {
	found := false
	root.Get("tools").ForEach(func(_, t gjson.Result) bool {
		found = t.Get("type").String() == "shell"
		return !found
	})
	return found
}

// parseAuto reads an auto container's settings (code_interpreter's {"type":"auto"}, the shell
// tool's container_auto) at param into spec, and its file_ids into the request's files.
func (r *parsedRequest) parseAuto(c gjson.Result, param string, spec *containerSpec) *apierror.Error {
	switch ml := c.Get("memory_limit"); {
	case !ml.Exists(), ml.Type == gjson.Null:
	case ml.Type == gjson.String && validMemoryLimit(ml.String()):
		spec.memoryLimit = ml.String()
	default:
		return apierror.BadRequest("Invalid value for '"+param+".memory_limit': expected one of '1g', '4g', '16g', '64g'.", param+".memory_limit", apierror.CodeInvalidValue)
	}
	np, bad := ParseNetworkPolicy(c.Get("network_policy"), param+".network_policy")
	if bad != nil {
		return bad
	}
	if np != nil {
		spec.network, spec.networkParam = np, param+".network_policy"
	}
	files, bad := parseFileIDs(c.Get("file_ids"), param+".file_ids")
	r.files = append(r.files, files...)
	return bad
}

// parseShellTool reads the shell tool at param: which environment runs its commands, and for a
// hosted one the container it names (into spec).
func (r *parsedRequest) parseShellTool(t gjson.Result, param, fn string, spec *containerSpec) *apierror.Error {
	r.shell = shellTool{fn: fn}
	env := t.Get("environment")
	param += ".environment"
	if !env.Exists() || env.Type == gjson.Null {
		return nil // the client runs the commands; its calls show no environment
	}
	if !env.IsObject() {
		return apierror.InvalidType(param, "an object", env)
	}
	switch typ := env.Get("type"); {
	case !typ.Exists():
		return apierror.BadRequest("Missing required parameter: '"+param+".type'.", param+".type", "")
	case typ.Str == "local":
		r.shell.local = true
	case typ.Str == "container_auto":
		r.shell.hosted = true
		spec.param = param
		return r.parseAuto(env, param, spec)
	case typ.Str == "container_reference":
		r.shell.hosted = true
		id := env.Get("container_id")
		switch {
		case !id.Exists() || id.Type == gjson.Null:
			return apierror.BadRequest("Missing required parameter: '"+param+".container_id'.", param+".container_id", "")
		case id.Type != gjson.String:
			return apierror.InvalidType(param+".container_id", "a string", id)
		}
		spec.id, spec.param = id.Str, param+".container_id"
	default:
		return apierror.BadRequest(fmt.Sprintf("Invalid value for '%s.type': %s. Supported values are: 'container_auto', 'container_reference' and 'local'.", param, typ.Raw), param+".type", apierror.CodeInvalidValue)
	}
	return nil
}

// shareContainer makes the hosted shell tool's container the request's one container beside
// code_interpreter's: an id either names is the one; two different ids are refused, since one
// request has one container.
func (r *parsedRequest) shareContainer(sh containerSpec) *apierror.Error {
	if !r.shell.hosted {
		return nil
	}
	switch {
	case sh.id != "" && r.container.id != "" && sh.id != r.container.id:
		return apierror.BadRequest("The code_interpreter and shell tools name different containers ('"+r.container.id+"' and '"+sh.id+"'); one request uses one container.", sh.param, apierror.CodeInvalidValue)
	case sh.id != "" && r.container.id == "":
		r.container.id, r.container.param = sh.id, sh.param
	case r.container.param == "":
		r.container.param = sh.param
	}
	if r.container.memoryLimit == "" {
		r.container.memoryLimit = sh.memoryLimit
	}
	if r.container.network == nil {
		r.container.network, r.container.networkParam = sh.network, sh.networkParam
	}
	return nil
}

// shell runs a hosted shell call's commands in the container, one after the other, streaming
// each one's output as it comes, and returns what the model is told: the output entries as
// JSON, and the files the commands wrote. stop: the call is shown, not run (tools off, tool_choice
// without shell, an incomplete turn); i is its position in the turn, for the per-turn limit.
func (r *run) shell(ctx context.Context, c standIn, i int, stop bool) (string, error) {
	run, ev := r.tr.startShellOutput(c.ref)
	if err := r.emit(ev); err != nil {
		return "", err
	}
	limited, over := r.overLimit(i)
	var model string
	switch {
	case stop:
		model = skipped().model
	case over:
		model = limited.model
	case c.parseErr != nil:
		r.e.m.executions.WithLabelValues(statusFailed).Inc()
		model = "could not parse the arguments: " + c.parseErr.Error() + `. Call the function with {"commands": ["<command>", …], "timeout_ms": null, "max_output_length": null}.`
	}
	if model != "" {
		return model, r.emit(r.tr.shellOutputDone(run, statusIncomplete))
	}
	box, err := r.cont.get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", sandboxUnavailable(err)
	}
	r.executions++
	start := r.e.now()
	limit := r.ic.ModelOutputLimit
	if limit <= 0 {
		limit = config.DefaultModelOutputLimit
	}
	if m := c.action.MaxOutputLength; m != nil && *m > 0 && *m < int64(limit) {
		limit = int(*m)
	}
	// The model's timeout_ms within execution_timeout (0 from either: the other, or the backend's).
	timeout := r.ic.ExecutionTimeout
	if t := c.action.TimeoutMS; t != nil && *t > 0 && (timeout <= 0 || time.Duration(*t)*time.Millisecond < timeout) {
		timeout = time.Duration(*t) * time.Millisecond
	}
	var emitErr error
	emit := func(ev Event) {
		if emitErr == nil {
			emitErr = r.emit(ev)
		}
	}
	outs := make([]*shellOutput, len(c.action.Commands))
	written, runErr := box.Shell(ctx, c.action.Commands, func(k int) sandbox.ExecOptions {
		outs[k] = newShellOutput(limit)
		return sandbox.ExecOptions{Timeout: timeout, OnOutput: func(st sandbox.Stream, text string) {
			if d := outs[k].add(st, text); d != "" {
				emit(run.delta(k, st, d))
			}
		}}
	}, func(k int, res sandbox.ExecResult) {
		outcome := shellOutcome{Type: "timeout"}
		if !res.TimedOut {
			code := res.ExitCode
			outcome = shellOutcome{Type: "exit", ExitCode: &code}
		}
		emit(run.commandDone(k, outs[k].entry(outcome)))
	}, r.lim)
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if emitErr != nil {
		return "", emitErr
	}
	if errors.Is(runErr, containers.ErrCollect) {
		r.e.m.sandboxErr.WithLabelValues("files").Inc()
		r.e.log.Warn("finding the files shell commands wrote failed", zap.Error(runErr))
		runErr = nil
	}
	status, result := statusCompleted, statusCompleted
	model = string(marshal(run.output))
	if runErr != nil {
		status, result = statusIncomplete, statusFailed
		r.e.m.sandboxErr.WithLabelValues("shell").Inc()
		r.e.log.Warn("shell commands failed", zap.Error(runErr))
		reason := runFailure(runErr)
		if errors.Is(runErr, containers.ErrNoShell) {
			reason = "this sandbox runs no shell commands; use the python tool if there is one"
		}
		model = joinLines(model, fmt.Sprintf("Commands %d and later did not run: %s.", len(run.output)+1, reason))
	}
	r.outputUsed += int64(len(model))
	if r.outputUsed >= r.outputBudget() {
		r.outputSpent = true
	}
	model = withWrittenFiles(model, written)
	r.tr.addFiles(written.Files, true)
	r.e.m.executions.WithLabelValues(result).Inc()
	r.e.m.execTime.WithLabelValues(result).Observe(r.e.now().Sub(start).Seconds())
	done := r.tr.shellOutputDone(run, status)
	// The commands went to the container: the call and its output are kept, as code calls are.
	r.keepShellItem(c.ciID, c.callID, r.tr.shownItem(c.ref))
	r.keepShellItem(run.id, run.callID, r.tr.out[run.index])
	return model, r.emit(done)
}

// shellCallInput is the stand-in's function_call for a shell_call the client sends back.
func shellCallInput(it gjson.Result, fn string) []byte {
	a := shellAction{Commands: []string{}}
	it.Get("action.commands").ForEach(func(_, c gjson.Result) bool {
		a.Commands = append(a.Commands, c.String())
		return true
	})
	for _, f := range []struct {
		key string
		dst **int64
	}{{"action.timeout_ms", &a.TimeoutMS}, {"action.max_output_length", &a.MaxOutputLength}} {
		if v := it.Get(f.key); v.Type == gjson.Number {
			n := v.Int()
			*f.dst = &n
		}
	}
	return marshal(functionCall{Type: "function_call", CallID: it.Get("call_id").String(), Name: fn, Arguments: string(marshal(a))})
}

// shellOutputText is what the model is told of a shell_call_output's entries, as the proxy tells
// it of the commands it runs: the entries as JSON.
func shellOutputText(output gjson.Result) string {
	entries := []shellEntry{}
	output.ForEach(func(_, e gjson.Result) bool {
		en := shellEntry{Stdout: e.Get("stdout").String(), Stderr: e.Get("stderr").String(), Outcome: shellOutcome{Type: "timeout"}}
		if e.Get("outcome.type").String() != "timeout" {
			code := int(e.Get("outcome.exit_code").Int())
			en.Outcome = shellOutcome{Type: "exit", ExitCode: &code}
		}
		entries = append(entries, en)
		return true
	})
	return string(marshal(entries))
}

// checkShellPairs refuses, as OpenAI does, a shell_call_output in input whose call_id names no
// shell_call of the context, and a shell_call of the input without its output. The context is
// the input before the output and what prior reports of the conversation previous_response_id
// continues (nil: there is none); a prior that cannot tell reports every call_id as known.
func checkShellPairs(in []gjson.Result, prior func(callID string) bool) *apierror.Error {
	calls, outputs := map[string]bool{}, map[string]bool{}
	var order []string
	for _, it := range in {
		id := it.Get("call_id").String()
		switch it.Get("type").String() {
		case "shell_call":
			calls[id] = true
			order = append(order, id)
		case "shell_call_output":
			if !calls[id] && (prior == nil || !prior(id)) {
				return apierror.BadRequest("No tool call found for shell call output with call_id "+id+".", "input", "")
			}
			outputs[id] = true
		}
	}
	for _, id := range order {
		if !outputs[id] {
			return apierror.BadRequest("No tool output found for shell call "+id+".", "input", "")
		}
	}
	return nil
}

// shellReference returns the shell item the proxy minted that an item_reference names ("sh_…",
// "sho_…"), as the client received it; any other item, and a reference the store does not hold
// for the caller, is returned as it is.
func shellReference(it gjson.Result, lk lookup) gjson.Result {
	if it.Get("type").String() != "item_reference" {
		return it
	}
	id := it.Get("id").String()
	if !strings.HasPrefix(id, "sh_") && !strings.HasPrefix(id, "sho_") {
		return it
	}
	if sc, ok := storedCall(lk, id); ok && sc.Item != "" && gjson.Valid(sc.Item) {
		return gjson.Parse(sc.Item)
	}
	return it
}

// maxChainReads bounds the records read back along a previous_response_id chain for the calls of
// its conversation; a longer chain is not checked.
const maxChainReads = 32

// priorShellCalls reports, for a call_id, whether the conversation sr ends is known to hold a
// shell call of it, or not known well enough to tell: sr's conversation as the proxy kept it (for
// an upstream that keeps nothing), or, while the chain is the caller's and stored with its
// bodies, each response's input and output back to the first. Records are read only while a
// call_id is still missing.
func (lk lookup) priorShellCalls(sr store.Response, sfn string) func(string) bool {
	ids := map[string]bool{}
	next, whole, reads := &sr, false, 0
	return func(callID string) bool {
		for !ids[callID] && next != nil {
			cur := next
			next = nil
			var prev string
			if prev, whole = lk.shellCallsOf(*cur, sfn, ids); prev == "" || whole {
				break
			}
			if reads++; reads > maxChainReads {
				break
			}
			sr, known, err := readResponse(lk.ctx, lk.store, prev)
			if err != nil {
				lk.fail(err)
				break
			}
			if known && sr.Owner == lk.caller {
				next = &sr
			}
		}
		return ids[callID] || (next == nil && !whole)
	}
}

// shellCallsOf adds the call_ids of the shell calls of one stored response to ids, and returns
// the response it continues ("" for none) and whether its record holds the whole conversation.
// A record that holds none of it (not kept, or deleted) is a chain that cannot be followed: ""
// and false.
func (lk lookup) shellCallsOf(sr store.Response, sfn string, ids map[string]bool) (prev string, whole bool) {
	add := func(items []gjson.Result) {
		for _, it := range items {
			switch typ := it.Get("type").String(); {
			case typ == "shell_call", typ == "function_call" && it.Get("name").String() == sfn:
				ids[it.Get("call_id").String()] = true
			case typ == "item_reference":
				if ref := shellReference(it, lk); ref.Get("type").String() == "shell_call" {
					ids[ref.Get("call_id").String()] = true
				}
			}
		}
	}
	if sr.UpstreamID == "" && len(sr.Pending) > 0 {
		// The conversation the proxy kept: every item of the chain, in the upstream's form.
		items := make([]gjson.Result, len(sr.Pending))
		for i, it := range sr.Pending {
			items[i] = gjson.ParseBytes(it)
		}
		add(items)
		return "", true
	}
	if sr.Body == nil {
		return "", false
	}
	add(gjson.ParseBytes(sr.Input).Array())
	add(gjson.GetBytes(sr.Body, "output").Array())
	prev = gjson.GetBytes(sr.Body, "previous_response_id").String()
	return prev, prev == ""
}
