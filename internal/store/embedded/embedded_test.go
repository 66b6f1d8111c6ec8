package embedded

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) func() store.Store {
		dir := t.TempDir()
		return func() store.Store {
			s, err := Open(Options{Dir: dir, Now: now, SweepEvery: -1})
			if err != nil {
				t.Fatalf("Open = %v", err)
			}
			return s
		}
	})
}

// open opens a store on dir with a clock the test moves.
func open(t *testing.T, dir string, clock *storetest.Clock) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, Now: clock.Now, SweepEvery: -1})
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// names lists the entries of dir below the data directory.
func names(t *testing.T, s *Store, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(s.path(dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestSweepRemovesWhatExpired(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock()
	s := open(t, t.TempDir(), clock)
	now := clock.Now()
	gone, err := store.CreateFile(ctx, s, store.File{Owner: "a", Filename: "x", Purpose: "batch", ExpiresAt: now.Add(time.Hour)}, strings.NewReader("12"), store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	kept, _ := store.CreateFile(ctx, s, store.File{Owner: "a", Filename: "y", Purpose: "user_data"}, strings.NewReader("3"), store.FileLimits{})
	c, _ := s.CreateContainer(ctx, store.Container{Owner: "a", ForgetAt: now.Add(time.Hour)})
	cf, _ := s.PutContainerFile(ctx, store.ContainerFile{ContainerID: c.ID, Owner: "a", Path: "/mnt/data/z"})
	live, _ := s.CreateContainer(ctx, store.Container{Owner: "a"})
	_ = s.PutResponse(ctx, store.Response{ID: "resp_old", ExpiresAt: now.Add(time.Hour)}, []store.Call{{ID: "ci_old", ExpiresAt: now.Add(time.Hour)}})
	_ = s.PutResponse(ctx, store.Response{ID: "resp_new", ExpiresAt: now.Add(3 * time.Hour)}, []store.Call{{ID: "ci_forever"}})
	if _, err := s.Claim(ctx, "k", "h", time.Minute); err != nil {
		t.Fatal(err)
	}

	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := names(t, s, dirBlobs); len(got) != 2 {
		t.Fatalf("a sweep before anything expired removed something: blobs %v", got)
	}
	clock.Advance(2 * time.Hour)
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		dir  string
		want []string
	}{
		{dirBlobs, []string{kept.ID}},
		{dirFiles, []string{kept.ID + ".json"}},
		{dirContainers, []string{live.ID + ".json"}},
		{dirCFiles, nil},
		{dirResponses, []string{"resp_new.json"}},
		{dirCalls, []string{"ci_forever.json"}},
		{dirTmp, nil},
	}
	for _, tc := range tests {
		if got := names(t, s, tc.dir); !slices.Equal(got, tc.want) {
			t.Errorf("%s/ after the sweep = %v; want %v", tc.dir, got, tc.want)
		}
	}
	if len(s.claims) != 0 {
		t.Errorf("an expired claim survived the sweep: %v", s.claims)
	}
	if _, ok := s.cfiles[cf.ID]; ok {
		t.Error("a forgotten container's file is still indexed")
	}
	if u, _ := s.Usage(ctx, "a"); u != (store.Usage{Files: 1, Bytes: 1}) {
		t.Errorf("Usage = %+v", u)
	}
	_ = gone
}

// TestOpenRepairsACrash: what a process killed mid-operation leaves behind is cleaned up, and a
// record that cannot be read is set aside without taking the rest down.
func TestOpenRepairsACrash(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, Now: clock.Now, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	good, _ := store.CreateFile(ctx, s, store.File{Owner: "a", Filename: "good", Purpose: "user_data"}, strings.NewReader("good"), store.FileLimits{})
	torn, _ := store.CreateFile(ctx, s, store.File{Owner: "a", Filename: "torn", Purpose: "user_data"}, strings.NewReader("torn"), store.FileLimits{})
	c, _ := s.CreateContainer(ctx, store.Container{Owner: "a"})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	orphan := s.NewID(store.FileKind)
	write(filepath.Join(dirBlobs, orphan), "bytes whose metadata never got written")
	write(filepath.Join(dirTmp, "upload-123"), "an upload in progress")
	write(filepath.Join(dirFiles, torn.ID+".json"), `{"id":"`+torn.ID+`","own`) // a torn record
	lost := s.NewID(store.ContainerKind)
	b, _ := json.Marshal(store.ContainerFile{ID: s.NewID(store.ContainerFileKind), ContainerID: lost, Owner: "a", Path: "/mnt/data/x"})
	write(filepath.Join(dirCFiles, "orphan.json"), string(b))
	write(filepath.Join(dirFiles, "notes.txt"), "not a record")

	s = open(t, dir, clock)
	if got, err := s.File(ctx, "a", good.ID); err != nil || got.Filename != "good" {
		t.Errorf("the good file after repair = %+v, %v", got, err)
	}
	if _, err := s.File(ctx, "a", torn.ID); err == nil {
		t.Error("a torn record was loaded")
	}
	if _, err := s.Container(ctx, "a", c.ID); err != nil {
		t.Errorf("container after repair: %v", err)
	}
	if got := names(t, s, dirBlobs); !slices.Equal(got, []string{good.ID}) {
		t.Errorf("blobs/ after repair = %v; want only the good file's", got)
	}
	if got := names(t, s, dirTmp); len(got) != 0 {
		t.Errorf("tmp/ after repair = %v", got)
	}
	if got := names(t, s, dirCFiles); len(got) != 0 {
		t.Errorf("cfiles/ after repair = %v", got)
	}
	// The torn record and its bytes are kept aside for an operator, not deleted.
	if got := names(t, s, dirCorrupt); !slices.Equal(got, []string{"blobs-" + torn.ID, "files-" + torn.ID + ".json"}) {
		t.Errorf("corrupt/ = %v", got)
	}
	if u, _ := s.Usage(ctx, "a"); u != (store.Usage{Files: 1, Bytes: 4}) {
		t.Errorf("Usage after repair = %+v", u)
	}
}

func TestOneProcessPerDirectory(t *testing.T) {
	dir := t.TempDir()
	clock := storetest.NewClock()
	open(t, dir, clock)
	if s, err := Open(Options{Dir: dir, SweepEvery: -1}); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		if s != nil {
			_ = s.Close()
		}
		t.Errorf("a second Open of one directory = %v; want it refused", err)
	}
}

func TestFormatAndPermissions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "data")
	s := open(t, dir, storetest.NewClock())
	f, err := store.CreateFile(context.Background(), s, store.File{Owner: "a", Filename: "f", Purpose: "user_data"}, strings.NewReader("x"), store.FileLimits{})
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{
		dir:                                0o700 | os.ModeDir,
		filepath.Join(dir, dirBlobs):       0o700 | os.ModeDir,
		filepath.Join(dir, dirBlobs, f.ID): 0o600,
		filepath.Join(dir, dirFiles, f.ID+".json"): 0o600,
	} {
		info, err := os.Stat(path)
		if err != nil || info.Mode() != want {
			t.Errorf("mode of %s = %v, %v; want %v", path, info.Mode(), err, want)
		}
	}
	_ = s.Close()
	if err := os.WriteFile(filepath.Join(dir, formatFile), []byte("ciproxy-store 99\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(Options{Dir: dir, SweepEvery: -1}); err == nil || !strings.Contains(err.Error(), "format") {
		if s != nil {
			_ = s.Close()
		}
		t.Errorf("Open of a newer format = %v; want it refused", err)
	}
}
