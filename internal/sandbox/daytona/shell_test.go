package daytona_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

func TestExec(t *testing.T) {
	srv := newDouble(t)
	p := provider(t, srv)
	h := create(t, p)
	defer p.Delete(context.Background(), h)
	for _, tc := range []struct {
		name, cmd      string
		timeout        time.Duration
		stdout, stderr string
		exit           int
		timedOut       bool
	}{
		{"streams", "echo out; echo err >&2; printf 'é'", 0, "out\né", "err\n", 0, false},
		{"exit code", "exit 3", 0, "", "", 3, false},
		{"cwd is /mnt/data", "pwd", 0, "/mnt/data\n", "", 0, false},
		{"stdin closed", "cat; echo done", 0, "done\n", "", 0, false},
		{"timeout", "echo start; sleep 30", time.Second, "start\n", "", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errs strings.Builder
			res, err := p.Exec(context.Background(), h, tc.cmd, sandbox.ExecOptions{Timeout: tc.timeout, OnOutput: func(s sandbox.Stream, text string) {
				if s == sandbox.Stdout {
					out.WriteString(text)
				} else {
					errs.WriteString(text)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.stdout || errs.String() != tc.stderr || res.TimedOut != tc.timedOut || (!tc.timedOut && res.ExitCode != tc.exit) {
				t.Errorf("stdout %q stderr %q result %+v", out.String(), errs.String(), res)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := p.Exec(ctx, h, "sleep 30", sandbox.ExecOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled: %v", err)
	}
	srv.Destroy(h.ID)
	if _, err := p.Exec(context.Background(), h, "true", sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("gone: %v", err)
	}
}
