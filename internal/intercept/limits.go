package intercept

import (
	"errors"
	"fmt"

	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
)

// This file holds the limits of one response (code_interpreter_interception_params): stand-in
// calls run per model turn, executions per response, the size of one call's code, and the
// execution output summed over the response. Past each, nothing more runs and the model is told
// so in the call's output, as with max_tool_calls; the client gets an answer either way.

// quotaExceeded returns the 429 for a container quota (containers.QuotaError), or nil.
func quotaExceeded(err error) *apierror.Error {
	var qe *containers.QuotaError
	if errors.As(err, &qe) {
		return apierror.RateLimited(qe.Message, qe.RetryAfter)
	}
	return nil
}

// maxExecutions is the most executions this response may run: max_tool_calls when the client
// set a lower one, else max_executions.
func (r *run) maxExecutions() int {
	n := r.ic.MaxExecutions
	if n <= 0 {
		n = config.DefaultMaxExecutions
	}
	if m := r.req.maxToolCalls; m > 0 && m < n {
		n = m
	}
	return n
}

// executionsDone reports whether no more code runs in this response: its executions or its
// output budget are spent.
func (r *run) executionsDone() bool {
	return r.executions >= r.maxExecutions() || r.outputSpent
}

// overLimit returns, for the call at position i of the current model turn, the execution that
// stands for it when a limit stops it from running.
func (r *run) overLimit(i int) (execution, bool) {
	perTurn := r.ic.MaxCallsPerTurn
	if perTurn <= 0 {
		perTurn = config.DefaultMaxCallsPerTurn
	}
	switch {
	case r.outputSpent:
		return notRun(fmt.Sprintf("the output budget of this response (%d bytes, max_response_output) is spent", r.outputBudget())), true
	case r.executions >= r.maxExecutions():
		if m := r.req.maxToolCalls; m > 0 && m <= r.maxExecutions() {
			return skipped(), true
		}
		return notRun(fmt.Sprintf("the limit of %d code executions per response (max_executions) was reached", r.maxExecutions())), true
	case i >= perTurn:
		return notRun(fmt.Sprintf("the limit of %d code calls per model turn (max_calls_per_turn) was reached; make fewer calls at once", perTurn)), true
	}
	return execution{}, false
}

// notRun is the execution of a call that a limit stopped.
func notRun(why string) execution {
	return execution{status: statusIncomplete, model: "Not executed: " + why + ". Answer with what you have."}
}

func (r *run) outputBudget() int64 {
	if r.ic.MaxResponseOutput > 0 {
		return r.ic.MaxResponseOutput
	}
	return config.DefaultMaxResponseOutput
}

// charge counts ex's client-visible output (logs and images) against the response's output
// budget. An execution that goes over it keeps what fits, with a note, loses the images that do
// not fit, and spends the budget: no more code runs in the response.
func (r *run) charge(ex execution) execution {
	left := r.outputBudget() - r.outputUsed
	size := int64(len(ex.logs))
	for _, im := range ex.images {
		size += int64(len(im))
	}
	if size <= left {
		r.outputUsed += size
		return ex
	}
	r.outputSpent = true
	note := fmt.Sprintf("[output truncated: the output budget of this response (%d bytes, max_response_output) is spent; no more code runs]", r.outputBudget())
	keep := max(left-int64(len(note))-1, 0)
	logs := cutUTF8(ex.logs, int(min(keep, int64(len(ex.logs)))))
	keep -= int64(len(logs))
	var images []string
	for _, im := range ex.images {
		if int64(len(im)) <= keep {
			images = append(images, im)
			keep -= int64(len(im))
		}
	}
	ex.logs = joinLines(logs, note)
	ex.images = images
	ex.model = joinLines(ex.model, note)
	r.outputUsed = r.outputBudget()
	return ex
}

// codeTooLarge is the parse error of a call whose arguments are over max_code_size.
type codeTooLarge struct {
	size  int // bytes seen before the decoder stopped, or the whole arguments' size
	limit int
}

func (e *codeTooLarge) Error() string {
	return fmt.Sprintf("the arguments are more than %d bytes (max_code_size)", e.limit)
}

// argsOver reports whether a call's arguments, with n more bytes, go over the code size limit.
// From then on nothing more of them is kept or decoded: what was kept is dropped, so no more
// than the limit is ever held per call.
func (t *translator) argsOver(s *slot, n int) bool {
	if s.tooBig {
		return true
	}
	if t.maxArgs <= 0 || s.args.Len()+n <= t.maxArgs {
		return false
	}
	s.tooBig = true
	s.args.Reset()
	return true
}

// sizeErr returns the parse error of a call whose complete arguments are n bytes, when they (or
// what streamed of them) are over the limit.
func (t *translator) sizeErr(s *slot, n int) error {
	if s.tooBig || (t.maxArgs > 0 && n > t.maxArgs) {
		s.tooBig = true
		return &codeTooLarge{size: n, limit: t.maxArgs}
	}
	return nil
}

// dropArgs replaces the arguments of an oversized call in the item carried into the next model
// turn, so the conversation does not carry them again.
func (t *translator) dropArgs(s *slot) {
	if !s.tooBig || s.upItem == nil {
		return
	}
	if item, err := sjson.SetBytes(s.upItem, "arguments", `{"code":"# omitted: over the code size limit"}`); err == nil {
		s.upItem = item
	}
}

// tooLargeExecution is the execution of a call over the code size limit: not run, and the model
// is told why.
func tooLargeExecution(err error) (execution, bool) {
	var e *codeTooLarge
	if !errors.As(err, &e) {
		return execution{}, false
	}
	msg := fmt.Sprintf("Not executed: the code is larger than the limit of %d bytes (max_code_size). Send smaller code; write large data from code rather than inlining it.", e.limit)
	return execution{status: statusFailed, logs: msg, model: msg}, true
}
