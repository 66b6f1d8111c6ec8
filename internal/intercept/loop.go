package intercept

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// maxUpstreamBody bounds a non-streaming upstream response or error body read into memory.
const maxUpstreamBody = 64 << 20

// poster is what the loop needs of an upstream target (*upstream.Target).
type poster interface {
	Post(ctx context.Context, path string, body []byte, h http.Header) (*http.Response, config.Deployment, error)
}

// upstreamStatusError is a non-2xx upstream answer: the client gets its status and body.
type upstreamStatusError struct {
	status int
	header http.Header
	body   []byte
}

func (e *upstreamStatusError) Error() string {
	return "upstream answered " + strconv.Itoa(e.status)
}

// errStreamCut is an upstream stream that ended before its final event.
var errStreamCut = errors.New("upstream stream ended before the response completed")

// run is one intercepted request's loop. It is used by one goroutine, except the container
// creation it starts.
type run struct {
	e      *Engine
	ic     config.Interception
	tool   string // sandbox tool name
	target poster
	caller string
	hdr    http.Header
	req    *request
	tr     *translator
	emit   func(Event) error

	cont       *containerFuture
	executions int
	iterations int
	stored     map[string]StoredCall
}

// containerFuture is the request's container, opened or being created.
type containerFuture struct {
	done    chan struct{}
	cancel  context.CancelFunc
	c       runner
	err     error
	created bool // this request created the sandbox (it is not the client's already)
	shown   bool // its id reached the client (in an item) or the response store
}

