package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

func TestConformance(t *testing.T) {
	srv := redisserver.Start(t)
	var n atomic.Int32
	storetest.Run(t, func(t *testing.T, now func() time.Time) func() store.Store {
		// Each test gets its own prefix on one server: the prefix is all that keeps them apart.
		prefix := fmt.Sprintf("conformance%d:", n.Add(1))
		return func() store.Store {
			// Small chunks, so that the suite's larger files span several.
			s, err := Open(context.Background(), Options{Addr: srv.Addr(), Prefix: prefix, Now: now, ChunkSize: 64 << 10})
			if err != nil {
				t.Fatalf("Open = %v", err)
			}
			return s
		}
	})
}

// open opens a store on srv; opts.Addr is set from srv.
func open(t testing.TB, srv *redisserver.Server, opts Options) *Store {
	t.Helper()
	opts.Addr = srv.Addr()
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// keys lists every key under the store's prefix, without the prefix, sorted.
func keys(t *testing.T, s *Store) []string {
	t.Helper()
	var out []string
	iter := s.rdb.Scan(context.Background(), 0, s.prefix+"*", 1000).Iterator()
	for iter.Next(context.Background()) {
		out = append(out, strings.TrimPrefix(iter.Val(), s.prefix))
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN = %v", err)
	}
	slices.Sort(out)
	return out
}

func pttl(t *testing.T, s *Store, key string) time.Duration {
	t.Helper()
	d, err := s.rdb.PTTL(context.Background(), s.prefix+key).Result()
	if err != nil {
		t.Fatalf("PTTL %s = %v", key, err)
	}
	return d
}

func hasKey(ks []string, match func(string) bool) bool { return slices.ContainsFunc(ks, match) }

// TestEveryKeyExpiresWithItsObject: with every object set to expire soon, every key the store
// wrote has a TTL (PTTL) no longer than the object's, and once that passes no key is left.
func TestEveryKeyExpiresWithItsObject(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	const life = 3 * time.Second
	s := open(t, srv, Options{ChunkSize: 1024, ReadGrace: life, UploadTTL: life})
	soon := time.Now().Add(life)

	content := bytes.Repeat([]byte("0123456789"), 300) // three chunks
	file, err := store.CreateFile(ctx, s, store.File{Owner: "alice", Filename: "f", Purpose: "user_data", ExpiresAt: soon}, bytes.NewReader(content), store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	// A file deleted while a reader has it open: its bytes stay for the reader, ReadGrace long.
	deleted, err := store.CreateFile(ctx, s, store.File{Owner: "alice", Filename: "d", Purpose: "user_data"}, bytes.NewReader(content), store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	_, rc, err := s.OpenFile(ctx, "alice", deleted.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := s.DeleteFile(ctx, "alice", deleted.ID); err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateContainer(ctx, store.Container{Owner: "alice", Status: "running", ExpiresAt: soon, ForgetAt: soon})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := s.PutContainerFile(ctx, store.ContainerFile{ContainerID: c.ID, Owner: "alice", Path: "/mnt/data/x", Bytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutResponse(ctx, store.Response{ID: "resp_1", Owner: "alice", ExpiresAt: soon}, []store.Call{{ID: "ci_1", Owner: "alice", ExpiresAt: soon}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Claim(ctx, "create:conv", "replica-a", life); !ok || err != nil {
		t.Fatalf("Claim = %v, %v", ok, err)
	}
	up, err := s.BeginFile(ctx, "bob", store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Abort()
	if _, err := up.Write(ctx, bytes.NewReader(content)); err != nil { // an upload in progress
		t.Fatal(err)
	}

	ks := keys(t, s)
	want := []string{
		"file:" + file.ID, "owner:alice:files", "owner:alice:files:exp", "owner:alice:files:size", "owner:alice:files:bytes",
		"cntr:" + c.ID, "cntr:" + c.ID + ":files", "cfile:" + cf.ID, "owner:alice:cntrs", "owner:alice:cntrs:forget",
		"cntrs:expiring", "cntrs:expiring:forget", "resp:resp_1", "call:ci_1", "claim:create:conv", "idclock",
	}
	for _, k := range want {
		if !slices.Contains(ks, k) {
			t.Errorf("no key %s; the keys are %v", k, ks)
		}
	}
	if n := len(slices.DeleteFunc(slices.Clone(ks), func(k string) bool { return !strings.HasPrefix(k, "blob:") })); n != 2 {
		t.Errorf("%d blob keys; want 2 (the file's and the deleted one's)", n)
	}
	if !hasKey(ks, func(k string) bool { return strings.HasPrefix(k, "upload:") }) {
		t.Errorf("no upload key for the upload in progress: %v", ks)
	}
	for _, k := range ks {
		d := pttl(t, s, k)
		limit := life
		if k == "idclock" {
			limit = idClockTTL
		}
		if d <= 0 || d > limit {
			t.Errorf("PTTL %s = %s; want a TTL of at most %s", k, d, limit)
		}
	}

	testutil.Eventually(t, "every key but idclock to expire", func() bool {
		return slices.Equal(keys(t, s), []string{"idclock"})
	})
}

// TestIndexLivesAsLongAsItsLongestMember: an index has no TTL while one of its objects never
// expires, and takes the TTL of the longest-lived one that remains.
func TestIndexLivesAsLongAsItsLongestMember(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	s := open(t, srv, Options{})
	now := time.Now()
	put := func(expires time.Time) store.File {
		t.Helper()
		f, err := store.CreateFile(ctx, s, store.File{Owner: "o", Filename: "f", Purpose: "user_data", ExpiresAt: expires}, strings.NewReader("x"), store.FileLimits{})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	index := []string{"owner:o:files", "owner:o:files:exp", "owner:o:files:size", "owner:o:files:bytes"}
	wantTTL := func(when string, lo, hi time.Duration) {
		t.Helper()
		for _, k := range index {
			if d := pttl(t, s, k); d < lo || d > hi {
				t.Errorf("%s: PTTL %s = %s; want between %s and %s", when, k, d, lo, hi)
			}
		}
	}
	hour := put(now.Add(time.Hour))
	wantTTL("one file expiring in an hour", 59*time.Minute, time.Hour)
	day := put(now.Add(24 * time.Hour))
	wantTTL("one more expiring in a day", 23*time.Hour, 24*time.Hour)
	forever := put(time.Time{})
	wantTTL("one more that never expires", -1, -1) // PTTL -1: no TTL
	if d := pttl(t, s, "file:"+forever.ID); d != -1 {
		t.Errorf("PTTL of a file that never expires = %s; want -1", d)
	}
	if _, err := s.DeleteFile(ctx, "o", forever.ID); err != nil {
		t.Fatal(err)
	}
	wantTTL("after deleting the one that never expires", 23*time.Hour, 24*time.Hour)
	if _, err := s.DeleteFile(ctx, "o", day.ID); err != nil {
		t.Fatal(err)
	}
	wantTTL("after deleting the one expiring in a day", 59*time.Minute, time.Hour)
	if _, err := s.DeleteFile(ctx, "o", hour.ID); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys(t, s) {
		if strings.HasPrefix(k, "owner:") || strings.HasPrefix(k, "file:") {
			t.Errorf("key %s left after every file was deleted", k)
		}
	}

	// A container's files and markers follow its ForgetAt as it moves.
	c, err := s.CreateContainer(ctx, store.Container{Owner: "o", ForgetAt: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := s.PutContainerFile(ctx, store.ContainerFile{ContainerID: c.ID, Owner: "o", Path: "/mnt/data/a"})
	if err != nil {
		t.Fatal(err)
	}
	c.ForgetAt = now.Add(2 * time.Hour)
	if c, err = s.UpdateContainer(ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"cntr:" + c.ID, "cntr:" + c.ID + ":files", "cfile:" + cf.ID, "owner:o:cntrs", "owner:o:cntrs:forget"} {
		if d := pttl(t, s, k); d < 119*time.Minute || d > 2*time.Hour {
			t.Errorf("PTTL %s = %s after ForgetAt moved to +2h", k, d)
		}
	}
	c.ForgetAt = time.Time{}
	if _, err = s.UpdateContainer(ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"cntr:" + c.ID, "cntr:" + c.ID + ":files", "cfile:" + cf.ID, "owner:o:cntrs", "owner:o:cntrs:forget"} {
		if d := pttl(t, s, k); d != -1 {
			t.Errorf("PTTL %s = %s after ForgetAt was cleared; want -1", k, d)
		}
	}
}

// TestOwnersAreOneKeyElement: owners that contain the key separator or the escape character do
// not share keys.
func TestOwnersAreOneKeyElement(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	s := open(t, srv, Options{})
	owners := []string{"a", "a:files", "a%3Afiles", "a:cntrs:forget", "%"}
	for i, o := range owners {
		if _, err := store.CreateFile(ctx, s, store.File{Owner: o, Filename: "f", Purpose: "user_data"}, strings.NewReader(strings.Repeat("x", i+1)), store.FileLimits{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateContainer(ctx, store.Container{Owner: o}); err != nil {
			t.Fatal(err)
		}
	}
	for i, o := range owners {
		if u, err := s.Usage(ctx, o); err != nil || u != (store.Usage{Files: 1, Bytes: int64(i + 1)}) {
			t.Errorf("Usage(%q) = %+v, %v; want 1 file of %d bytes", o, u, err, i+1)
		}
		if l, err := s.ListContainers(ctx, o, store.ContainerQuery{}); err != nil || len(l.Items) != 1 || l.Items[0].Owner != o {
			t.Errorf("ListContainers(%q) = %+v, %v", o, l, err)
		}
	}
}

// TestTwoReplicas: two stores on one Redis (two replicas) decide races between them: one wins a
// claim, one creates a chosen id, one janitor takes an expired container; and the ids they mint
// sort in the order they were minted, whatever their clocks say.
func TestTwoReplicas(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	clock := storetest.NewClock()
	a := open(t, srv, Options{Now: clock.Now})
	b := open(t, srv, Options{Now: clock.Now})
	replicas := []*Store{a, b}

	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			ok, err := replicas[i%2].Claim(ctx, "create:conversation", fmt.Sprintf("replica-%d", i), time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Errorf("%d claimants on two replicas won one claim; want 1", wins.Load())
	}

	id := a.NewID(store.ContainerKind)
	var created atomic.Int32
	for i := range 8 {
		wg.Go(func() {
			_, err := replicas[i%2].CreateContainer(ctx, store.Container{ID: id, Owner: "alice"})
			switch {
			case err == nil:
				created.Add(1)
			case !errors.Is(err, store.ErrExists):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if created.Load() != 1 {
		t.Errorf("%d replicas created container %s; want 1", created.Load(), id)
	}

	// Both janitors see the expired container; exactly one takes it.
	c, err := a.CreateContainer(ctx, store.Container{Owner: "alice", Status: "running", ExpiresAt: clock.Now().Add(-2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	var took atomic.Int32
	var listed sync.WaitGroup // both list before either takes, so both races are real
	listed.Add(len(replicas))
	for _, r := range replicas {
		wg.Go(func() {
			due, err := r.ExpiringContainers(ctx, clock.Now().Add(-time.Hour), 0)
			listed.Done()
			if err != nil || len(due) != 1 || due[0].ID != c.ID {
				t.Errorf("ExpiringContainers = %v, %v", due, err)
				return
			}
			listed.Wait()
			due[0].Status, due[0].ExpiresAt = "expired", time.Time{}
			if _, err := r.UpdateContainer(ctx, due[0]); err == nil {
				took.Add(1)
			} else if !errors.Is(err, store.ErrConflict) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if took.Load() != 1 {
		t.Errorf("%d janitors took one expired container; want 1", took.Load())
	}
	if due, _ := b.ExpiringContainers(ctx, clock.Now(), 0); len(due) != 0 {
		t.Errorf("the taken container is still expiring: %v", due)
	}

	// Ids: c's clock runs an hour behind a's, yet what c mints after a sorts after it.
	c2 := open(t, srv, Options{Now: func() time.Time { return clock.Now().Add(-time.Hour) }})
	minters := []*Store{a, c2}
	prev := ""
	for i := range 200 {
		id := minters[i%2].NewID(store.FileKind)
		if id <= prev {
			t.Fatalf("id %d (%s, from replica %d) sorts before the one minted before it (%s)", i, id, i%2, prev)
		}
		prev = id
	}
}

// TestRedisLostAndBack: with Redis gone every call fails with ErrUnavailable (and does not hang),
// an upload or a read in progress fails the same way, and once Redis is back everything works
// again.
func TestRedisLostAndBack(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	s := open(t, srv, Options{ChunkSize: 1024})
	content := bytes.Repeat([]byte("abcdefgh"), 1000)
	f, err := store.CreateFile(ctx, s, store.File{Owner: "o", Filename: "f", Purpose: "user_data"}, bytes.NewReader(content), store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateContainer(ctx, store.Container{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	_, rc, err := s.OpenFile(ctx, "o", f.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	up, err := s.BeginFile(ctx, "o", store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Abort()
	if _, err := up.Write(ctx, bytes.NewReader(content[:3000])); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	unavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s with Redis gone = %v; want ErrUnavailable", what, err)
		}
	}
	unavailable("PutResponse", s.PutResponse(ctx, store.Response{ID: "resp_x", Owner: "o"}, nil))
	_, err = s.Response(ctx, "resp_x")
	unavailable("Response", err)
	_, err = s.Container(ctx, "o", c.ID)
	unavailable("Container", err)
	_, err = s.UpdateContainer(ctx, c)
	unavailable("UpdateContainer", err)
	_, err = s.ListContainers(ctx, "o", store.ContainerQuery{})
	unavailable("ListContainers", err)
	_, err = s.Claim(ctx, "k", "h", time.Minute)
	unavailable("Claim", err)
	_, err = s.BeginFile(ctx, "o", store.FileLimits{})
	unavailable("BeginFile", err)
	_, err = up.Write(ctx, bytes.NewReader(content))
	unavailable("Write of an upload in progress", err)
	_, err = io.ReadAll(rc)
	unavailable("reading a file", err)
	if id := s.NewID(store.FileKind); !store.FileKind.Valid(id) || id <= f.ID {
		t.Errorf("NewID with Redis gone = %q; want a valid id after %s", id, f.ID)
	}

	srv.Restart() // an empty Redis, as after a restart without persistence
	testutil.Eventually(t, "the store to work again", func() bool {
		return s.PutResponse(ctx, store.Response{ID: "resp_y", Owner: "o"}, nil) == nil
	})
	if _, err := s.Container(ctx, "o", c.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Container after Redis lost its data = %v; want ErrNotFound", err)
	}
	if _, err := s.Claim(ctx, "k", "h", time.Minute); err != nil {
		t.Errorf("Claim after the restart = %v", err)
	}
	g, err := store.CreateFile(ctx, s, store.File{Owner: "o", Filename: "g", Purpose: "user_data"}, bytes.NewReader(content), store.FileLimits{})
	if err != nil {
		t.Fatalf("CreateFile after the restart = %v", err)
	}
	_, rc2, err := s.OpenFile(ctx, "o", g.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc2.Close()
	if got, err := io.ReadAll(rc2); err != nil || !bytes.Equal(got, content) {
		t.Errorf("reading after the restart = %d bytes, %v", len(got), err)
	}
	if id := s.NewID(store.FileKind); id <= g.ID {
		t.Errorf("an id minted after the restart (%s) sorts before %s", id, g.ID)
	}
}

// TestRedisNotAnswering: a Redis that accepts connections but does not answer (paused, or a
// network that drops packets) fails calls after Options.Timeout instead of hanging them, and
// Open refuses it.
func TestRedisNotAnswering(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	s := open(t, srv, Options{Timeout: 100 * time.Millisecond})
	c, err := s.CreateContainer(ctx, store.Container{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", 2000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Container(ctx, "o", c.ID); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Container from a paused Redis = %v; want ErrUnavailable", err)
	}
	if _, err := s.UpdateContainer(ctx, c); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("UpdateContainer on a paused Redis = %v; want ErrUnavailable", err)
	}
	testutil.Eventually(t, "the pause to end", func() bool {
		_, err := s.Container(ctx, "o", c.ID)
		return err == nil
	})

	// A listener that accepts and never answers.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	}()
	if _, err := Open(ctx, Options{Addr: l.Addr().String(), DialTimeout: 100 * time.Millisecond, Timeout: 100 * time.Millisecond}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Open of a Redis that does not answer = %v; want ErrUnavailable", err)
	}
	// Nothing listens where Redis was.
	addr := l.Addr().String()
	_ = l.Close()
	if _, err := Open(ctx, Options{Addr: addr}); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Errorf("Open of an address nothing listens on = %v; want ErrUnavailable naming %s", err, addr)
	}
}

func TestOpenOptions(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", "proxy", "on", ">s3cret", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"url with credentials and db", Options{URL: "redis://proxy:s3cret@" + srv.Addr() + "/3"}, ""},
		{"url, password beside it", Options{URL: "redis://" + srv.Addr() + "/2", Username: "proxy", Password: "s3cret"}, ""},
		{"address and password", Options{Addr: srv.Addr(), Username: "proxy", Password: "s3cret", DB: 1}, ""},
		{"wrong password", Options{Addr: srv.Addr(), Username: "proxy", Password: "nope"}, "WRONGPASS"},
		{"bad url", Options{URL: "http://" + srv.Addr()}, "invalid URL scheme"},
		{"url that does not parse", Options{URL: "redis://proxy:s3cret@" + srv.Addr() + ":x/0"}, "does not parse"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(ctx, tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Open = %v; want an error containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Errorf("Open's error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open = %v", err)
			}
			defer s.Close()
			if err := s.PutResponse(ctx, store.Response{ID: "resp_" + strings.ReplaceAll(tc.name, " ", "_")[:3], Owner: "o"}, nil); err != nil {
				t.Errorf("PutResponse = %v", err)
			}
		})
	}
	// The databases chosen were used.
	for db, want := range map[int]int64{1: 1, 2: 1, 3: 1} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DB: db})
		if n, err := c.DBSize(ctx).Result(); err != nil || n != want {
			t.Errorf("DBSIZE of db %d = %d, %v; want %d", db, n, err, want)
		}
		_ = c.Close()
	}
}

// TestContextCancellation: a cancelled context ends a call with its own error, not
// ErrUnavailable, and stops an upload between chunks.
func TestContextCancellation(t *testing.T) {
	srv := redisserver.Start(t)
	s := open(t, srv, Options{ChunkSize: 1024})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Response(ctx, "resp_x"); !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Response with a cancelled context = %v; want context.Canceled", err)
	}
	if _, err := s.Claim(ctx, "k", "h", time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("Claim with a cancelled context = %v; want context.Canceled", err)
	}
	live, stop := context.WithCancel(context.Background())
	up, err := s.BeginFile(live, "o", store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Abort()
	var src countingReader
	src.afterBytes, src.cancel = 4096, stop
	if _, err := up.Write(live, &src); !errors.Is(err, context.Canceled) {
		t.Errorf("Write cancelled mid-way = %v; want context.Canceled", err)
	}
	if src.n > 8192 {
		t.Errorf("Write went on reading %d bytes after its context was cancelled", src.n)
	}
}

// countingReader yields zeros without end, cancelling after afterBytes.
type countingReader struct {
	n, afterBytes int64
	cancel        func()
}

func (c *countingReader) Read(p []byte) (int, error) {
	p = p[:min(len(p), 512)]
	clear(p)
	c.n += int64(len(p))
	if c.n >= c.afterBytes && c.cancel != nil {
		c.cancel()
	}
	return len(p), nil
}

// TestLargeFileStreamsInBoundedMemory: a file many chunks long goes into Redis and back out
// without the proxy ever holding much more than a chunk of it.
func TestLargeFileStreamsInBoundedMemory(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	s := open(t, srv, Options{}) // 1 MiB chunks
	const size = 48 << 20
	src := &patternReader{left: size}
	f, err := store.CreateFile(ctx, s, store.File{Owner: "o", Filename: "big", Purpose: "user_data"}, src, store.FileLimits{MaxBytes: 512 << 20})
	if err != nil || f.Bytes != size {
		t.Fatalf("CreateFile = %+v, %v", f, err)
	}
	_, rc, err := s.OpenFile(ctx, "o", f.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	dst := &patternChecker{}
	if _, err := io.CopyBuffer(dst, rc, make([]byte, 32<<10)); err != nil || dst.n != size || dst.bad >= 0 {
		t.Fatalf("read back %d bytes (first wrong at %d), %v", dst.n, dst.bad, err)
	}
	// The heap is sampled as the bytes pass; holding the file would take 48 MiB.
	if peak := max(src.peak, dst.peak); peak > 24<<20 {
		t.Errorf("the heap reached %d MiB while a %d MiB file streamed", peak>>20, size>>20)
	}
}

// patternReader yields left bytes of a known pattern, sampling the heap every MiB.
type patternReader struct {
	left, off int64
	peak      uint64
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.left)]
	for i := range p {
		p[i] = byte((r.off + int64(i)) % 251)
	}
	if r.off>>20 != (r.off+int64(len(p)))>>20 {
		r.peak = max(r.peak, heapInUse())
	}
	r.off += int64(len(p))
	r.left -= int64(len(p))
	return len(p), nil
}

// patternChecker checks that what it is written is patternReader's pattern.
type patternChecker struct {
	n    int64
	bad  int64
	peak uint64
	init bool
}

func (c *patternChecker) Write(p []byte) (int, error) {
	if !c.init {
		c.bad, c.init = -1, true
	}
	for i, b := range p {
		if b != byte((c.n+int64(i))%251) && c.bad < 0 {
			c.bad = c.n + int64(i)
		}
	}
	if c.n>>20 != (c.n+int64(len(p)))>>20 {
		c.peak = max(c.peak, heapInUse())
	}
	c.n += int64(len(p))
	return len(p), nil
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func TestPing(t *testing.T) {
	srv := redisserver.Start(t)
	s := open(t, srv, Options{})
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping = %v", err)
	}
	srv.Stop()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Ping with Redis gone = %v; want ErrUnavailable", err)
	}
	srv.Restart()
	testutil.Eventually(t, "Ping to answer again", func() bool { return s.Ping(ctx) == nil })
	_ = s.Close()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Ping after Close = %v; want ErrClosed", err)
	}
}

// TestSharedSecret: replicas that ask at once agree on one secret, the first one's; another
// prefix (another deployment) gets its own; an emptied key is an error, not an empty secret.
func TestSharedSecret(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	replicas := []*Store{open(t, srv, Options{}), open(t, srv, Options{}), open(t, srv, Options{})}
	got := make([]string, 12)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			var err error
			if got[i], err = replicas[i%len(replicas)].SharedSecret(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(got[0]) != 64 || slices.ContainsFunc(got, func(s string) bool { return s != got[0] }) {
		t.Fatalf("secrets %q; want one 64-character secret", got)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	if v, err := rdb.Get(ctx, DefaultPrefix+"secret").Result(); err != nil || v != got[0] {
		t.Errorf("Redis holds %q, %v; want the agreed secret", v, err)
	}
	if other, err := open(t, srv, Options{Prefix: "other:"}).SharedSecret(ctx); err != nil || other == got[0] || len(other) != 64 {
		t.Errorf("another prefix's secret = %q, %v", other, err)
	}
	if err := rdb.Set(ctx, DefaultPrefix+"secret", "", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if s, err := replicas[0].SharedSecret(ctx); err == nil {
		t.Errorf("an empty secret in Redis = %q, nil; want an error", s)
	}
}
