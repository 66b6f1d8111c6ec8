package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/testutil"
)

// TestFilesSurviveARestart: the Files API is served from the data directory, a second process
// cannot open the same directory, and a restart on it still serves the file.
func TestFilesSurviveARestart(t *testing.T) {
	up := newUpstreamServer(t)
	path := writeConfig(t, t.TempDir(), configYAML(up.URL, "gpt-a"))
	dataDir := t.TempDir()
	p := start(t, "--config", path, "--data-dir", dataDir)

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
	code := run(ctx, []string{"--config", path, "--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir}, io.Discard, &stderr,
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
	p = start(t, "--config", path, "--data-dir", dataDir)
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
