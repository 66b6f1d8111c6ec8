package intercept

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// run is one intercepted request's loop: the only place with I/O. It calls the upstream through
// the Responses seam, runs code in the container, stores the result, and moves the translator
// along through its methods. It is used by one goroutine, except the container creation it
// starts (containers.go).
type run struct {
	e      *Engine
	ic     config.Interception
	tool   string // sandbox tool name
	api    upstream.ResponsesAPI
	caller string
	hdr    http.Header
	req    *parsedRequest
	id     string // the client-visible response id
	tr     *translator
	emit   func(Event) error

	cont        *containerFuture
	lim         containers.ContainerLimits // what the container's files may take
	encrypted   bool                       // upstream calls ask for reasoning.encrypted_content on the proxy's behalf
	stateless   bool                       // the upstream keeps nothing: the stored response keeps the conversation
	executions  int
	iterations  int
	outputUsed  int64        // bytes of execution output so far (limits.go)
	outputSpent bool         // the output budget is spent: no more code runs
	stored      []store.Call // the calls that ran, kept with the response
}

// newRun prepares the loop of one parsed request; events go to emit. mint makes the ids of
// response and call items (nil: random ids).
func (e *Engine) newRun(ic config.Interception, tool string, api upstream.ResponsesAPI, caller string, hdr http.Header, req *parsedRequest, emit func(Event) error, mint func(string) string) *run {
	if mint == nil {
		mint = newID
	}
	id := mint("resp_")
	tr := newTranslator(req, id, 0, mint)
	tr.maxArgs = ic.MaxCodeSize
	return &run{
		e: e, ic: ic, tool: tool, api: api, caller: caller, hdr: hdr, req: req, id: id,
		tr: tr, emit: emit, encrypted: req.encryptedFirst,
	}
}

// loop calls the upstream until the model answers without calling the stand-in function, runs
// every call in the container, and emits the client events as it goes. The terminal event is
// emitted here; an error return means none was (the caller renders the error).
func (r *run) loop(ctx context.Context) error {
	if err := r.placeFiles(ctx); err != nil {
		return err
	}
	var turns [][]byte
	none := false
	for call := 0; ; call++ {
		body, err := r.req.body(callSpec{first: call == 0, none: none, turns: turns, encrypted: r.encrypted})
		if err != nil {
			return fmt.Errorf("building the upstream body: %w", err)
		}
		r.tr.begin(r.encrypted)
		if err := r.callUpstream(ctx, body); err != nil {
			return err
		}
		r.iterations++
		end := r.tr.outcome()
		if end == outcomeFailed {
			return r.emitAll(append(r.tr.release(-1), r.tr.upstreamFailed()...)...)
		}
		calls := r.tr.calls()
		if len(calls) == 0 {
			return r.complete(ctx, turns, nil)
		}
		// An incomplete response (max_output_tokens, content filter), a call made with tools off
		// or a call of a tool that tool_choice rules out ends the loop: its calls are shown, not
		// run.
		ended := none || end == outcomeIncomplete
		stopCode, stopShell := ended || r.req.noCode, ended || r.req.noShell
		stop := ended
		outputs := make([][]byte, 0, len(calls))
		for i, c := range calls {
			if c.shell {
				stop = stop || stopShell
				if !r.req.shell.hosted {
					// The client runs it (clientCalls), and answers it in its next request; the
					// call is kept for an item_reference to it.
					r.keepShellItem(c.ciID, c.callID, r.tr.shownItem(c.ref))
					continue
				}
				out, err := r.shell(ctx, c, i, stopShell)
				if err != nil {
					return err
				}
				outputs = append(outputs, functionOutput(c.callID, out))
				// The items the model made after the call, held until its output was shown.
				if err := r.emitAll(r.tr.release(c.ref)...); err != nil {
					return err
				}
				continue
			}
			var ex execution
			if err := r.emit(r.tr.interpreting(c.ref)); err != nil {
				return err
			}
			stop = stop || stopCode
			limited, over := r.overLimit(i)
			switch {
			case stopCode:
				ex = skipped()
			case over:
				ex = limited
			default:
				ex, err = r.execute(ctx, c)
				if err != nil {
					return err
				}
			}
			if err := r.emitAll(append(r.tr.executed(c.ref, ex), r.tr.release(c.ref)...)...); err != nil {
				return err
			}
			outputs = append(outputs, functionOutput(c.callID, ex.model))
			if !stopCode && !over {
				// Only calls that went to the container are recorded: at most max_calls_per_turn
				// a turn, however many the model made. A replayed item without a record is rebuilt
				// from what the client sends (translateInputItem).
				r.stored = append(r.stored, store.Call{ID: c.ciID, Owner: r.caller, ContainerID: r.tr.container, CallID: c.callID, Code: c.code, Output: ex.model})
			}
		}
		if err := r.emitAll(r.tr.release(-1)...); err != nil {
			return err
		}
		if stop || r.tr.clientCalls() {
			// The client's own function is the client's to run: return with its call; ours are
			// answered when the conversation continues.
			return r.complete(ctx, turns, outputs)
		}
		if r.req.includeEncrypted != nil && !r.encrypted && r.tr.reasoned() {
			// An unstored reasoning model: from now on ask for its reasoning encrypted, so the
			// next turns can be carried (and strip it from what the client did not ask for).
			r.encrypted = true
		}
		turns = append(turns, r.tr.turn()...)
		turns = append(turns, outputs...)
		if r.executionsDone() || call+1 >= r.maxIterations() {
			none = true
		}
	}
}

