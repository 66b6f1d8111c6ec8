package intercept

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
)

// TestIdleKernelRestarted: a container whose kernel stayed unused for kernel_idle_timeout gets a
// fresh kernel at the reaper's next sweep; it keeps its files, the next execution runs without the
// earlier state, and the model (not the client's logs) is told that the Python state was reset,
// once.
func TestIdleKernelRestarted(t *testing.T) {
	h := newHarness(t, withLocal(), withConfig(func(c *config.Config) { c.Interception.KernelIdleTimeout = time.Nanosecond }))
	h.up.Enqueue(calls("t = 21\nopen('kept.txt', 'w').write('kept')"), text("ok"))
	resp := h.final(t, body(""), false)
	cid := gjson.GetBytes(resp, "output.0.container_id").String()

	h.sess.Sweep(context.Background()) // idle past its kernel idle timeout: restarted, not expired
	h.up.Enqueue(calls("print(open('kept.txt').read())\nprint(t)"), text("done"))
	resp = h.final(t, bodyIn(cid, `"include":["code_interpreter_call.outputs"]`), false)
	reqs := h.up.Requests()
	outs := fcOutputs(reqs[len(reqs)-1])
	if len(outs) != 1 {
		t.Fatalf("the model saw %q", outs)
	}
	if !strings.HasPrefix(outs[0], kernelRestartedNote+"\n") || !strings.Contains(outs[0], "kept") || !strings.Contains(outs[0], "NameError") {
		t.Errorf("after the restart the model saw %q; want the note first, the file kept and t gone", outs[0])
	}
	if logs := gjson.GetBytes(resp, "output.0.outputs.0.logs").String(); strings.Contains(logs, "reset") || !strings.Contains(logs, "NameError") {
		t.Errorf("the client's logs = %q; want the code's output alone", logs)
	}

	// Used again, without a sweep in between: the same fresh kernel, and no note.
	h.up.Enqueue(calls("t = 1"), calls("print(t)"), text("done"))
	h.final(t, bodyIn(cid, ""), false)
	reqs = h.up.Requests()
	if outs := fcOutputs(reqs[len(reqs)-1]); len(outs) == 0 || outs[len(outs)-1] != "1\n" {
		t.Errorf("the kernel after the restart saw %q; want its own state kept, without a note", outs)
	}
}
