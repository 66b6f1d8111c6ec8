package intercept

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// fakeContainers is containers without a sandbox, for the tests whose subject is the engine, not
// the code: containers are held by owner, opened only by it, deleted at a release with idle 0,
// and code "runs" by calling run. It keeps sandbox.Sessions' contract as the engine relies on it:
// an unknown tool is sandbox.ErrUnavailable, another owner's or an unknown id sandbox.ErrNotFound.
type fakeContainers struct {
	tool string // the only sandbox tool configured

	mu    sync.Mutex
	boxes map[string]*fakeBox // live containers by id
	n     int
	codes []string // every code run, in order
	// run answers an execution; nil: nothing printed, nothing returned.
	run func(ctx context.Context, code string) (sandbox.Result, error)
}

type fakeBox struct {
	f     *fakeContainers
	id    string
	owner string
}

func newFakeContainers(tool string) *fakeContainers {
	return &fakeContainers{tool: tool, boxes: map[string]*fakeBox{}}
}

func (f *fakeContainers) Create(ctx context.Context, tool, owner string, _ sandbox.CreateOptions, _ time.Duration) (runner, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tool != f.tool {
		return nil, fmt.Errorf("%w: sandbox tool %q is not configured", sandbox.ErrUnavailable, tool)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	b := &fakeBox{f: f, id: "cntr_fake" + strconv.Itoa(f.n), owner: owner}
	f.boxes[b.id] = b
	return b, nil
}

func (f *fakeContainers) Open(_ context.Context, id, owner string) (runner, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok || b.owner != owner {
		return nil, fmt.Errorf("%w: unknown container id", sandbox.ErrNotFound)
	}
	return b, nil
}

func (f *fakeContainers) Release(_ context.Context, c runner, idle time.Duration) {
	if idle > 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.boxes, c.ID())
}

// setRun makes run answer the executions from now on.
func (f *fakeContainers) setRun(run func(ctx context.Context, code string) (sandbox.Result, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.run = run
}

// Live returns the containers not deleted.
func (f *fakeContainers) Live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.boxes)
}

// Created returns how many containers were created.
func (f *fakeContainers) Created() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// Codes returns the code of every execution so far.
func (f *fakeContainers) Codes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.codes...)
}

func (b *fakeBox) ID() string { return b.id }

func (b *fakeBox) Run(ctx context.Context, code string, _ sandbox.RunOptions) (sandbox.Result, error) {
	f := b.f
	f.mu.Lock()
	f.codes = append(f.codes, code)
	run := f.run
	f.mu.Unlock()
	if run == nil {
		return sandbox.Result{ExecutionCount: 1}, nil
	}
	return run(ctx, code)
}

var _ containers = (*fakeContainers)(nil)