func (r *run) maxIterations() int {
	if r.ic.MaxIterations > 0 {
		return r.ic.MaxIterations
	}
	return config.DefaultMaxIterations
}

// complete emits the final Response and remembers it for previous_response_id. turns are the
// items of the iterations before the last; pending the outputs of our calls in the last one that
// the upstream has not seen yet.
func (r *run) complete(ctx context.Context, turns, pending [][]byte) error {
	ev := r.tr.completed()
	sr := store.Response{ID: r.id, Owner: r.caller, UpstreamID: r.tr.upstreamID(), ExpiresAt: r.e.now().Add(storedTTL)}
	sr.Pending = rawItems(pending)
	if c, ok := r.cont.ready(); ok {
		sr.ContainerID = c.ID()
		r.cont.stored = true
	} else if n := len(r.req.contextContainers); n > 0 {
		// No code ran (a turn without the tool, or the model answered directly): the
		// conversation's container is still the one its next turn reuses.
		sr.ContainerID = r.req.contextContainers[n-1]
	}
	if r.req.store {
		sr.Body = r.tr.storedResponse(ev.Response)
		sr.Input = inputList(r.req.raw, r.tr.mint)
	}
	if r.stateless {
		// The upstream keeps nothing: previous_response_id continues from the whole conversation,
		// kept only when the client asked for storage, as OpenAI keeps it.
		sr.UpstreamID, sr.Pending = "", nil
		if r.req.store {
			sr.Pending = rawItems(r.req.conversation(turns, r.tr.turn(), pending))
		}
	}
	for i := range r.stored {
		if r.stored[i].ContainerID == "" {
			r.stored[i].ContainerID = sr.ContainerID
		}
		r.stored[i].ExpiresAt = sr.ExpiresAt
	}
	if err := r.e.store.PutResponse(ctx, sr, r.stored); err != nil {
		// The client must not get a response id that cannot be continued.
		r.cont.stored = false
		return fmt.Errorf("intercept: storing the response: %w", err)
	}
	return r.emit(ev)
}

// keepShellItem records a shell item the client is shown (its shell_call, or a shell_call_output
// of commands that ran) with the response, so that an item_reference to its id resolves to it.
func (r *run) keepShellItem(id, callID string, item []byte) {
	if id == "" || item == nil {
		return
	}
	r.stored = append(r.stored, store.Call{ID: id, Owner: r.caller, CallID: callID, Item: string(item)})
}

