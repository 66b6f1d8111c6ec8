package containers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

func TestContainerRunSerialized(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", time.Minute)
	f.p.gate = make(chan struct{})
	f.p.started = make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if _, err := c.Run(ctx, fmt.Sprint(i), sandbox.RunOptions{}); err != nil {
				t.Errorf("Run() error = %v", err)
			}
		})
	}
	<-f.p.started
	// A run waiting for the container gives up with its context.
	short, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Run(short, "late", sandbox.RunOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run(cancelled while another runs) error = %v; want context.Canceled", err)
	}
	close(f.p.gate)
	wg.Wait()
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	if f.p.runs != 4 || f.p.maxRunning != 1 {
		t.Errorf("runs=%d maxRunning=%d; want 4 runs, one at a time", f.p.runs, f.p.maxRunning)
	}
}

func TestContainerRunGone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.create(t, "alice", time.Minute)
	f.p.mu.Lock()
	delete(f.p.live, c.h.ID) // the backend lost it
	f.p.mu.Unlock()
	if _, err := c.Run(ctx, "x", sandbox.RunOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Run() error = %v; want sandbox.ErrNotFound", err)
	}
	if f.s.Live() != 0 {
		t.Errorf("Live() = %d after the sandbox was found gone; want 0", f.s.Live())
	}
	_, err := f.s.Open(ctx, c.ID(), "alice")
	wantExpired(t, "Open(gone)", err)
}
