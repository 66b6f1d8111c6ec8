// Package storetest is the conformance suite of store.Store: every implementation (the embedded
// one, a shared one) passes Run. MemFiles is a read-only Files store in memory for the unit tests
// of code that reads files by id, and MemResponses a store.Responses in memory (which passes
// RunResponses) for those of code that keeps responses; end-to-end tests use the real stores.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// Factory makes the store under test, reading the clock now. It returns open, which opens a Store
// on the same backing data each time it is called: the second call, made after the suite closed
// the first store, is a restart. The factory cleans up the backing data itself (t.Cleanup).
type Factory func(t *testing.T, now func() time.Time) (open func() store.Store)

// Clock is the suite's settable clock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock at a fixed time.
func NewClock() *Clock { return &Clock{now: time.Date(2026, 8, 21, 12, 0, 0, 0, time.UTC)} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is one store under test.
type env struct {
	t     *testing.T
	clock *Clock
	open  func() store.Store
	s     store.Store
	ctx   context.Context
}

func newEnv(t *testing.T, f Factory) *env {
	t.Helper()
	c := NewClock()
	e := &env{t: t, clock: c, open: f(t, c.Now), ctx: context.Background()}
	e.s = e.open()
	t.Cleanup(func() { _ = e.s.Close() })
	return e
}

// restart closes the store and opens it again on the same data.
func (e *env) restart() {
	e.t.Helper()
	if err := e.s.Close(); err != nil {
		e.t.Fatalf("Close() = %v", err)
	}
	e.s = e.open()
}

// Run runs the whole suite against the stores f makes.
func Run(t *testing.T, f Factory) {
	t.Run("IDs", func(t *testing.T) { testIDs(t, f) })
	t.Run("Files", func(t *testing.T) { testFiles(t, f) })
	t.Run("FileLimits", func(t *testing.T) { testFileLimits(t, f) })
	t.Run("FileQuotaRace", func(t *testing.T) { testFileQuotaRace(t, f) })
	t.Run("UploadReservations", func(t *testing.T) { testUploadReservations(t, f) })
	t.Run("UploadSlots", func(t *testing.T) { testUploadSlots(t, f) })
	t.Run("UploadsInFlight", func(t *testing.T) { testUploadsInFlight(t, f) })
	t.Run("AbandonedUpload", func(t *testing.T) { testAbandonedUpload(t, f) })
	t.Run("FilePages", func(t *testing.T) { testFilePages(t, f) })
	t.Run("FileExpiry", func(t *testing.T) { testFileExpiry(t, f) })
	t.Run("Containers", func(t *testing.T) { testContainers(t, f) })
	t.Run("ContainerConflicts", func(t *testing.T) { testContainerConflicts(t, f) })
	t.Run("ContainerPages", func(t *testing.T) { testContainerPages(t, f) })
	t.Run("ContainerFiles", func(t *testing.T) { testContainerFiles(t, f) })
	t.Run("ContainerExpiry", func(t *testing.T) { testContainerExpiry(t, f) })
	t.Run("Responses", func(t *testing.T) {
		e := newEnv(t, f)
		testResponses(t, e.clock, e.s)
	})
	t.Run("Claims", func(t *testing.T) { testClaims(t, f) })
	t.Run("Places", func(t *testing.T) { testPlaces(t, f) })
	t.Run("PlaceRace", func(t *testing.T) { testPlaceRace(t, f) })
	t.Run("Tokens", func(t *testing.T) { testTokens(t, f) })
	t.Run("Restart", func(t *testing.T) { testRestart(t, f) })
	t.Run("Closed", func(t *testing.T) { testClosed(t, f) })
}

var idShapes = map[store.Kind]*regexp.Regexp{
	store.FileKind:          regexp.MustCompile(`^file-[A-Za-z0-9]{22}$`),
	store.ContainerKind:     regexp.MustCompile(`^cntr_[0-9a-f]{48}$`),
	store.ContainerFileKind: regexp.MustCompile(`^cfile_[0-9a-f]{32}$`),
}

func testIDs(t *testing.T, f Factory) {
	e := newEnv(t, f)
	for k, re := range idShapes {
		seen := map[string]bool{}
		prev := ""
		for range 2000 {
			id := e.s.NewID(k)
			if !re.MatchString(id) || !k.Valid(id) {
				t.Fatalf("NewID(%s) = %q; want %s", k.Prefix(), id, re)
			}
			if seen[id] {
				t.Fatalf("NewID(%s) repeated %q", k.Prefix(), id)
			}
			if id <= prev {
				t.Fatalf("NewID(%s) = %q after %q: ids must sort in the order they were minted", k.Prefix(), id, prev)
			}
			seen[id], prev = true, id
		}
	}
	if store.FileKind.Valid("file-abc") || store.ContainerKind.Valid(e.s.NewID(store.FileKind)) || store.FileKind.Valid("file-../../etc/passwd000") {
		t.Error("Valid accepts ids of the wrong shape")
	}
}

// put stores content as a file of owner.
func (e *env) put(owner, name, purpose, content string, lim store.FileLimits) (store.File, error) {
	return store.CreateFile(e.ctx, e.s, store.File{Owner: owner, Filename: name, Purpose: purpose}, strings.NewReader(content), lim)
}

func (e *env) mustPut(owner, name, purpose, content string) store.File {
	e.t.Helper()
	f, err := e.put(owner, name, purpose, content, store.FileLimits{})
	if err != nil {
		e.t.Fatalf("CreateFile(%s) = %v", name, err)
	}
	return f
}

func (e *env) content(owner, id string) (string, error) {
	_, rc, err := e.s.OpenFile(e.ctx, owner, id)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

func (e *env) usage(owner string) store.Usage {
	e.t.Helper()
	u, err := e.s.Usage(e.ctx, owner)
	if err != nil {
		e.t.Fatalf("Usage(%s) = %v", owner, err)
	}
	return u
}

func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("%s = %v; want ErrNotFound", what, err)
	}
}

