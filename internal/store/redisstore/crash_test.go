package redisstore

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

// The test binary doubles as a proxy process that dies mid-upload: with helperAddr set, it
// uploads part of a file to that Redis, says so, and waits to be killed.
const (
	helperAddr      = "REDISSTORE_TEST_UPLOADER_ADDR"
	helperUploadTTL = 2 * time.Second
	helperChunk     = 64 << 10
	helperChunks    = 5
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperAddr); addr != "" {
		if err := uploadAndWait(addr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func uploadAndWait(addr string) error {
	ctx := context.Background()
	s, err := Open(ctx, Options{Addr: addr, UploadTTL: helperUploadTTL, ChunkSize: helperChunk})
	if err != nil {
		return err
	}
	up, err := s.BeginFile(ctx, "victim", store.FileLimits{})
	if err != nil {
		return err
	}
	// Five full chunks reach Redis; half of a sixth waits in memory.
	if _, err := up.Write(ctx, bytes.NewReader(make([]byte, helperChunks*helperChunk+helperChunk/2))); err != nil {
		return err
	}
	fmt.Println("written")
	_, _ = io.Copy(io.Discard, os.Stdin) // until killed
	return nil
}

// TestKilledUploadLeavesNothing: a process killed (SIGKILL) in the middle of an upload leaves
// only its upload key and its reservation, with the same TTL, and then nothing; the file never
// appears, and the reservation holds the owner's quota only until it expires.
func TestKilledUploadLeavesNothing(t *testing.T) {
	srv := redisserver.Start(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperAddr+"="+srv.Addr())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "written\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the uploader said %q, %v", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	s := open(t, srv, Options{ReadGrace: time.Millisecond})
	ks := keys(t, s)
	var uploads []string
	for _, k := range ks {
		if strings.HasPrefix(k, "upload:") {
			uploads = append(uploads, k)
		}
	}
	// Beside its bytes, the upload's reservation: among the owner's uploads and everyone's.
	want := []string{"owner:victim:uploads", "owner:victim:uploads:n", "uploads", "uploads:n"}
	if len(uploads) != 1 || !slices.Equal(slices.DeleteFunc(ks, func(k string) bool { return k == uploads[0] }), want) {
		t.Fatalf("keys after the kill = %v; want the upload's and %v", keys(t, s), want)
	}
	if n, err := s.rdb.HLen(context.Background(), s.prefix+uploads[0]).Result(); err != nil || n != helperChunks {
		t.Errorf("the upload holds %d chunks, %v; want the %d written", n, err, helperChunks)
	}
	for _, k := range append(want, uploads[0]) {
		if d := pttl(t, s, k); d <= 0 || d > helperUploadTTL {
			t.Errorf("PTTL of %s = %s; want at most %s", k, d, helperUploadTTL)
		}
	}
	// Until it expires, the dead upload's reservation (every byte it took, the half chunk still
	// in its memory included) holds the owner's quota; then the whole quota is free.
	lim := store.FileLimits{OwnerBytes: (helperChunks + 1) * helperChunk}
	if _, err := store.CreateFile(context.Background(), s, store.File{Owner: "victim"}, bytes.NewReader(make([]byte, helperChunk)), lim); !errors.Is(err, store.ErrQuota) {
		t.Errorf("a chunk beside the dead upload's reservation = %v; want ErrQuota", err)
	}
	testutil.Eventually(t, "the dead upload's reservation to expire", func() bool {
		_, err := store.CreateFile(context.Background(), s, store.File{Owner: "victim"}, bytes.NewReader(make([]byte, lim.OwnerBytes)), lim)
		return err == nil
	})
	l, err := s.ListFiles(context.Background(), "victim", store.FileQuery{})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("ListFiles = %+v, %v; want the one file that filled the quota", l, err)
	}
	if _, err := s.DeleteFile(context.Background(), "victim", l.Items[0].ID); err != nil {
		t.Fatal(err)
	}
	if u, err := s.Usage(context.Background(), "victim"); err != nil || u != (store.Usage{}) {
		t.Errorf("Usage of the killed uploader's owner = %+v, %v", u, err)
	}
	// The id clock alone stays (the file minted an id).
	testutil.Eventually(t, "the cut upload to expire", func() bool { return slices.Equal(keys(t, s), []string{"idclock"}) })
}
