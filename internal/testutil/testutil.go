// Package testutil holds the helpers that tests across the repository share: a TestMain that
// checks for leaked goroutines, polling for a condition, and a buffer that a logger and a test may
// use at once. It imports no package of the project, so that every package's tests may use it
// (localsandbox, below it, shares a local sandbox). It is imported by _test.go files only.
package testutil

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Main runs the package's tests, then each cleanup (with a 30 s budget together), then, when
// everything passed, checks that no goroutine is left behind. It exits the process; call it as
// the whole body of TestMain.
func Main(m *testing.M, cleanups ...func(context.Context) error) {
	code := m.Run()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	for _, c := range cleanups {
		if err := c(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
			code = 1
		}
	}
	cancel()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Eventually polls cond until it holds, failing t when it has not within 15 s. what completes
// "timed out waiting for ...". It is for conditions that another goroutine makes true (a sandbox
// deleted, a log line written); it never replaces an injected clock.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(15 * time.Second)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// LockedBuffer is a bytes.Buffer safe for concurrent use: a process's or a logger's output that
// the test reads while it is being written.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
