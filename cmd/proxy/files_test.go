package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/testutil"
)

// TestFilesSurviveARestart: the Files API is served from the data directory, a second process
// cannot open the same directory, and a restart on it still serves the file.
func TestFilesSurviveARestart(t *testing.T) {
	up := newUpstreamServer(t)
	path := writeConfig(t, t.TempDir(), configYAML(up.URL, "gpt-a"))
	dataDir := t.TempDir()
	p := startIn(t, dataDir, "--config", path)

	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "user_data")
	fw, _ := mw.CreateFormFile("file", "kept.csv")
	_, _ = io.WriteString(fw, "a,b\n1,2\n")
	_ = mw.Close()
	req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/files", &body)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ ID string }
	err = json.NewDecoder(resp.Body).Decode(&f)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || f.ID == "" {
		t.Fatalf("upload = %d %+v, %v", resp.StatusCode, f, err)
	}

	var stderr testutil.LockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code := runIn(t, ctx, dataDir, []string{"--config", path, "--host", "127.0.0.1", "--port", "0"}, io.Discard, &stderr,
		func(net.Addr) { t.Error("a second proxy on one data directory started listening"); cancel() })
	if code != 1 || !strings.Contains(stderr.String(), "in use by another process") {
		t.Errorf("a second proxy on one data directory = %d, %s; want it refused", code, stderr.String())
	}

	p.cancel()
	code = <-p.exit
	p.exit <- code // for the cleanup that start registered
	if code != 0 {
		t.Fatalf("the first proxy exited with %d: %s", code, p.stderr)
	}
	p = startIn(t, dataDir, "--config", path)
	req, _ = http.NewRequest(http.MethodGet, p.url+"/v1/files/"+f.ID+"/content", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || string(b) != "a,b\n1,2\n" {
		t.Errorf("content after a restart = %d %q", resp.StatusCode, b)
	}
}

// TestContainersSurviveARestart: containers are recorded in the data directory. After a restart
// an e2b container (its sandbox outlives the proxy) answers by its id with its files; a local one
// is expired, its sandbox gone with the process.
func TestContainersSurviveARestart(t *testing.T) {
	if err := local.Check(context.Background(), local.Options{}); err != nil {
		t.Skipf("local sandbox unavailable: %v", err)
	}
	exec, err := local.New(local.Options{PoolSize: 0, WorkDir: filepath.Join(t.TempDir(), "emu"), Tool: "emu"})
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Close(context.Background())
	emu := e2btest.New(exec)
	defer emu.Close()
	up := newUpstreamServer(t)
	for _, tool := range []string{"cloud", "local"} {
		t.Run(tool, func(t *testing.T) {
			cfg := strings.Replace(configYAML(up.URL, "gpt-a"), "sandbox_tools:\n", fmt.Sprintf(`sandbox_tools:
  - sandbox_tool_name: cloud
    litellm_params: {sandbox_provider: e2b, api_key: %s, api_base: %q, sandbox_url: %q}
`, emu.APIKey(), emu.URL(), emu.SandboxURL()), 1) + fmt.Sprintf(`litellm_settings:
  callbacks: ["code_interpreter_interception"]
  code_interpreter_interception_params: {sandbox_tool_name: %s}
`, tool)
			path := writeConfig(t, t.TempDir(), cfg)
			dataDir := t.TempDir()
			p := startIn(t, dataDir, "--config", path)
			ctx := context.Background()
			client := func(p *running) openai.Client {
				return openai.NewClient(option.WithBaseURL(p.url+"/v1/"), option.WithAPIKey(testKey), option.WithMaxRetries(0))
			}
			c := client(p)
			made, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: "kept"})
			if err != nil {
				t.Fatalf("Containers.New() error = %v (%s)", err, p.stderr)
			}
			f, err := c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("kept bytes"), "k.txt", "text/plain")})
			if err != nil {
				t.Fatal(err)
			}
			p.cancel()
			code := <-p.exit
			p.exit <- code
			if code != 0 {
				t.Fatalf("the first proxy exited with %d: %s", code, p.stderr)
			}
			if tool == "cloud" && emu.Live() != 1 {
				t.Errorf("e2b sandboxes after the proxy stopped: %d; want the container's still running", emu.Live())
			}
			p = startIn(t, dataDir, "--config", path)
			c = client(p)
			g, err := c.Containers.Get(ctx, made.ID)
			if tool == "local" {
				if err != nil || g.Status != "expired" {
					t.Errorf("Get() after a restart = %s, %v; want expired", g.RawJSON(), err)
				}
				return
			}
			if err != nil || g.Status != "running" {
				t.Fatalf("Get() after a restart = %s, %v; want running", g.RawJSON(), err)
			}
			resp, err := c.Containers.Files.Content.Get(ctx, made.ID, f.ID)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "kept bytes" {
				t.Errorf("content after a restart = %q", b)
			}
			if err := c.Containers.Delete(ctx, made.ID); err != nil || emu.Live() != 0 {
				t.Errorf("Delete() = %v, e2b sandboxes left %d; want none", err, emu.Live())
			}
		})
	}
}