// execute runs one stand-in call in the container.
func (r *run) execute(ctx context.Context, c standIn) (execution, error) {
	if c.parseErr != nil {
		r.e.m.executions.WithLabelValues(statusFailed).Inc()
		return unparsed(c.parseErr), nil
	}
	box, err := r.cont.get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return execution{}, ctx.Err()
		}
		return execution{}, sandboxUnavailable(err)
	}
	r.executions++
	start := r.e.now()
	// What the code writes in /mnt/data becomes container files, which the model is told of so
	// it can link them, and the citations know.
	res, written, runErr := box.Execute(ctx, c.code, sandbox.RunOptions{Timeout: r.ic.ExecutionTimeout}, r.lim)
	if ctx.Err() != nil {
		return execution{}, ctx.Err()
	}
	if errors.Is(runErr, containers.ErrCollect) {
		r.e.m.sandboxErr.WithLabelValues("files").Inc()
		r.e.log.Warn("finding the files an execution wrote failed", zap.Error(runErr))
		runErr = nil
	}
	ex := r.charge(describe(res, runErr, r.ic.ExecutionTimeout, r.ic.ModelOutputLimit))
	if res.KernelRestarted {
		// The model's only: the client's logs are the code's output, and the code ran as shown.
		ex.model = joinLines(kernelRestartedNote, ex.model)
	}
	ex.model = withWrittenFiles(ex.model, written)
	r.tr.addFiles(written.Files, true)
	r.e.m.executions.WithLabelValues(ex.status).Inc()
	r.e.m.execTime.WithLabelValues(ex.status).Observe(r.e.now().Sub(start).Seconds())
	if runErr != nil && !errors.Is(runErr, sandbox.ErrTimeout) {
		r.e.m.sandboxErr.WithLabelValues("run").Inc()
		r.e.log.Warn("code execution failed", zap.Error(runErr))
	}
	return ex, nil
}

func (r *run) emitAll(evs ...Event) error {
	for _, ev := range evs {
		if err := r.emit(ev); err != nil {
			return err
		}
	}
	return nil
}

// callUpstream makes one upstream call and feeds its answer through the translator.
func (r *run) callUpstream(ctx context.Context, body []byte) error {
	answer, err := r.api.Responses(ctx, body, r.hdr)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var us *upstream.StatusError
		if errors.As(err, &us) {
			return us
		}
		var ae *apierror.Error
		if errors.As(err, &ae) {
			return ae
		}
		return apierror.BadGateway("The upstream could not be reached.", apierror.CodeUpstreamUnavailable, err)
	}
	defer answer.Close()
	for !r.tr.ended() {
		data, err := answer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return r.readFailure(ctx, err)
		}
		evs, err := r.tr.event(data)
		if errors.Is(err, errNeedContainer) {
			if err := r.handContainer(ctx); err != nil {
				return err
			}
			evs, err = r.tr.event(data)
		}
		if errors.Is(err, errNeedFiles) {
			if err := r.handFiles(ctx); err != nil {
				return err
			}
			evs, err = r.tr.event(data)
		}
		if e := r.emitAll(evs...); e != nil {
			return e
		}
		if err != nil {
			return r.readFailure(ctx, err)
		}
	}
	if !r.tr.answerEnded() {
		return r.readFailure(ctx, errStreamCut)
	}
	return nil
}

// readFailure is the error for an upstream answer that could not be read to its end.
func (r *run) readFailure(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ae *apierror.Error
	if errors.As(err, &ae) {
		return ae // the Responses seam's own account (a chat answer over its bounds, ...)
	}
	if errors.Is(err, upstream.ErrMalformed) {
		return apierror.BadGateway("The upstream's response could not be read.", apierror.CodeUpstreamError, err)
	}
	return apierror.BadGateway("The upstream's response ended early.", apierror.CodeUpstreamError, err)
}
