package intercept

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// fakeContainers is a containerManager without a sandbox, for the tests whose subject is the
// engine, not the code: containers are held by owner, opened only by it, deleted when discarded,
// and code "runs" by calling run. It keeps containers.Manager's contract as the engine
// relies on it:
// an unknown tool is sandbox.ErrUnavailable, another owner's or an unknown id sandbox.ErrNotFound.
type fakeContainers struct {
	tool string // the only sandbox tool configured

	mu    sync.Mutex
	boxes map[string]*fakeBox // live containers by id
	n     int
	codes []string // every code run, in order
	// run answers an execution; nil: nothing printed, nothing returned.
	run func(ctx context.Context, code string) (sandbox.Result, error)
	// writes returns the files an execution writes; nil: none.
	writes  func(code string) map[string]string
	stored  map[string]string // Files API file id → content, for PlaceFiles
	maxFile int64             // the largest file PlaceFiles takes; 0: any
	// network is the tool's network bound (nil: a tool without network); created records the
	// CreateOptions of each container made.
	network *egress.Bound
	created []sandbox.CreateOptions
	nfiles  int
	placed  int
}

type fakeBox struct {
	f     *fakeContainers
	id    string
	owner string

	// Guarded by f.mu. fs is /mnt/data; seen what the last collection (or placement) saw of
	// each file; origins the file placed from each origin.
	fs      map[string]*fakeFile
	seen    map[string]string
	origins map[string]string
}

func newFakeContainers(tool string) *fakeContainers {
	return &fakeContainers{tool: tool, boxes: map[string]*fakeBox{}, stored: map[string]string{}}
}

func (f *fakeContainers) Create(ctx context.Context, tool, owner string, opts sandbox.CreateOptions, _ time.Duration) (heldContainer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tool != f.tool {
		return nil, fmt.Errorf("%w: sandbox tool %q is not configured", sandbox.ErrUnavailable, tool)
	}
	network, err := sandbox.NetworkPolicy(f.provider(), tool, "fake", opts.NetworkPolicy)
	if err != nil {
		return nil, err
	}
	opts.Network = network
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, opts)
	f.n++
	b := &fakeBox{f: f, id: "cntr_fake" + strconv.Itoa(f.n), owner: owner}
	f.boxes[b.id] = b
	return b, nil
}

func (f *fakeContainers) Open(_ context.Context, id, owner string) (heldContainer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok || b.owner != owner {
		return nil, fmt.Errorf("%w: unknown container id", sandbox.ErrNotFound)
	}
	return b, nil
}

// Release keeps the box for later requests.
func (b *fakeBox) Release(context.Context) {}