// TestHeldUploadsStayInTheQuota: uploads held open before their last boundary count against the
// key's max_file_storage_per_key as their bytes arrive: the data directory never holds more than
// the quota, and the upload that would pass it gets OpenAI's 400 storage_limit_exceeded.
func TestHeldUploadsStayInTheQuota(t *testing.T) {
	const quota, each = 4 << 20, 1536 << 10
	up := newUpstreamServer(t)
	path := writeConfig(t, t.TempDir(), configYAML(up.URL, "gpt-a")+"  max_file_storage_per_key: 4m\n")
	dataDir := t.TempDir()
	p := startIn(t, dataDir, "--config", path)
	onDisk := func() int64 {
		var n int64
		for _, sub := range []string{"tmp", "blobs"} {
			entries, _ := os.ReadDir(filepath.Join(dataDir, sub))
			for _, e := range entries {
				if info, err := e.Info(); err == nil {
					n += info.Size()
				}
			}
		}
		return n
	}
	// hold sends the purpose and each bytes of the file, then nothing until the test ends.
	hold := func() <-chan *http.Response {
		pr, pw := io.Pipe()
		t.Cleanup(func() { _ = pw.CloseWithError(io.ErrUnexpectedEOF) })
		mw := multipart.NewWriter(pw)
		req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/files", pr)
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		answer := make(chan *http.Response, 1)
		go func() {
			resp, _ := http.DefaultClient.Do(req)
			answer <- resp
		}()
		go func() {
			_ = mw.WriteField("purpose", "user_data")
			fw, _ := mw.CreateFormFile("file", "held.bin")
			_, _ = fw.Write(bytes.Repeat([]byte("a"), each)) // no line break: all of it passes the multipart reader
		}()
		return answer
	}
	var most atomic.Int64
	stop := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Go(func() {
		for {
			most.Store(max(most.Load(), onDisk()))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	for i := range 2 {
		hold()
		deadline := time.Now().Add(20 * time.Second)
		for onDisk() != int64(i+1)*each {
			if time.Now().After(deadline) {
				t.Fatalf("upload %d: %d bytes on disk; want %d", i+1, onDisk(), (i+1)*each)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	select {
	case resp := <-hold():
		if resp == nil {
			t.Fatal("the upload past the quota failed without an answer")
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct{ Error struct{ Code, Param string } }
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Error.Code != "storage_limit_exceeded" || e.Error.Param != "file" {
			t.Errorf("the upload past the quota = %d %s; want 400 storage_limit_exceeded", resp.StatusCode, b)
		}
	case <-time.After(30 * time.Second):
		t.Error("no answer to the upload past the quota")
	}
	close(stop)
	sampled.Wait()
	if most.Load() > quota {
		t.Errorf("the data directory held %d bytes of one key's uploads; its quota is %d", most.Load(), quota)
	}
}
