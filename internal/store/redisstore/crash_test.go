package redisstore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
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
// only its upload key, with a TTL, and then nothing; the file never appears and never counts.
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

	s := open(t, srv, Options{})
	ks := keys(t, s)
	if len(ks) != 1 || !strings.HasPrefix(ks[0], "upload:") {
		t.Fatalf("keys after the kill = %v; want only the upload's", ks)
	}
	if n, err := s.rdb.HLen(context.Background(), s.prefix+ks[0]).Result(); err != nil || n != helperChunks {
		t.Errorf("the upload holds %d chunks, %v; want the %d written", n, err, helperChunks)
	}
	if d := pttl(t, s, ks[0]); d <= 0 || d > helperUploadTTL {
		t.Errorf("PTTL of the upload = %s; want at most %s", d, helperUploadTTL)
	}
	if u, err := s.Usage(context.Background(), "victim"); err != nil || u != (store.Usage{}) {
		t.Errorf("Usage of the killed uploader's owner = %+v, %v", u, err)
	}
	if l, err := s.ListFiles(context.Background(), "victim", store.FileQuery{}); err != nil || len(l.Items) != 0 {
		t.Errorf("ListFiles = %+v, %v", l, err)
	}
	eventually(t, "the cut upload to expire", func() bool { return len(keys(t, s)) == 0 })
}