// get waits for the container.
func (f *containerFuture) get(ctx context.Context) (runner, error) {
	select {
	case <-f.done:
		return f.c, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startContainer opens the container the request names (synchronously: a wrong id must be a 404
// before anything is written) or starts creating one beside the first upstream call, so the
// model's first code does not wait for a cold start.
func (r *run) startContainer(ctx context.Context) *apierror.Error {
	f := &containerFuture{done: make(chan struct{})}
	r.cont = f
	if id := r.req.container.id; id != "" {
		f.cancel = func() {}
		f.c, f.err = r.e.sessions.Open(ctx, id, r.caller)
		close(f.done)
		if f.err != nil {
			if errors.Is(f.err, sandbox.ErrNotFound) {
				return apierror.NotFound("Container with id '"+id+"' not found.", "tools["+strconv.Itoa(r.req.container.toolIndex)+"].container")
			}
			r.e.m.sandboxErr.WithLabelValues("open").Inc()
			return sandboxUnavailable(f.err)
		}
		return nil
	}
	cctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	go func() {
		defer close(f.done)
		if prev := r.req.prevContainer; prev != "" {
			// A conversation keeps its container while it lives.
			if c, err := r.e.sessions.Open(cctx, prev, r.caller); err == nil {
				f.c = c
				return
			}
		}
		f.c, f.err = r.e.sessions.Create(cctx, r.tool, r.caller, sandbox.CreateOptions{MemoryLimit: r.req.container.memoryLimit}, r.ic.ContainerIdleTimeout)
		f.created = f.err == nil
	}()
	return nil
}

// containerID is the translator's hook: the container's id, waiting for it if needed.
func (r *run) containerID(ctx context.Context) (string, error) {
	c, err := r.cont.get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		r.e.m.sandboxErr.WithLabelValues("create").Inc()
		return "", sandboxUnavailable(err)
	}
	r.cont.shown = true
	return c.ID(), nil
}

// releaseContainer ends the request's use of its container, on every path. A creation still in
// progress is cancelled (nothing needs it any more) and waited for, so nothing is lost. A sandbox
// this request created but whose id never reached anyone (the request failed before any code
// ran) is deleted at once: nobody could ever reuse it.
func (r *run) releaseContainer(ctx context.Context) {
	f := r.cont
	if f == nil {
		return
	}
	f.cancel()
	<-f.done
	if f.c != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		idle := r.ic.ContainerIdleTimeout
		if f.created && !f.shown {
			idle = 0
		}
		r.e.sessions.Release(rctx, f.c, idle)
	}
}

func sandboxUnavailable(err error) *apierror.Error {
	return apierror.BadGateway("The code interpreter sandbox is unavailable.", "sandbox_unavailable", err)
}

// loop calls the upstream until the model answers without calling the stand-in function, runs
// every call in the container, and emits the client events as it goes. The terminal event is
// emitted here; an error return means none was (the caller renders the error).
func (r *run) loop(ctx context.Context) error {
	var turns [][]byte
	none := false
	for call := 0; ; call++ {
		body, err := r.req.body(callSpec{first: call == 0, none: none, turns: turns, encrypted: r.req.addedEncrypted})
		if err != nil {
			return fmt.Errorf("building the upstream body: %w", err)
		}
		r.tr.begin()
		if err := r.callUpstream(ctx, body); err != nil {
			return err
		}
		r.iterations++
		if r.tr.finalType == "response.failed" {
			// Every failed stream carries the nested error event before response.failed, so
			// SDKs raise it, even when the upstream sent response.failed alone.
			if r.tr.errDetail == nil {
				r.tr.errDetail = r.tr.upstreamError()
				if err := r.emit(errorEvent(r.tr.errDetail)); err != nil {
					return err
				}
			}
			return r.emit(r.tr.failed(r.tr.errDetail))
		}
		calls := r.tr.pending()
		if len(calls) == 0 {
			return r.complete(ctx, nil)
		}
		// An incomplete response (max_output_tokens, content filter) or a call made with tools
		// off ends the loop: its calls are shown, not run.
		stop := none || r.req.noCode || r.tr.finalType == "response.incomplete" || gjson.GetBytes(r.tr.final, "status").String() == "incomplete"
		outputs := make([][]byte, 0, len(calls))
		for _, s := range calls {
			var ex execution
			switch {
			case stop || (r.req.maxToolCalls > 0 && r.executions >= r.req.maxToolCalls):
				ex = skipped()
				if err := r.emitAll(r.tr.interpreting(s)); err != nil {
					return err
				}
			default:
				ex, err = r.execute(ctx, s)
				if err != nil {
					return err
				}
			}
			if err := r.emitAll(r.tr.executed(s, ex)...); err != nil {
				return err
			}
			out := functionOutput(s.callID, ex.model)
			outputs = append(outputs, out)
			r.stored[s.ciID] = StoredCall{Owner: r.caller, CallID: s.callID, Code: s.code, Output: ex.model}
		}
		if stop || r.tr.clientCalls() {
			// The client's own function is the client's to run: return with its call; ours are
			// answered when the conversation continues.
			return r.complete(ctx, outputs)
		}
		if r.req.includeEncrypted != nil && !r.req.addedEncrypted && r.tr.reasoned() {
			// An unstored reasoning model: from now on ask for its reasoning encrypted, so the
			// next turns can be carried (and strip it from what the client did not ask for).
			r.req.addedEncrypted = true
		}
		turns = append(turns, r.tr.turn()...)
		turns = append(turns, outputs...)
		if (r.req.maxToolCalls > 0 && r.executions >= r.req.maxToolCalls) || call+1 >= r.maxIterations() {
			none = true
		}
	}
}

func (r *run) maxIterations() int {
	if r.ic.MaxIterations > 0 {
		return r.ic.MaxIterations
	}
	return 20
}

// complete emits the final Response and remembers it for previous_response_id.
func (r *run) complete(ctx context.Context, pending [][]byte) error {
	ev := r.tr.completed()
	if r.e.store != nil {
		sr := StoredResponse{Owner: r.caller, UpstreamID: gjson.GetBytes(r.tr.final, "id").String(), Pending: pending}
		if f := r.cont; f != nil {
			select {
			case <-f.done:
				if f.c != nil {
					sr.ContainerID = f.c.ID()
					f.shown = true
				}
			default:
			}
		}
		if r.req.store {
			sr.Body = ev.Response
		}
		r.e.store.Put(ctx, r.tr.id, sr, r.stored)
	}
	return r.emit(ev)
}

// execute runs one stand-in call in the container.
func (r *run) execute(ctx context.Context, s *slot) (execution, error) {
	if err := r.emitAll(r.tr.interpreting(s)); err != nil {
		return execution{}, err
	}
	if s.parseErr != nil {
		r.e.m.executions.WithLabelValues(statusFailed).Inc()
		return unparsed(s.parseErr), nil
	}
	c, err := r.cont.get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return execution{}, ctx.Err()
		}
		return execution{}, sandboxUnavailable(err)
	}
	r.executions++
	start := r.e.now()
	res, runErr := c.Run(ctx, s.code, sandbox.RunOptions{Timeout: r.ic.ExecutionTimeout})
	if ctx.Err() != nil {
		return execution{}, ctx.Err()
	}
	ex := describe(res, runErr, r.ic.ExecutionTimeout, r.ic.ModelOutputLimit)
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
	resp, _, err := r.target.Post(ctx, "/responses", body, r.hdr)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ae *apierror.Error
		if errors.As(err, &ae) {
			return ae
		}
		return apierror.BadGateway("The upstream could not be reached.", "upstream_unavailable", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &upstreamStatusError{status: resp.StatusCode, header: resp.Header, body: b}
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
		if err != nil {
			return r.readFailure(ctx, err)
		}
		evs, err := r.tr.response(b)
		if e := r.emitAll(evs...); e != nil {
			return e
		}
		if err != nil && errors.Is(err, errUpstreamShape) {
			return apierror.BadGateway("The upstream's response could not be read.", "upstream_error", err)
		}
		return err
	}
	rd := upstream.NewSSEReader(resp.Body)
	for !r.tr.ended() {
		ev, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return r.readFailure(ctx, err)
		}
		if bytes.Equal(ev.Data, []byte("[DONE]")) {
			continue
		}
		evs, err := r.tr.upstream(ev.Data)
		if e := r.emitAll(evs...); e != nil {
			return e
		}
		if err != nil {
			if errors.Is(err, errUpstreamShape) {
				return apierror.BadGateway("The upstream's response could not be read.", "upstream_error", err)
			}
			return err
		}
	}
	if !r.tr.ended() {
		if r.tr.errDetail != nil {
			// An error event without response.failed: the error was forwarded already.
			r.tr.finalType = "response.failed"
			return nil
		}
		return r.readFailure(ctx, errStreamCut)
	}
	return nil
}

func (r *run) readFailure(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return apierror.BadGateway("The upstream's response ended early.", "upstream_error", err)
}