func testFiles(t *testing.T, f Factory) {
	e := newEnv(t, f)
	before := e.clock.Now()
	a := e.mustPut("alice", "sales.csv", "user_data", "a,b\n1,2\n")
	if !store.FileKind.Valid(a.ID) || a.Owner != "alice" || a.Filename != "sales.csv" || a.Purpose != "user_data" ||
		a.Bytes != 8 || !a.ExpiresAt.IsZero() || a.CreatedAt.Before(before) {
		t.Fatalf("CreateFile = %+v", a)
	}
	got, err := e.s.File(e.ctx, "alice", a.ID)
	if err != nil || got.ID != a.ID || got.Bytes != 8 || !got.CreatedAt.Equal(a.CreatedAt) || got.Filename != "sales.csv" {
		t.Fatalf("File = %+v, %v; want %+v", got, err, a)
	}
	if c, err := e.content("alice", a.ID); err != nil || c != "a,b\n1,2\n" {
		t.Fatalf("OpenFile content = %q, %v", c, err)
	}
	empty := e.mustPut("alice", "empty.txt", "assistants", "")
	if c, err := e.content("alice", empty.ID); err != nil || c != "" || empty.Bytes != 0 {
		t.Fatalf("empty file = %+v %q, %v", empty, c, err)
	}
	if u := e.usage("alice"); u != (store.Usage{Files: 2, Bytes: 8}) {
		t.Errorf("Usage(alice) = %+v", u)
	}

	// Another owner sees nothing of alice's.
	_, err = e.s.File(e.ctx, "bob", a.ID)
	wantNotFound(t, "File(bob, alice's)", err)
	_, err = e.content("bob", a.ID)
	wantNotFound(t, "OpenFile(bob, alice's)", err)
	_, err = e.s.DeleteFile(e.ctx, "bob", a.ID)
	wantNotFound(t, "DeleteFile(bob, alice's)", err)
	if l, err := e.s.ListFiles(e.ctx, "bob", store.FileQuery{}); err != nil || len(l.Items) != 0 || l.HasMore {
		t.Errorf("ListFiles(bob) = %+v, %v", l, err)
	}
	if u := e.usage("bob"); u != (store.Usage{}) {
		t.Errorf("Usage(bob) = %+v", u)
	}
	for _, id := range []string{"", "file-nope", "../files/" + a.ID, a.ID + "/", "file-0000000000000000000000"} {
		_, err := e.s.File(e.ctx, "alice", id)
		wantNotFound(t, fmt.Sprintf("File(%q)", id), err)
	}

	// A reader opened before a delete still reads the file.
	_, rc, err := e.s.OpenFile(e.ctx, "alice", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	del, err := e.s.DeleteFile(e.ctx, "alice", a.ID)
	if err != nil || del.ID != a.ID || del.Bytes != 8 {
		t.Fatalf("DeleteFile = %+v, %v", del, err)
	}
	b, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil || string(b) != "a,b\n1,2\n" {
		t.Errorf("reading after delete = %q, %v", b, err)
	}
	_, err = e.s.File(e.ctx, "alice", a.ID)
	wantNotFound(t, "File after delete", err)
	_, err = e.s.DeleteFile(e.ctx, "alice", a.ID)
	wantNotFound(t, "DeleteFile twice", err)
	if u := e.usage("alice"); u != (store.Usage{Files: 1, Bytes: 0}) {
		t.Errorf("Usage(alice) after delete = %+v", u)
	}

	// Create-if-absent with a chosen id.
	id := e.s.NewID(store.FileKind)
	if _, err := store.CreateFile(e.ctx, e.s, store.File{ID: id, Owner: "alice", Filename: "x", Purpose: "user_data"}, strings.NewReader("1"), store.FileLimits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateFile(e.ctx, e.s, store.File{ID: id, Owner: "bob", Filename: "y", Purpose: "user_data"}, strings.NewReader("22"), store.FileLimits{}); !errors.Is(err, store.ErrExists) {
		t.Errorf("CreateFile with a taken id = %v; want ErrExists", err)
	}
	if u := e.usage("bob"); u != (store.Usage{}) {
		t.Errorf("a lost create-if-absent counted: Usage(bob) = %+v", u)
	}
	if _, err := store.CreateFile(e.ctx, e.s, store.File{ID: "file-bad", Owner: "bob"}, strings.NewReader(""), store.FileLimits{}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("CreateFile with a malformed id = %v; want ErrInvalid", err)
	}

	// An aborted upload leaves nothing; a finished one cannot be used again.
	up, err := e.s.BeginFile(e.ctx, "carol", store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := up.Write(e.ctx, strings.NewReader("draft")); err != nil {
		t.Fatal(err)
	}
	if err := up.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := up.Abort(); err != nil {
		t.Errorf("second Abort = %v", err)
	}
	if _, err := up.Commit(e.ctx, store.File{}); err == nil {
		t.Error("Commit after Abort succeeded")
	}
	if u := e.usage("carol"); u != (store.Usage{}) {
		t.Errorf("aborted upload counted: %+v", u)
	}
	up, _ = e.s.BeginFile(e.ctx, "carol", store.FileLimits{})
	_, _ = up.Write(e.ctx, strings.NewReader("one"))
	_, _ = up.Write(e.ctx, strings.NewReader("two"))
	cf, err := up.Commit(e.ctx, store.File{Filename: "c.txt", Purpose: "user_data", Owner: "mallory"})
	if err != nil || cf.Owner != "carol" || cf.Bytes != 6 {
		t.Fatalf("Commit = %+v, %v (the owner is the upload's)", cf, err)
	}
	if err := up.Abort(); err != nil {
		t.Errorf("Abort after Commit = %v", err)
	}
	if c, _ := e.content("carol", cf.ID); c != "onetwo" {
		t.Errorf("content after Abort-after-Commit = %q", c)
	}
	if _, err := up.Commit(e.ctx, store.File{}); err == nil {
		t.Error("second Commit succeeded")
	}
	if _, err := up.Write(e.ctx, strings.NewReader("more")); err == nil {
		t.Error("Write after Commit succeeded")
	}

	// A reader that fails mid-way (a cut upload) stores nothing.
	up, _ = e.s.BeginFile(e.ctx, "dave", store.FileLimits{})
	if _, err := up.Write(e.ctx, io.MultiReader(strings.NewReader("partial"), errReader{})); err == nil {
		t.Error("Write from a failing reader succeeded")
	}
	if _, err := up.Commit(e.ctx, store.File{}); err == nil {
		t.Error("Commit after a failed Write succeeded")
	}
	_ = up.Abort()
	if u := e.usage("dave"); u != (store.Usage{}) {
		t.Errorf("cut upload counted: %+v", u)
	}

	// Concurrent uploads and deletes keep the accounting exact.
	var wg sync.WaitGroup
	ids := make([]string, 16)
	for i := range ids {
		wg.Go(func() {
			f, err := e.put("erin", fmt.Sprintf("f%d", i), "user_data", strings.Repeat("x", i), store.FileLimits{})
			if err != nil {
				t.Error(err)
			}
			ids[i] = f.ID
		})
	}
	wg.Wait()
	for i := 0; i < len(ids); i += 2 {
		wg.Go(func() {
			if _, err := e.s.DeleteFile(e.ctx, "erin", ids[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var want int64
	for i := 1; i < len(ids); i += 2 {
		want += int64(i)
	}
	if u := e.usage("erin"); u != (store.Usage{Files: 8, Bytes: want}) {
		t.Errorf("Usage(erin) = %+v; want 8 files, %d bytes", u, want)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func testFileLimits(t *testing.T, f Factory) {
	e := newEnv(t, f)
	lim := store.FileLimits{MaxBytes: 10, OwnerBytes: 25}
	if _, err := e.put("alice", "ten", "user_data", strings.Repeat("a", 10), lim); err != nil {
		t.Fatalf("a file of exactly MaxBytes = %v", err)
	}
	if _, err := e.put("alice", "eleven", "user_data", strings.Repeat("a", 11), lim); !errors.Is(err, store.ErrTooLarge) {
		t.Errorf("a file over MaxBytes = %v; want ErrTooLarge", err)
	}
	if _, err := e.put("alice", "ten2", "user_data", strings.Repeat("b", 10), lim); err != nil {
		t.Fatal(err)
	}
	// 20 of 25 bytes used: 6 more is over the quota, 5 fits exactly.
	if _, err := e.put("alice", "six", "user_data", "123456", lim); !errors.Is(err, store.ErrQuota) {
		t.Errorf("a file past the quota = %v; want ErrQuota", err)
	}
	if _, err := e.put("alice", "five", "user_data", "12345", lim); err != nil {
		t.Errorf("a file filling the quota exactly = %v", err)
	}
	if _, err := e.s.BeginFile(e.ctx, "alice", lim); !errors.Is(err, store.ErrQuota) {
		t.Errorf("BeginFile with the quota full = %v; want ErrQuota", err)
	}
	if u := e.usage("alice"); u != (store.Usage{Files: 3, Bytes: 25}) {
		t.Errorf("Usage = %+v; refused files must not count", u)
	}
	if l, _ := e.s.ListFiles(e.ctx, "alice", store.FileQuery{}); len(l.Items) != 3 {
		t.Errorf("ListFiles holds %d files; want 3", len(l.Items))
	}
	// Quotas are per owner, and a file deleted gives its bytes back.
	if _, err := e.put("bob", "b", "user_data", "1234567890", lim); err != nil {
		t.Errorf("bob's upload = %v", err)
	}
	l, _ := e.s.ListFiles(e.ctx, "alice", store.FileQuery{})
	if _, err := e.s.DeleteFile(e.ctx, "alice", l.Items[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.put("alice", "again", "user_data", "12345", lim); err != nil {
		t.Errorf("upload after a delete freed the quota = %v", err)
	}
	// A large stream is cut just past the limit, not read to its end.
	up, err := e.s.BeginFile(e.ctx, "carol", store.FileLimits{MaxBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Abort()
	var src countingReader
	if _, err := up.Write(e.ctx, io.LimitReader(&src, 1<<30)); !errors.Is(err, store.ErrTooLarge) {
		t.Errorf("Write of 1 GiB under a 1 KiB limit = %v", err)
	}
	if src.n > 1<<20 {
		t.Errorf("read %d bytes of a stream over the limit; want it cut near the limit", src.n)
	}
}

type countingReader struct{ n int64 }

func (c *countingReader) Read(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// testFileQuotaRace: uploads that each fit the quota alone but not together race from BeginFile
// to Commit; exactly as many succeed as fit, the others are refused by their Write (whose bytes
// are reserved) or their Commit.
func testFileQuotaRace(t *testing.T, f Factory) {
	e := newEnv(t, f)
	lim := store.FileLimits{OwnerBytes: 100}
	var ok, quota atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := e.put("alice", "x", "user_data", strings.Repeat("x", 30), lim)
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, store.ErrQuota):
				quota.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 3 || quota.Load() != 5 {
		t.Errorf("%d uploads succeeded and %d were over the quota; want 3 and 5", ok.Load(), quota.Load())
	}
	if u := e.usage("alice"); u != (store.Usage{Files: 3, Bytes: 90}) {
		t.Errorf("Usage = %+v", u)
	}
}

// begin starts an upload of owner, failing the test if it is refused.
func (e *env) begin(owner string, lim store.FileLimits) store.FileUpload {
	e.t.Helper()
	up, err := e.s.BeginFile(e.ctx, owner, lim)
	if err != nil {
		e.t.Fatalf("BeginFile(%s) = %v", owner, err)
	}
	e.t.Cleanup(func() { _ = up.Abort() })
	return up
}

// write writes n bytes to up.
func (e *env) write(up store.FileUpload, n int) error {
	_, err := up.Write(e.ctx, strings.NewReader(strings.Repeat("r", n)))
	return err
}

func (e *env) commit(up store.FileUpload) (store.File, error) {
	return up.Commit(e.ctx, store.File{Filename: "r", Purpose: "user_data"})
}

// testUploadReservations: what an upload in flight has written counts against its owner's quota
// (not another owner's) until it is committed, when it becomes the file's, or aborted, when it is
// free again; uploads in flight are not files (Usage).
func testUploadReservations(t *testing.T, f Factory) {
	e := newEnv(t, f)
	lim := store.FileLimits{OwnerBytes: 100}
	a := e.begin("alice", lim)
	if err := e.write(a, 60); err != nil {
		t.Fatalf("60 of 100 bytes = %v", err)
	}
	b := e.begin("alice", lim)
	if err := e.write(b, 41); !errors.Is(err, store.ErrQuota) {
		t.Errorf("41 bytes beside 60 in flight, of 100 = %v; want ErrQuota", err)
	}
	if err := b.Abort(); err != nil {
		t.Fatal(err)
	}
	c := e.begin("alice", lim)
	if err := e.write(c, 40); err != nil {
		t.Errorf("40 bytes beside 60 in flight, of 100 = %v", err)
	}
	if _, err := e.s.BeginFile(e.ctx, "alice", lim); !errors.Is(err, store.ErrQuota) {
		t.Errorf("BeginFile with the quota held by uploads in flight = %v; want ErrQuota", err)
	}
	if u := e.usage("alice"); u != (store.Usage{}) {
		t.Errorf("Usage with two uploads in flight = %+v; uploads in flight are not files", u)
	}
	bob := e.begin("bob", lim)
	if err := e.write(bob, 100); err != nil {
		t.Errorf("another owner's upload = %v; quotas are per owner", err)
	}
	if err := a.Abort(); err != nil {
		t.Fatal(err)
	}
	d := e.begin("alice", lim)
	if err := e.write(d, 60); err != nil {
		t.Errorf("60 bytes after an abort freed 60 = %v", err)
	}
	for _, up := range []store.FileUpload{c, d} {
		if _, err := e.commit(up); err != nil {
			t.Errorf("Commit = %v", err)
		}
	}
	if u := e.usage("alice"); u != (store.Usage{Files: 2, Bytes: 100}) {
		t.Errorf("Usage after two commits = %+v", u)
	}
	if _, err := e.s.BeginFile(e.ctx, "alice", lim); !errors.Is(err, store.ErrQuota) {
		t.Errorf("BeginFile with the quota held by files = %v; want ErrQuota", err)
	}
	// A commit frees the reservation: the bytes count once, as the file's.
	l, _ := e.s.ListFiles(e.ctx, "alice", store.FileQuery{})
	if _, err := e.s.DeleteFile(e.ctx, "alice", l.Items[0].ID); err != nil {
		t.Fatal(err)
	}
	g := e.begin("alice", lim)
	if err := e.write(g, 60); err != nil {
		t.Errorf("60 bytes beside a 40-byte file = %v", err)
	}
}

// testUploadSlots: an owner has at most MaxUploads uploads in flight; a slot is held from
// BeginFile, even by an upload whose Write was refused, until Commit or Abort.
func testUploadSlots(t *testing.T, f Factory) {
	e := newEnv(t, f)
	lim := store.FileLimits{MaxUploads: 2, OwnerBytes: 10}
	a, b := e.begin("alice", lim), e.begin("alice", lim)
	if _, err := e.s.BeginFile(e.ctx, "alice", lim); !errors.Is(err, store.ErrTooManyUploads) {
		t.Errorf("a third upload of two allowed = %v; want ErrTooManyUploads", err)
	}
	e.begin("bob", lim)
	if err := e.write(a, 11); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("Write past the quota = %v; want ErrQuota", err)
	}
	if _, err := e.s.BeginFile(e.ctx, "alice", lim); !errors.Is(err, store.ErrTooManyUploads) {
		t.Errorf("BeginFile beside a refused upload not yet aborted = %v; want ErrTooManyUploads", err)
	}
	if err := a.Abort(); err != nil {
		t.Fatal(err)
	}
	c := e.begin("alice", lim)
	if err := e.write(b, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := e.commit(b); err != nil {
		t.Fatal(err)
	}
	e.begin("alice", lim)
	if _, err := e.s.BeginFile(e.ctx, "alice", lim); !errors.Is(err, store.ErrTooManyUploads) {
		t.Errorf("a third upload after a commit and a new one = %v; want ErrTooManyUploads", err)
	}
	if _, err := e.commit(c); err != nil {
		t.Errorf("an empty upload's Commit = %v", err)
	}
}

// testUploadsInFlight: the uploads in flight of every owner together hold at most MaxInFlight
// bytes; committed files do not count.
func testUploadsInFlight(t *testing.T, f Factory) {
	e := newEnv(t, f)
	lim := store.FileLimits{MaxInFlight: 100}
	a := e.begin("alice", lim)
	if err := e.write(a, 70); err != nil {
		t.Fatal(err)
	}
	b := e.begin("bob", lim)
	if err := e.write(b, 31); !errors.Is(err, store.ErrInFlightFull) {
		t.Errorf("31 bytes beside 70 in flight, of 100 = %v; want ErrInFlightFull", err)
	}
	if err := b.Abort(); err != nil {
		t.Fatal(err)
	}
	b = e.begin("bob", lim)
	if err := e.write(b, 30); err != nil {
		t.Errorf("30 bytes beside 70 in flight, of 100 = %v", err)
	}
	if _, err := e.s.BeginFile(e.ctx, "carol", lim); !errors.Is(err, store.ErrInFlightFull) {
		t.Errorf("BeginFile with every in-flight byte held = %v; want ErrInFlightFull", err)
	}
	if _, err := e.commit(a); err != nil {
		t.Fatal(err)
	}
	c := e.begin("carol", lim)
	if err := e.write(c, 70); err != nil {
		t.Errorf("70 bytes once a 70-byte upload was committed = %v", err)
	}
}

// abandonAfter is how long after its last write an upload neither committed nor aborted may hold
// its reservation (a process that died mid-upload): every store under test must forget it by then.
const abandonAfter = 2 * time.Hour

// testAbandonedUpload: a store closed with an upload in flight (its process died) does not keep
// that upload's reservation forever: not its owner's upload slot, not its bytes against the
// owner's quota, not its bytes among every owner's in flight.
func testAbandonedUpload(t *testing.T, f Factory) {
	e := newEnv(t, f)
	lim := store.FileLimits{OwnerBytes: 100, MaxUploads: 1, MaxInFlight: 100}
	up, err := e.s.BeginFile(e.ctx, "alice", lim)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.write(up, 90); err != nil {
		t.Fatal(err)
	}
	// What the upload holds, so that what follows shows it given back.
	if _, err := e.s.BeginFile(e.ctx, "alice", lim); !errors.Is(err, store.ErrTooManyUploads) {
		t.Fatalf("BeginFile beside an upload holding the one slot = %v; want ErrTooManyUploads", err)
	}
	if _, err := e.put("bob", "b", "user_data", strings.Repeat("b", 11), lim); !errors.Is(err, store.ErrInFlightFull) {
		t.Fatalf("11 bytes beside 90 in flight, of 100 = %v; want ErrInFlightFull", err)
	}
	e.restart() // no Abort: the process is gone
	e.clock.Advance(abandonAfter)
	if _, err := e.put("bob", "whole", "user_data", strings.Repeat("b", 100), lim); err != nil {
		t.Errorf("every byte in flight after an abandoned upload = %v", err)
	}
	if _, err := e.put("alice", "whole", "user_data", strings.Repeat("w", 100), lim); err != nil {
		t.Errorf("the one slot and the whole quota after an abandoned upload = %v", err)
	}
}

func ids[T any](items []T, id func(T) string) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = id(it)
	}
	return out
}

func fileID(f store.File) string { return f.ID }

func testFilePages(t *testing.T, f Factory) {
	e := newEnv(t, f)
	var all []string // in creation order
	for i := range 7 {
		purpose := "user_data"
		if i%3 == 0 {
			purpose = "assistants"
		}
		all = append(all, e.mustPut("alice", fmt.Sprintf("f%d", i), purpose, "x").ID)
		e.clock.Advance(time.Second)
	}
	e.mustPut("bob", "other", "user_data", "y")
	desc := slices.Clone(all)
	slices.Reverse(desc)
	tests := []struct {
		name     string
		q        store.FileQuery
		want     []string
		wantMore bool
	}{
		{"all, newest first", store.FileQuery{}, desc, false},
		{"all, oldest first", store.FileQuery{Page: store.Page{Order: store.Asc}}, all, false},
		{"limit", store.FileQuery{Page: store.Page{Limit: 3}}, desc[:3], true},
		{"limit equal to the count", store.FileQuery{Page: store.Page{Limit: 7}}, desc, false},
		{"after, desc", store.FileQuery{Page: store.Page{After: desc[2], Limit: 3}}, desc[3:6], true},
		{"after, last page", store.FileQuery{Page: store.Page{After: desc[3], Limit: 3}}, desc[4:], false},
		{"after, asc", store.FileQuery{Page: store.Page{After: all[1], Order: store.Asc, Limit: 2}}, all[2:4], true},
		{"after the last", store.FileQuery{Page: store.Page{After: all[0]}}, nil, false},
		{"purpose", store.FileQuery{Purpose: "assistants"}, []string{all[6], all[3], all[0]}, false},
		{"purpose with limit", store.FileQuery{Purpose: "user_data", Page: store.Page{Limit: 2, Order: store.Asc}}, []string{all[1], all[2]}, true},
		{"unknown purpose", store.FileQuery{Purpose: "batch"}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := e.s.ListFiles(e.ctx, "alice", tc.q)
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(l.Items, fileID); !slices.Equal(got, tc.want) || l.HasMore != tc.wantMore {
				t.Errorf("ListFiles(%+v) = %v more=%v; want %v more=%v", tc.q, got, l.HasMore, tc.want, tc.wantMore)
			}
		})
	}

	// A cursor whose file was deleted still marks its place.
	if _, err := e.s.DeleteFile(e.ctx, "alice", desc[2]); err != nil {
		t.Fatal(err)
	}
	l, err := e.s.ListFiles(e.ctx, "alice", store.FileQuery{Page: store.Page{After: desc[2], Limit: 2}})
	if got := ids(l.Items, fileID); err != nil || !slices.Equal(got, desc[3:5]) {
		t.Errorf("after a deleted cursor = %v, %v; want %v", got, err, desc[3:5])
	}
	// Walking every page visits each file once.
	var walked []string
	cursor := ""
	for {
		l, err := e.s.ListFiles(e.ctx, "alice", store.FileQuery{Page: store.Page{After: cursor, Limit: 2}})
		if err != nil {
			t.Fatal(err)
		}
		walked = append(walked, ids(l.Items, fileID)...)
		if !l.HasMore {
			break
		}
		cursor = l.Items[len(l.Items)-1].ID
	}
	if want := slices.Delete(slices.Clone(desc), 2, 3); !slices.Equal(walked, want) {
		t.Errorf("paging = %v; want %v", walked, want)
	}
	for _, bad := range []string{"nope", "cntr_" + strings.Repeat("0", 48), "file-short"} {
		if _, err := e.s.ListFiles(e.ctx, "alice", store.FileQuery{Page: store.Page{After: bad}}); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ListFiles(after %q) = %v; want ErrInvalid", bad, err)
		}
	}
}

func testFileExpiry(t *testing.T, f Factory) {
	e := newEnv(t, f)
	soon, err := store.CreateFile(e.ctx, e.s, store.File{Owner: "alice", Filename: "soon", Purpose: "batch", ExpiresAt: e.clock.Now().Add(time.Hour)},
		strings.NewReader("12345"), store.FileLimits{})
	if err != nil || !soon.ExpiresAt.Equal(e.clock.Now().Add(time.Hour)) {
		t.Fatalf("CreateFile = %+v, %v", soon, err)
	}
	keep := e.mustPut("alice", "keep", "user_data", "abc")
	e.clock.Advance(time.Hour - time.Second)
	if _, err := e.s.File(e.ctx, "alice", soon.ID); err != nil {
		t.Fatalf("before its expiry: %v", err)
	}
	e.clock.Advance(time.Second)
	_, err = e.s.File(e.ctx, "alice", soon.ID)
	wantNotFound(t, "File at its expiry", err)
	_, err = e.content("alice", soon.ID)
	wantNotFound(t, "OpenFile at its expiry", err)
	l, _ := e.s.ListFiles(e.ctx, "alice", store.FileQuery{})
	if got := ids(l.Items, fileID); !slices.Equal(got, []string{keep.ID}) {
		t.Errorf("ListFiles after expiry = %v", got)
	}
	if u := e.usage("alice"); u != (store.Usage{Files: 1, Bytes: 3}) {
		t.Errorf("an expired file still counts: %+v", u)
	}
	if _, err := e.put("alice", "fits", "user_data", "12345", store.FileLimits{OwnerBytes: 8}); err != nil {
		t.Errorf("the quota an expired file held was not given back: %v", err)
	}
}

func (e *env) mustCreate(c store.Container) store.Container {
	e.t.Helper()
	c, err := e.s.CreateContainer(e.ctx, c)
	if err != nil {
		e.t.Fatalf("CreateContainer = %v", err)
	}
	return c
}

func testContainers(t *testing.T, f Factory) {
	e := newEnv(t, f)
	now := e.clock.Now()
	in := store.Container{Owner: "alice", Name: "analysis", Backend: "e2b", Tool: "e2b-tool", Handle: []byte(`{"i":"isbx"}`),
		Host: "replica-1", MemoryLimit: "4g", Status: "running", IdleTimeout: 20 * time.Minute, LastActiveAt: now, ExpiresAt: now.Add(20 * time.Minute)}
	c := e.mustCreate(in)
	if !store.ContainerKind.Valid(c.ID) || c.Version != 1 || c.CreatedAt.IsZero() {
		t.Fatalf("CreateContainer = %+v", c)
	}
	got, err := e.s.Container(e.ctx, "alice", c.ID)
	in.ID, in.Version, in.CreatedAt = c.ID, 1, c.CreatedAt
	if err != nil || !sameContainer(got, in) {
		t.Fatalf("Container = %+v, %v; want %+v", got, err, in)
	}
	_, err = e.s.Container(e.ctx, "bob", c.ID)
	wantNotFound(t, "Container(bob, alice's)", err)
	if _, err := e.s.CreateContainer(e.ctx, store.Container{ID: c.ID, Owner: "bob"}); !errors.Is(err, store.ErrExists) {
		t.Errorf("CreateContainer with a taken id = %v; want ErrExists", err)
	}
	if _, err := e.s.CreateContainer(e.ctx, store.Container{ID: "cntr_x", Owner: "bob"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("CreateContainer with a malformed id = %v; want ErrInvalid", err)
	}
	chosen := e.s.NewID(store.ContainerKind)
	if c2 := e.mustCreate(store.Container{ID: chosen, Owner: "bob"}); c2.ID != chosen {
		t.Errorf("CreateContainer kept id %q; want %q", c2.ID, chosen)
	}

	// Update: the version guards the write; id, owner and creation time stay.
	got.LastActiveAt = now.Add(time.Minute)
	got.ExpiresAt = now.Add(21 * time.Minute)
	got.Handle = []byte(`{"i":"isbx","a":"token"}`)
	got.CreatedAt = now.Add(time.Hour)
	up, err := e.s.UpdateContainer(e.ctx, got)
	if err != nil || up.Version != 2 || !up.LastActiveAt.Equal(now.Add(time.Minute)) || string(up.Handle) != `{"i":"isbx","a":"token"}` || !up.CreatedAt.Equal(c.CreatedAt) {
		t.Fatalf("UpdateContainer = %+v, %v", up, err)
	}
	if _, err := e.s.UpdateContainer(e.ctx, got); !errors.Is(err, store.ErrConflict) {
		t.Errorf("UpdateContainer with a stale version = %v; want ErrConflict", err)
	}
	stolen := up
	stolen.Owner = "bob"
	if _, err := e.s.UpdateContainer(e.ctx, stolen); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateContainer by another owner = %v; want ErrNotFound", err)
	}
	m, err := store.Modify(e.ctx, e.s, "alice", c.ID, func(c *store.Container) error { c.Status = "expired"; return nil })
	if err != nil || m.Status != "expired" || m.Version != 3 {
		t.Errorf("Modify = %+v, %v", m, err)
	}
	boom := errors.New("boom")
	if _, err := store.Modify(e.ctx, e.s, "alice", c.ID, func(*store.Container) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Modify with a failing change = %v", err)
	}

	// Delete takes the container's files along.
	if _, err := e.s.PutContainerFile(e.ctx, store.ContainerFile{ContainerID: c.ID, Owner: "alice", Path: "/mnt/data/a.csv", Bytes: 3, Source: "user"}); err != nil {
		t.Fatal(err)
	}
	wantNotFound(t, "DeleteContainer(bob, alice's)", e.s.DeleteContainer(e.ctx, "bob", c.ID))
	if err := e.s.DeleteContainer(e.ctx, "alice", c.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.s.Container(e.ctx, "alice", c.ID)
	wantNotFound(t, "Container after delete", err)
	_, err = e.s.ListContainerFiles(e.ctx, "alice", c.ID, store.ContainerFileQuery{})
	wantNotFound(t, "ListContainerFiles after delete", err)
	wantNotFound(t, "DeleteContainer twice", e.s.DeleteContainer(e.ctx, "alice", c.ID))
}

func sameContainer(a, b store.Container) bool {
	return a.ID == b.ID && a.Owner == b.Owner && a.Name == b.Name && a.Backend == b.Backend && a.Tool == b.Tool &&
		bytes.Equal(a.Handle, b.Handle) && a.Host == b.Host && a.MemoryLimit == b.MemoryLimit && a.Status == b.Status &&
		a.IdleTimeout == b.IdleTimeout && a.CreatedAt.Equal(b.CreatedAt) && a.LastActiveAt.Equal(b.LastActiveAt) &&
		a.ExpiresAt.Equal(b.ExpiresAt) && a.ForgetAt.Equal(b.ForgetAt) && a.Version == b.Version
}

// testContainerConflicts: of concurrent writers of one version exactly one wins, and Modify
// loses no update.
func testContainerConflicts(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c := e.mustCreate(store.Container{Owner: "alice", Status: "running"})
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			cc := c
			cc.Status = fmt.Sprintf("writer-%d", i)
			_, err := e.s.UpdateContainer(e.ctx, cc)
			switch {
			case err == nil:
				wins.Add(1)
			case !errors.Is(err, store.ErrConflict):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d writers of one version won; want exactly 1", wins.Load())
	}
	for range 10 {
		wg.Go(func() {
			if _, err := store.Modify(e.ctx, e.s, "alice", c.ID, func(c *store.Container) error {
				c.MemoryLimit += "x"
				return nil
			}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, _ := e.s.Container(e.ctx, "alice", c.ID)
	if got.MemoryLimit != strings.Repeat("x", 10) || got.Version != 12 {
		t.Errorf("after 10 concurrent Modify: %q version %d; want 10 x and version 12", got.MemoryLimit, got.Version)
	}
}

func containerID(c store.Container) string { return c.ID }

func testContainerPages(t *testing.T, f Factory) {
	e := newEnv(t, f)
	var all []string
	for i := range 5 {
		name := "a"
		if i%2 == 1 {
			name = "b"
		}
		all = append(all, e.mustCreate(store.Container{Owner: "alice", Name: name}).ID)
	}
	e.mustCreate(store.Container{Owner: "bob", Name: "a"})
	tests := []struct {
		name     string
		q        store.ContainerQuery
		want     []string
		wantMore bool
	}{
		{"newest first", store.ContainerQuery{}, []string{all[4], all[3], all[2], all[1], all[0]}, false},
		{"asc with limit", store.ContainerQuery{Page: store.Page{Order: store.Asc, Limit: 2}}, all[:2], true},
		{"after", store.ContainerQuery{Page: store.Page{After: all[3]}}, []string{all[2], all[1], all[0]}, false},
		{"name", store.ContainerQuery{Name: "b"}, []string{all[3], all[1]}, false},
		{"name with limit", store.ContainerQuery{Name: "a", Page: store.Page{Limit: 2}}, []string{all[4], all[2]}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := e.s.ListContainers(e.ctx, "alice", tc.q)
			if got := ids(l.Items, containerID); err != nil || !slices.Equal(got, tc.want) || l.HasMore != tc.wantMore {
				t.Errorf("ListContainers(%+v) = %v more=%v, %v; want %v more=%v", tc.q, got, l.HasMore, err, tc.want, tc.wantMore)
			}
		})
	}
	if _, err := e.s.ListContainers(e.ctx, "alice", store.ContainerQuery{Page: store.Page{After: "file-x"}}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("ListContainers with a bad cursor = %v; want ErrInvalid", err)
	}
}

func cfileID(f store.ContainerFile) string { return f.ID }

func testContainerFiles(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c := e.mustCreate(store.Container{Owner: "alice"})
	other := e.mustCreate(store.Container{Owner: "alice"})
	put := func(cf store.ContainerFile) store.ContainerFile {
		t.Helper()
		cf, err := e.s.PutContainerFile(e.ctx, cf)
		if err != nil {
			t.Fatalf("PutContainerFile = %v", err)
		}
		return cf
	}
	a := put(store.ContainerFile{ContainerID: c.ID, Owner: "alice", Path: "/mnt/data/in.csv", Bytes: 10, Source: "user", Origin: "file:file-abc"})
	b := put(store.ContainerFile{ContainerID: c.ID, Owner: "alice", Path: "/mnt/data/out.png", Bytes: 2000, Source: "assistant"})
	put(store.ContainerFile{ContainerID: other.ID, Owner: "alice", Path: "/mnt/data/in.csv", Bytes: 1, Source: "user"})
	if !store.ContainerFileKind.Valid(a.ID) || a.CreatedAt.IsZero() {
		t.Fatalf("PutContainerFile = %+v", a)
	}
	for _, want := range []store.ContainerFile{a, b} {
		got, err := e.s.ContainerFile(e.ctx, "alice", c.ID, want.ID)
		if err != nil || got != want {
			t.Errorf("ContainerFile = %+v, %v; want %+v", got, err, want)
		}
	}
	if a.Origin != "file:file-abc" {
		t.Errorf("PutContainerFile dropped the origin: %+v", a)
	}
	_, err := e.s.ContainerFile(e.ctx, "bob", c.ID, b.ID)
	wantNotFound(t, "ContainerFile(bob)", err)
	_, err = e.s.ContainerFile(e.ctx, "alice", other.ID, b.ID)
	wantNotFound(t, "ContainerFile of another container", err)
	if _, err := e.s.PutContainerFile(e.ctx, store.ContainerFile{ContainerID: c.ID, Owner: "bob", Path: "/mnt/data/x"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("PutContainerFile into another owner's container = %v; want ErrNotFound", err)
	}
	if _, err := e.s.PutContainerFile(e.ctx, store.ContainerFile{ContainerID: e.s.NewID(store.ContainerKind), Owner: "alice"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("PutContainerFile into no container = %v; want ErrNotFound", err)
	}
	if _, err := e.s.PutContainerFile(e.ctx, store.ContainerFile{ID: a.ID, ContainerID: other.ID, Owner: "alice"}); !errors.Is(err, store.ErrExists) {
		t.Errorf("PutContainerFile taking another container's file id = %v; want ErrExists", err)
	}

	l, err := e.s.ListContainerFiles(e.ctx, "alice", c.ID, store.ContainerFileQuery{})
	if got := ids(l.Items, cfileID); err != nil || !slices.Equal(got, []string{b.ID, a.ID}) || l.HasMore {
		t.Errorf("ListContainerFiles = %v, %v", got, err)
	}
	l, _ = e.s.ListContainerFiles(e.ctx, "alice", c.ID, store.ContainerFileQuery{Page: store.Page{Order: store.Asc, Limit: 1}})
	if got := ids(l.Items, cfileID); !slices.Equal(got, []string{a.ID}) || !l.HasMore {
		t.Errorf("ListContainerFiles(asc, 1) = %v more=%v", got, l.HasMore)
	}
	l, _ = e.s.ListContainerFiles(e.ctx, "alice", c.ID, store.ContainerFileQuery{Path: "/mnt/data/out.png"})
	if got := ids(l.Items, cfileID); !slices.Equal(got, []string{b.ID}) {
		t.Errorf("ListContainerFiles(path) = %v", got)
	}
	_, err = e.s.ListContainerFiles(e.ctx, "bob", c.ID, store.ContainerFileQuery{})
	wantNotFound(t, "ListContainerFiles(bob)", err)

	// Replacing by id keeps the id and changes the record.
	b.Bytes = 4000
	if r := put(b); r.ID != b.ID || r.Bytes != 4000 {
		t.Errorf("replace = %+v", r)
	}
	if got, _ := e.s.ContainerFile(e.ctx, "alice", c.ID, b.ID); got.Bytes != 4000 {
		t.Errorf("after replace: %+v", got)
	}
	wantNotFound(t, "DeleteContainerFile(bob)", e.s.DeleteContainerFile(e.ctx, "bob", c.ID, a.ID))
	if err := e.s.DeleteContainerFile(e.ctx, "alice", c.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	wantNotFound(t, "DeleteContainerFile twice", e.s.DeleteContainerFile(e.ctx, "alice", c.ID, a.ID))
	l, _ = e.s.ListContainerFiles(e.ctx, "alice", c.ID, store.ContainerFileQuery{})
	if got := ids(l.Items, cfileID); !slices.Equal(got, []string{b.ID}) {
		t.Errorf("after delete: %v", got)
	}
}

func testContainerExpiry(t *testing.T, f Factory) {
	e := newEnv(t, f)
	now := e.clock.Now()
	early := e.mustCreate(store.Container{Owner: "alice", Status: "running", ExpiresAt: now.Add(5 * time.Minute)})
	late := e.mustCreate(store.Container{Owner: "bob", Status: "running", ExpiresAt: now.Add(20 * time.Minute)})
	e.mustCreate(store.Container{Owner: "carol", Status: "running"}) // no expiry pending
	mid := e.mustCreate(store.Container{Owner: "alice", Status: "running", ExpiresAt: now.Add(10 * time.Minute)})

	due, err := e.s.ExpiringContainers(e.ctx, now.Add(10*time.Minute), 0)
	if got := ids(due, containerID); err != nil || !slices.Equal(got, []string{early.ID, mid.ID}) {
		t.Errorf("ExpiringContainers(+10m) = %v, %v; want the 5m and 10m ones, earliest first", got, err)
	}
	if due, _ := e.s.ExpiringContainers(e.ctx, now.Add(time.Hour), 1); len(due) != 1 || due[0].ID != early.ID {
		t.Errorf("ExpiringContainers(limit 1) = %v", ids(due, containerID))
	}
	// Two janitors race to claim the same container: one update wins.
	var wins atomic.Int32
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			c := due[0]
			c.Status, c.ExpiresAt = "expired", time.Time{}
			if _, err := e.s.UpdateContainer(e.ctx, c); err == nil {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Errorf("%d janitors claimed one container", wins.Load())
	}
	due, _ = e.s.ExpiringContainers(e.ctx, now.Add(time.Hour), 0)
	if got := ids(due, containerID); !slices.Equal(got, []string{mid.ID, late.ID}) {
		t.Errorf("after the claim: %v", got)
	}

	// ForgetAt: the record and its files go at once for every reader.
	gone := e.mustCreate(store.Container{Owner: "alice", ForgetAt: now.Add(time.Hour)})
	cf, err := e.s.PutContainerFile(e.ctx, store.ContainerFile{ContainerID: gone.ID, Owner: "alice", Path: "/mnt/data/x"})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
	_, err = e.s.Container(e.ctx, "alice", gone.ID)
	wantNotFound(t, "Container past ForgetAt", err)
	_, err = e.s.ContainerFile(e.ctx, "alice", gone.ID, cf.ID)
	wantNotFound(t, "ContainerFile of a forgotten container", err)
	l, _ := e.s.ListContainers(e.ctx, "alice", store.ContainerQuery{})
	if slices.Contains(ids(l.Items, containerID), gone.ID) {
		t.Error("a forgotten container is still listed")
	}
	if _, err := e.s.UpdateContainer(e.ctx, gone); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateContainer of a forgotten container = %v", err)
	}
	if c, err := e.s.CreateContainer(e.ctx, store.Container{ID: gone.ID, Owner: "bob"}); err != nil || c.Version != 1 {
		t.Errorf("reusing a forgotten container's id = %+v, %v", c, err)
	}
}

// ResponsesFactory makes a store.Responses under test, reading the clock now. It cleans up after
// itself (t.Cleanup).
type ResponsesFactory func(t *testing.T, now func() time.Time) store.Responses

// RunResponses runs the suite's Responses part against the store f makes: for an implementation
// of store.Responses alone (Run covers it in every store.Store).
func RunResponses(t *testing.T, f ResponsesFactory) {
	c := NewClock()
	testResponses(t, c, f(t, c.Now))
}

func testResponses(t *testing.T, clock *Clock, s store.Responses) {
	ctx := context.Background()
	now := clock.Now()
	r := store.Response{ID: "resp_0123abcd", Owner: "alice", UpstreamID: "resp_up1", ContainerID: "cntr_1",
		Pending:   []json.RawMessage{json.RawMessage(`{"type":"function_call_output","call_id":"c1","output":"1"}`)},
		Body:      json.RawMessage(`{"id":"resp_0123abcd","object":"response","output":[]}`),
		Input:     json.RawMessage(`[{"type":"message","role":"user","content":"hi"}]`),
		ExpiresAt: now.Add(24 * time.Hour)}
	calls := []store.Call{
		{ID: "ci_1", Owner: "alice", CallID: "call_1", Code: "1+1", Output: "2", ExpiresAt: now.Add(24 * time.Hour)},
		{ID: "ci_2", Owner: "alice", CallID: "call_2", ContainerID: "cntr_1", Code: "print('x')", Output: "x\n", ExpiresAt: now.Add(48 * time.Hour)},
		{ID: "sh_3", Owner: "alice", CallID: "call_3", Item: `{"id":"sh_3","type":"shell_call","call_id":"call_3"}`, ExpiresAt: now.Add(24 * time.Hour)},
	}
	if err := s.PutResponse(ctx, r, calls); err != nil {
		t.Fatal(err)
	}
	got, err := s.Response(ctx, r.ID)
	if err != nil || got.Owner != "alice" || got.UpstreamID != "resp_up1" || got.ContainerID != "cntr_1" || len(got.Pending) != 1 ||
		!jsonEqual(got.Pending[0], r.Pending[0]) || !jsonEqual(got.Body, r.Body) || !jsonEqual(got.Input, r.Input) ||
		!got.ExpiresAt.Equal(r.ExpiresAt) || got.CreatedAt.IsZero() {
		t.Fatalf("Response = %+v, %v", got, err)
	}
	c, err := s.Call(ctx, "ci_2")
	if err != nil || c != calls[1] {
		t.Errorf("Call = %+v, %v; want %+v", c, err, calls[1])
	}
	if c, err := s.Call(ctx, "sh_3"); err != nil || c != calls[2] {
		t.Errorf("Call(sh_3) = %+v, %v; want %+v", c, err, calls[2])
	}
	// A response without body or input keeps them nil.
	if err := s.PutResponse(ctx, store.Response{ID: "resp_bare", Owner: "bob"}, nil); err != nil {
		t.Fatal(err)
	}
	if bare, err := s.Response(ctx, "resp_bare"); err != nil || bare.Body != nil || bare.Input != nil || !bare.ExpiresAt.IsZero() {
		t.Errorf("bare response = %+v, %v", bare, err)
	}
	// Replacing a response.
	r2 := r
	r2.UpstreamID = "resp_up2"
	if err := s.PutResponse(ctx, r2, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Response(ctx, r.ID); got.UpstreamID != "resp_up2" {
		t.Errorf("after replace: %+v", got)
	}
	for _, bad := range []string{"", "../x", "a/b", "resp_\x00", strings.Repeat("a", 129)} {
		if err := s.PutResponse(ctx, store.Response{ID: bad}, nil); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("PutResponse(%q) = %v; want ErrInvalid", bad, err)
		}
		_, err := s.Response(ctx, bad)
		wantNotFound(t, fmt.Sprintf("Response(%q)", bad), err)
	}
	if err := s.PutResponse(ctx, store.Response{ID: "resp_ok"}, []store.Call{{ID: "../ci"}}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("PutResponse with a bad call id = %v; want ErrInvalid", err)
	}
	if err := s.PutResponse(ctx, store.Response{ID: "resp_badjson", Body: json.RawMessage(`{"a":`)}, nil); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("PutResponse with broken JSON = %v; want ErrInvalid", err)
	}
	if _, err := s.Response(ctx, "resp_badjson"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused response was stored: %v", err)
	}

	// Delete keeps the calls.
	if err := s.DeleteResponse(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	_, err = s.Response(ctx, r.ID)
	wantNotFound(t, "Response after delete", err)
	if err := s.DeleteResponse(ctx, r.ID); err != nil {
		t.Errorf("DeleteResponse twice = %v", err)
	}
	if _, err := s.Call(ctx, "ci_1"); err != nil {
		t.Errorf("a call went with its response: %v", err)
	}
	// Expiry.
	clock.Advance(24 * time.Hour)
	_, err = s.Call(ctx, "ci_1")
	wantNotFound(t, "Call at its expiry", err)
	if _, err := s.Call(ctx, "ci_2"); err != nil {
		t.Errorf("Call before its expiry = %v", err)
	}
	if _, err := s.Response(ctx, "resp_bare"); err != nil {
		t.Errorf("a response without expiry expired: %v", err)
	}
	_, err = s.Call(ctx, "ci_nope")
	wantNotFound(t, "Call(unknown)", err)
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func testClaims(t *testing.T, f Factory) {
	e := newEnv(t, f)
	claim := func(key, holder string, ttl time.Duration) bool {
		t.Helper()
		ok, err := e.s.Claim(e.ctx, key, holder, ttl)
		if err != nil {
			t.Fatalf("Claim(%s, %s) = %v", key, holder, err)
		}
		return ok
	}
	holder := func(key string) string {
		t.Helper()
		h, err := e.s.Holder(e.ctx, key)
		if err != nil {
			t.Fatalf("Holder(%s) = %v", key, err)
		}
		return h
	}
	if h := holder("k"); h != "" {
		t.Errorf("Holder of a key never claimed = %q", h)
	}
	if !claim("k", "a", time.Minute) {
		t.Fatal("a first claim failed")
	}
	if claim("k", "b", time.Minute) {
		t.Error("a second holder got a held claim")
	}
	if h := holder("k"); h != "a" {
		t.Errorf("Holder = %q; want a (a failed claim changes nothing)", h)
	}
	// Holders may hold any string, ':' and '/' included (an address).
	if !claim("peer:x", "http://10.0.0.1:4000", time.Minute) || holder("peer:x") != "http://10.0.0.1:4000" {
		t.Errorf("Holder of an address = %q", holder("peer:x"))
	}
	if !claim("other", "b", time.Minute) {
		t.Error("claims of different keys interfere")
	}
	e.clock.Advance(50 * time.Second)
	if !claim("k", "a", time.Minute) { // extends to +110s
		t.Error("the holder could not extend its claim")
	}
	e.clock.Advance(50 * time.Second)
	if claim("k", "b", time.Minute) {
		t.Error("an extended claim expired early")
	}
	if err := e.s.Release(e.ctx, "k", "b"); err != nil {
		t.Fatal(err)
	}
	if claim("k", "b", time.Minute) {
		t.Error("a release by a non-holder released the claim")
	}
	if err := e.s.Release(e.ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	if !claim("k", "b", time.Minute) {
		t.Error("a released claim could not be taken")
	}
	e.clock.Advance(time.Minute)
	if h := holder("k"); h != "" {
		t.Errorf("Holder of an expired claim = %q", h)
	}
	if !claim("k", "c", time.Minute) {
		t.Error("an expired claim could not be taken")
	}
	if _, err := e.s.Claim(e.ctx, "z", "a", 0); err == nil {
		t.Error("Claim with ttl 0 succeeded")
	}
	// Of many concurrent claimants exactly one wins.
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if ok, err := e.s.Claim(e.ctx, "race", fmt.Sprint(i), time.Minute); err == nil && ok {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Errorf("%d concurrent claimants won; want 1", wins.Load())
	}
}

func testRestart(t *testing.T, f Factory) {
	e := newEnv(t, f)
	big := strings.Repeat("0123456789", 100_000)
	file := e.mustPut("alice", "big.bin", "user_data", big)
	gone := e.mustPut("alice", "gone.txt", "user_data", "x")
	if _, err := e.s.DeleteFile(e.ctx, "alice", gone.ID); err != nil {
		t.Fatal(err)
	}
	exp, err := store.CreateFile(e.ctx, e.s, store.File{Owner: "alice", Filename: "exp", Purpose: "batch", ExpiresAt: e.clock.Now().Add(time.Hour)},
		strings.NewReader("e"), store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	c := e.mustCreate(store.Container{Owner: "alice", Name: "n", Status: "running", Handle: []byte("h")})
	c, err = e.s.UpdateContainer(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := e.s.PutContainerFile(e.ctx, store.ContainerFile{ContainerID: c.ID, Owner: "alice", Path: "/mnt/data/a", Bytes: 1, Source: "user", Origin: "data:0123"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.PutResponse(e.ctx, store.Response{ID: "resp_r", Owner: "alice", Body: json.RawMessage(`{"id":"resp_r"}`)}, []store.Call{{ID: "ci_r", Owner: "alice", Code: "1"}}); err != nil {
		t.Fatal(err)
	}
	// An upload in progress at the restart is lost, not half-stored.
	up, err := e.s.BeginFile(e.ctx, "alice", store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := up.Write(e.ctx, strings.NewReader("unfinished")); err != nil {
		t.Fatal(err)
	}
	usage := e.usage("alice")

	e.restart()
	_ = up.Abort()
	if got, err := e.content("alice", file.ID); err != nil || got != big {
		t.Errorf("file after restart: %d bytes, %v", len(got), err)
	}
	if got, err := e.s.File(e.ctx, "alice", file.ID); err != nil || got.Filename != "big.bin" || !got.CreatedAt.Equal(file.CreatedAt) {
		t.Errorf("File after restart = %+v, %v", got, err)
	}
	_, err = e.s.File(e.ctx, "alice", gone.ID)
	wantNotFound(t, "a deleted file after restart", err)
	if got, err := e.s.File(e.ctx, "alice", exp.ID); err != nil || !got.ExpiresAt.Equal(exp.ExpiresAt) {
		t.Errorf("expiring file after restart = %+v, %v", got, err)
	}
	if u := e.usage("alice"); u != usage {
		t.Errorf("Usage after restart = %+v; want %+v", u, usage)
	}
	if got, err := e.s.Container(e.ctx, "alice", c.ID); err != nil || !sameContainer(got, c) {
		t.Errorf("Container after restart = %+v, %v; want %+v", got, err, c)
	}
	if got, err := e.s.ContainerFile(e.ctx, "alice", c.ID, cf.ID); err != nil || got != cf {
		t.Errorf("ContainerFile after restart = %+v, %v", got, err)
	}
	if got, err := e.s.Response(e.ctx, "resp_r"); err != nil || !jsonEqual(got.Body, json.RawMessage(`{"id":"resp_r"}`)) {
		t.Errorf("Response after restart = %+v, %v", got, err)
	}
	if _, err := e.s.Call(e.ctx, "ci_r"); err != nil {
		t.Errorf("Call after restart = %v", err)
	}
	if id := e.s.NewID(store.FileKind); id <= file.ID {
		t.Errorf("an id minted after the restart (%s) sorts before one minted earlier (%s)", id, file.ID)
	}
	l, _ := e.s.ListFiles(e.ctx, "alice", store.FileQuery{})
	if got := ids(l.Items, fileID); !slices.Equal(got, []string{exp.ID, file.ID}) {
		t.Errorf("ListFiles after restart = %v", got)
	}
}

func testClosed(t *testing.T, f Factory) {
	e := newEnv(t, f)
	file := e.mustPut("alice", "a", "user_data", "x")
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	closed := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close = %v; want ErrClosed", what, err)
		}
	}
	_, err := e.s.File(e.ctx, "alice", file.ID)
	closed("File", err)
	_, err = e.s.BeginFile(e.ctx, "alice", store.FileLimits{})
	closed("BeginFile", err)
	_, err = e.s.CreateContainer(e.ctx, store.Container{Owner: "alice"})
	closed("CreateContainer", err)
	closed("PutResponse", e.s.PutResponse(e.ctx, store.Response{ID: "resp_x"}, nil))
	_, err = e.s.Claim(e.ctx, "k", "h", time.Minute)
	closed("Claim", err)
	_, err = e.s.Holder(e.ctx, "k")
	closed("Holder", err)
	_, err = e.s.ReservePlace(e.ctx, store.PlaceRequest{Owner: "alice", ID: e.s.NewID(store.ContainerKind), TTL: time.Minute})
	closed("ReservePlace", err)
	_, err = e.s.Places(e.ctx, "alice")
	closed("Places", err)
	_, _, err = e.s.TakeToken(e.ctx, "k", store.Bucket{PerMinute: 1})
	closed("TakeToken", err)
	if err := e.s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	e.s = e.open()
	if _, err := e.s.File(e.ctx, "alice", file.ID); err != nil {
		t.Errorf("File after reopening = %v", err)
	}
}

func (e *env) places(owner string) store.Places {
	e.t.Helper()
	p, err := e.s.Places(e.ctx, owner)
	if err != nil {
		e.t.Fatalf("Places(%s) = %v", owner, err)
	}
	return p
}

func (e *env) reserve(r store.PlaceRequest) store.Places {
	e.t.Helper()
	if r.TTL == 0 {
		r.TTL = 3 * time.Minute
	}
	p, err := e.s.ReservePlace(e.ctx, r)
	if err != nil {
		e.t.Fatalf("ReservePlace(%+v) = %v", r, err)
	}
	return p
}

// A live container record holds its owner's place, and a shared one when its Host is "", from
// whatever process; a reservation holds one until its record exists or its TTL runs out; the
// place follows the record's expiry, and ends when it is cleared, deleted, or passes.
func testPlaces(t *testing.T, f Factory) {
	e := newEnv(t, f)
	now := e.clock.Now()
	want := func(owner string, own, shared int) {
		t.Helper()
		if p := e.places(owner); p.Owner != own || p.Shared != shared {
			t.Errorf("Places(%s) = %+v; want %d of the owner's, %d shared", owner, p, own, shared)
		}
	}
	want("alice", 0, 0)
	e.mustCreate(store.Container{Owner: "alice", Status: "running", ExpiresAt: now.Add(10 * time.Minute)})
	e.mustCreate(store.Container{Owner: "alice", Host: "replica-a", Status: "running", ExpiresAt: now.Add(10 * time.Minute)})
	e.mustCreate(store.Container{Owner: "alice", Status: "expired"}) // no ExpiresAt: no place
	want("alice", 2, 1)
	want("bob", 0, 1)

	// Reservations, bounded per owner and in the shared total.
	r1 := e.s.NewID(store.ContainerKind)
	if p := e.reserve(store.PlaceRequest{Owner: "alice", ID: r1, MaxPerOwner: 3}); p.Refused != "" || p.Owner != 3 {
		t.Errorf("ReservePlace under the owner's bound = %+v; want reserved, 3 places", p)
	}
	if p := e.reserve(store.PlaceRequest{Owner: "alice", ID: e.s.NewID(store.ContainerKind), MaxPerOwner: 3}); p.Refused != store.RefusedOwner || p.Owner != 3 {
		t.Errorf("ReservePlace at the owner's bound = %+v; want refused by the owner's bound", p)
	}
	if p := e.reserve(store.PlaceRequest{Owner: "alice", ID: r1, MaxPerOwner: 1}); p.Refused != "" {
		t.Errorf("ReservePlace of a container holding a place = %+v; want kept whatever the bound", p)
	}
	r2 := e.s.NewID(store.ContainerKind)
	if p := e.reserve(store.PlaceRequest{Owner: "bob", ID: r2, Shared: true, MaxPerOwner: 3, MaxShared: 2}); p.Refused != "" || p.Owner != 1 || p.Shared != 2 {
		t.Errorf("ReservePlace of another owner = %+v; want reserved, 1 place, 2 shared", p)
	}
	if p := e.reserve(store.PlaceRequest{Owner: "carol", ID: e.s.NewID(store.ContainerKind), Shared: true, MaxShared: 2}); p.Refused != store.RefusedShared || p.Owner != 0 {
		t.Errorf("ReservePlace at the shared bound = %+v; want refused by the shared bound", p)
	}
	if p := e.reserve(store.PlaceRequest{Owner: "carol", ID: e.s.NewID(store.ContainerKind), MaxShared: 2}); p.Refused != "" {
		t.Errorf("ReservePlace of a host-bound container = %+v; want the shared bound not to apply", p)
	}
	want("alice", 3, 2)
	if _, err := e.s.ReservePlace(e.ctx, store.PlaceRequest{Owner: "alice", ID: "nope", TTL: time.Minute}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("ReservePlace of a malformed id = %v; want ErrInvalid", err)
	}

	// r1's record takes over its place; cancelling it then changes nothing. r2 is cancelled.
	rec1 := e.mustCreate(store.Container{ID: r1, Owner: "alice", Status: "running", ExpiresAt: now.Add(20 * time.Minute)})
	for _, c := range []struct{ owner, id string }{{"alice", r1}, {"bob", r2}, {"alice", e.s.NewID(store.ContainerKind)}} {
		if err := e.s.CancelPlace(e.ctx, c.owner, c.id); err != nil {
			t.Fatalf("CancelPlace(%s, %s) = %v", c.owner, c.id, err)
		}
	}
	want("alice", 3, 2)
	want("bob", 0, 2)

	// Past the reservations' TTL: the records still hold theirs.
	e.clock.Advance(5 * time.Minute)
	want("carol", 0, 2)
	want("alice", 3, 2)

	// An update moves the place with the record; clearing ExpiresAt frees it; so does a delete.
	rec1.ExpiresAt = now.Add(time.Hour)
	rec1, err := e.s.UpdateContainer(e.ctx, rec1)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(10 * time.Minute) // past the first two records' ExpiresAt
	want("alice", 1, 1)
	rec1.ExpiresAt, rec1.Status = time.Time{}, "expired"
	if _, err := e.s.UpdateContainer(e.ctx, rec1); err != nil {
		t.Fatal(err)
	}
	want("alice", 0, 0)
	again := e.mustCreate(store.Container{Owner: "alice", Status: "running", ExpiresAt: e.clock.Now().Add(time.Hour),
		ForgetAt: e.clock.Now().Add(30 * time.Minute)})
	want("alice", 1, 1)
	if err := e.s.DeleteContainer(e.ctx, "alice", again.ID); err != nil {
		t.Fatal(err)
	}
	want("alice", 0, 0)

	// A ForgetAt before ExpiresAt ends the place with the record; a place survives a restart.
	e.mustCreate(store.Container{Owner: "dave", Status: "running", ExpiresAt: e.clock.Now().Add(time.Hour),
		ForgetAt: e.clock.Now().Add(30 * time.Minute)})
	e.mustCreate(store.Container{Owner: "dave", Status: "running", ExpiresAt: e.clock.Now().Add(time.Hour)})
	e.restart()
	want("dave", 2, 2)
	e.clock.Advance(30 * time.Minute)
	want("dave", 1, 1)
}

// Of many processes reserving places at once, exactly the bound's worth get one.
func testPlaceRace(t *testing.T, f Factory) {
	e := newEnv(t, f)
	var got atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			p, err := e.s.ReservePlace(e.ctx, store.PlaceRequest{Owner: "alice", ID: e.s.NewID(store.ContainerKind),
				Shared: true, MaxPerOwner: 5, TTL: time.Minute})
			if err == nil && p.Refused == "" {
				got.Add(1)
			}
		})
	}
	wg.Wait()
	if got.Load() != 5 {
		t.Errorf("%d of 16 concurrent reservations succeeded; want the bound, 5", got.Load())
	}
	if p := e.places("alice"); p.Owner != 5 || p.Shared != 5 {
		t.Errorf("Places after the race = %+v; want 5 and 5", p)
	}
}

// A token bucket: a burst, then a wait; buckets are independent; concurrent takers share one. A
// store may time buckets by a clock of its own (a shared one's server), so the refill is checked
// with a fast bucket while the suite's clock is moved too.
func testTokens(t *testing.T, f Factory) {
	e := newEnv(t, f)
	take := func(key string, b store.Bucket) (bool, time.Duration) {
		t.Helper()
		ok, wait, err := e.s.TakeToken(e.ctx, key, b)
		if err != nil {
			t.Fatalf("TakeToken(%s) = %v", key, err)
		}
		return ok, wait
	}
	slow := store.Bucket{PerMinute: 1, Burst: 2}
	for i := range 2 {
		if ok, _ := take("alice", slow); !ok {
			t.Fatalf("take %d of a burst of 2 refused", i+1)
		}
	}
	if ok, wait := take("alice", slow); ok || wait < 50*time.Second || wait > time.Minute {
		t.Errorf("take past the burst = %v, wait %s; want refused, about a minute to wait", ok, wait)
	}
	if ok, _ := take("bob", slow); !ok {
		t.Error("another key's bucket was emptied too")
	}
	if ok, _ := take("a:b%c", store.Bucket{PerMinute: 1}); !ok {
		t.Error("a key with ':' and '%' refused")
	}
	if ok, _ := take("a:b%c", store.Bucket{PerMinute: 1}); ok {
		t.Error("a burst below 1 is not 1")
	}
	fast := store.Bucket{PerMinute: 600_000, Burst: 1} // a token every 0.1 ms
	if ok, _ := take("fast", fast); !ok {
		t.Fatal("a fast bucket's first take refused")
	}
	refilled := false
	for range 2000 {
		e.clock.Advance(time.Millisecond)
		if ok, _ := take("fast", fast); ok {
			refilled = true
			break
		}
	}
	if !refilled {
		t.Error("a bucket never refilled")
	}
	if _, _, err := e.s.TakeToken(e.ctx, "x", store.Bucket{}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("TakeToken of a bucket of 0 a minute = %v; want ErrInvalid", err)
	}
	var got atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if ok, _, err := e.s.TakeToken(e.ctx, "race", store.Bucket{PerMinute: 1, Burst: 5}); err == nil && ok {
				got.Add(1)
			}
		})
	}
	wg.Wait()
	if got.Load() != 5 {
		t.Errorf("%d of 16 concurrent takes succeeded; want the burst, 5", got.Load())
	}
}
