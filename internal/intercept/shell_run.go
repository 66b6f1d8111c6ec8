package intercept

// Running a hosted shell call's commands in the container.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

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