// Discard deletes the box.
func (b *fakeBox) Discard(context.Context) {
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	delete(b.f.boxes, b.id)
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

// run runs code: it records it, writes the files f.writes says, and answers with f.run.
func (b *fakeBox) run(ctx context.Context, code string) (sandbox.Result, error) {
	f := b.f
	f.mu.Lock()
	f.codes = append(f.codes, code)
	run := f.run
	if f.writes != nil {
		if _, err := f.box(b); err == nil {
			for rel, data := range f.writes(code) {
				if ff, ok := b.fs[rel]; ok {
					ff.data = []byte(data)
				} else {
					b.fs[rel] = &fakeFile{data: []byte(data)}
				}
			}
		}
	}
	f.mu.Unlock()
	if run == nil {
		return sandbox.Result{ExecutionCount: 1}, nil
	}
	return run(ctx, code)
}

// networked is a provider with the fake's network bound, for sandbox.NetworkPolicy.
type networked struct {
	sandbox.Provider
	b egress.Bound
}

func (n networked) NetworkBound() egress.Bound { return n.b }
func (networked) DomainSecrets() bool          { return true }

func (f *fakeContainers) provider() sandbox.Provider {
	if f.network == nil {
		return nil
	}
	return networked{b: *f.network}
}

func (f *fakeContainers) CheckNetwork(_ context.Context, tool string, asked *egress.Policy) (egress.Policy, error) {
	return sandbox.NetworkPolicy(f.provider(), tool, "fake", asked)
}

var (
	_ containerManager = (*fakeContainers)(nil)
	_ heldContainer    = (*fakeBox)(nil)
)

// The fake's files: each box keeps a /mnt/data in memory, placed files are recorded as the
// Sessions' contract says (names made unique, a file placed again from the same origin not
// written again), and CollectFiles finds what changed since the last collection.

type fakeFile struct {
	data []byte
	rec  store.ContainerFile
}

// setWrites makes every execution from now on write the files writes returns (path relative to
// /mnt/data → content), as code that saves files would.
func (f *fakeContainers) setWrites(writes func(code string) map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = writes
}

// fileData returns the content of a file in container id, as the code would read it.
func (f *fakeContainers) fileData(id, rel string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok {
		return "", false
	}
	ff, ok := b.fs[rel]
	return string(ff.data), ok
}

// onlyBox returns the id of the one live container ("" unless there is exactly one).
func (f *fakeContainers) onlyBox() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.boxes) != 1 {
		return ""
	}
	for id := range f.boxes {
		return id
	}
	return ""
}

// placements returns how many files were written by PlaceFiles.
func (f *fakeContainers) placements() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.placed
}

func (f *fakeContainers) box(c heldContainer) (*fakeBox, error) {
	b, ok := f.boxes[c.ID()]
	if !ok {
		return nil, fmt.Errorf("%w: container %s", sandbox.ErrNotFound, c.ID())
	}
	if b.fs == nil {
		b.fs = map[string]*fakeFile{}
		b.origins = map[string]string{}
		b.seen = map[string]string{}
	}
	return b, nil
}

func (f *fakeContainers) newFileID() string {
	f.nfiles++
	return fmt.Sprintf("cfile_fake%d", f.nfiles)
}

func (c *fakeBox) Place(_ context.Context, files []containers.Placement, _ containers.ContainerLimits) ([]store.ContainerFile, error) {
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(c)
	if err != nil {
		return nil, err
	}
	out := make([]store.ContainerFile, 0, len(files))
	for _, p := range files {
		data := p.Data
		origin := "file:" + p.FileID
		if p.FileID != "" {
			d, ok := f.stored[p.FileID]
			if !ok {
				return nil, fmt.Errorf("%w: no file %s", store.ErrNotFound, p.FileID)
			}
			data = []byte(d)
		} else {
			sum := sha256.Sum256(append([]byte(p.Name+"\x00"), data...))
			origin = "data:" + hex.EncodeToString(sum[:])
		}
		if int64(len(data)) > f.maxFile && f.maxFile > 0 {
			return nil, &containers.FileError{Index: len(out), FileID: p.FileID, Err: fmt.Errorf("%w: %s", sandbox.ErrFileTooLarge, p.Name)}
		}
		if rel, ok := b.origins[origin]; ok {
			out = append(out, b.fs[rel].rec)
			continue
		}
		rel := p.Name
		ext := path.Ext(rel)
		for n := 1; b.fs[rel] != nil; n++ {
			rel = fmt.Sprintf("%s (%d)%s", strings.TrimSuffix(p.Name, ext), n, ext)
		}
		rec := store.ContainerFile{ID: f.newFileID(), ContainerID: b.id, Owner: b.owner, Path: sandbox.DataDir + "/" + rel, Bytes: int64(len(data)), Source: "user"}
		b.fs[rel] = &fakeFile{data: data, rec: rec}
		b.origins[origin] = rel
		b.seen[rel] = string(data)
		f.placed++
		out = append(out, rec)
	}
	return out, nil
}

func (c *fakeBox) Execute(ctx context.Context, code string, _ sandbox.RunOptions, _ containers.ContainerLimits) (sandbox.Result, containers.Outputs, error) {
	f := c.f
	res, err := c.run(ctx, code)
	if err != nil {
		return res, containers.Outputs{}, err
	}
	written, err := f.collect(c)
	if err != nil {
		return res, containers.Outputs{}, fmt.Errorf("%w: %w", containers.ErrCollect, err)
	}
	return res, containers.Outputs{Files: written}, nil
}

// collect finds what changed in c's /mnt/data since the last collection or placement.
func (f *fakeContainers) collect(c heldContainer) ([]store.ContainerFile, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(c)
	if err != nil {
		return nil, err
	}
	var rels []string
	for rel, ff := range b.fs {
		if old, ok := b.seen[rel]; !ok || old != string(ff.data) {
			rels = append(rels, rel)
		}
	}
	sort.Strings(rels)
	out := make([]store.ContainerFile, 0, len(rels))
	for _, rel := range rels {
		ff := b.fs[rel]
		ff.rec = store.ContainerFile{ID: f.newFileID(), ContainerID: b.id, Owner: b.owner, Path: sandbox.DataDir + "/" + rel, Bytes: int64(len(ff.data)), Source: "assistant"}
		b.seen[rel] = string(ff.data)
		out = append(out, ff.rec)
	}
	return out, nil
}

func (f *fakeContainers) Files(_ context.Context, _, id string, _ store.ContainerFileQuery) (store.List[store.ContainerFile], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok {
		return store.List[store.ContainerFile]{}, fmt.Errorf("%w: container %s", sandbox.ErrNotFound, id)
	}
	var out []store.ContainerFile
	for rel, ff := range b.fs {
		if _, ok := b.seen[rel]; ok {
			out = append(out, ff.rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return store.List[store.ContainerFile]{Items: out}, nil
}

// Shell "runs" each command with a small script language, parts separated by "; ": "echo T"
// and "echoerr T" write T and a newline to stdout and stderr, "write P T" writes T to P under
// /mnt/data, "exit N" ends with N, "hang" runs until its timeout. Commands are recorded as
// "$ " + command among the codes.
func (c *fakeBox) Shell(ctx context.Context, commands []string, opts func(int) sandbox.ExecOptions, ended func(int, sandbox.ExecResult), _ containers.ContainerLimits) (containers.Outputs, error) {
	f := c.f
	for i, cmd := range commands {
		o := opts(i)
		f.mu.Lock()
		f.codes = append(f.codes, "$ "+cmd)
		f.mu.Unlock()
		res := sandbox.ExecResult{}
	parts:
		for _, part := range strings.Split(cmd, "; ") {
			verb, arg, _ := strings.Cut(part, " ")
			switch verb {
			case "echo", "echoerr":
				st := sandbox.Stdout
				if verb == "echoerr" {
					st = sandbox.Stderr
				}
				if o.OnOutput != nil {
					o.OnOutput(st, arg+"\n")
				}
			case "write":
				rel, data, _ := strings.Cut(arg, " ")
				f.mu.Lock()
				if _, err := f.box(c); err == nil {
					c.fs[rel] = &fakeFile{data: []byte(data)}
				}
				f.mu.Unlock()
			case "exit":
				res.ExitCode, _ = strconv.Atoi(arg)
				break parts
			case "hang":
				select {
				case <-ctx.Done():
					return containers.Outputs{}, ctx.Err()
				case <-time.After(o.Timeout):
				}
				res.TimedOut = true
				break parts
			default:
				res.ExitCode = 127
				if o.OnOutput != nil {
					o.OnOutput(sandbox.Stderr, "bash: "+verb+": command not found\n")
				}
			}
		}
		ended(i, res)
	}
	written, err := f.collect(c)
	if err != nil {
		return containers.Outputs{}, fmt.Errorf("%w: %w", containers.ErrCollect, err)
	}
	return containers.Outputs{Files: written}, nil
}
