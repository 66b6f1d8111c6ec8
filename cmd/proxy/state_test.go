package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

// redisConfig is configYAML with interception on and the state in the Redis at redisURL.
func redisConfig(upstreamURL, redisURL string) string {
	return configYAML(upstreamURL, "gpt-a") + `litellm_settings:
  callbacks: ["code_interpreter_interception"]
  code_interpreter_interception_params: {enabled: true, sandbox_tool_name: local}
router_settings:
  redis_url: ` + redisURL + `
`
}

// replicaConfig is redisConfig for one of several replicas: general_settings gains the shared
// secret (configYAML ends with general_settings, so the key is appended to that block).
func replicaConfig(upstreamURL, redisURL string) string {
	return strings.Replace(redisConfig(upstreamURL, redisURL), "general_settings:\n", "general_settings:\n  container_secret: replicas-share-this\n", 1)
}

// call sends one authenticated request and returns the status and body.
func (r *running) call(t *testing.T, method, path, contentType string, body io.Reader) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, r.url+path, body)
	req.Header.Set("Authorization", "Bearer "+testKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *running) upload(t *testing.T, name, content string) (int, string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "user_data")
	fw, _ := mw.CreateFormFile("file", name)
	_, _ = io.WriteString(fw, content)
	_ = mw.Close()
	return r.call(t, http.MethodPost, "/v1/files", mw.FormDataContentType(), &body)
}

func errorCode(body string) string {
	var e struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}

// TestRedisUnreachableAtStart: the proxy does not start, and says why without the password.
func TestRedisUnreachableAtStart(t *testing.T) {
	up := newUpstreamServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close() // nothing listens there now
	path := writeConfig(t, t.TempDir(), replicaConfig(up.URL, "redis://:hunter2-secret@127.0.0.1:"+strconv.Itoa(port)+"/0"))
	var stderr testutil.LockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := runOwnDir(t, ctx, []string{"--config", path, "--host", "127.0.0.1", "--port", "0", "--log-format", "json"}, io.Discard, &stderr,
		func(net.Addr) { t.Error("the proxy listened without its Redis"); cancel() })
	out := stderr.String()
	if code != 1 || !strings.Contains(out, "redis_") || !strings.Contains(out, "127.0.0.1:"+strconv.Itoa(port)) {
		t.Errorf("run = %d, %s; want 1 and an error naming the setting and the address", code, out)
	}
	if strings.Contains(out, "hunter2-secret") {
		t.Errorf("the log holds the Redis password: %s", out)
	}
}

// TestRedisLostAndBack: with Redis gone, what needs state is a 503 and /readyz stays 200 but
// names the fault, while plain pass-through goes on; once Redis answers again, everything does.
func TestRedisLostAndBack(t *testing.T) {
	rs := redisserver.Start(t)
	up := newUpstreamServer(t)
	path := writeConfig(t, t.TempDir(), replicaConfig(up.URL, rs.URL()))
	p := start(t, "--config", path)

	if status, body := p.upload(t, "a.csv", "a,b\n"); status != http.StatusOK {
		t.Fatalf("upload = %d %s", status, body)
	}
	if status, body := p.call(t, http.MethodGet, "/readyz", "", nil); status != http.StatusOK {
		t.Fatalf("/readyz = %d %s", status, body)
	}

	rs.Stop()
	testutil.Eventually(t, "/readyz reports the store", func() bool {
		status, body := p.call(t, http.MethodGet, "/readyz", "", nil)
		return status == http.StatusOK && strings.Contains(body, `"degraded":"the state store`)
	})
	if status, body := p.call(t, http.MethodGet, "/v1/files", "", nil); status != http.StatusServiceUnavailable {
		t.Errorf("list files without Redis = %d %s; want 503", status, body)
	}
	if status, body := p.upload(t, "b.csv", "x"); status != http.StatusServiceUnavailable {
		t.Errorf("upload without Redis = %d %s; want 503", status, body)
	}
	// An intercepted request that continues a conversation needs the store.
	resp := `{"model":"gpt-a","previous_response_id":"resp_abc","input":"hi","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`
	status, body := p.call(t, http.MethodPost, "/v1/responses", "application/json", strings.NewReader(resp))
	if status != http.StatusServiceUnavailable || errorCode(body) != "store_unavailable" {
		t.Errorf("an intercepted continuation without Redis = %d %s; want 503 store_unavailable", status, body)
	}
	// A stored-response id may be ours: nobody can tell without the store.
	if status, body := p.call(t, http.MethodGet, "/v1/responses/resp_abc", "", nil); status != http.StatusServiceUnavailable {
		t.Errorf("GET a response without Redis = %d %s; want 503", status, body)
	}
	// Pass-through needs no state.
	if status, body, err := p.post("gpt-a", ""); err != nil || status != http.StatusOK {
		t.Errorf("pass-through without Redis = %d %s %v; want 200", status, body, err)
	}

	rs.Restart() // empty: as a Redis without persistence comes back
	testutil.Eventually(t, "/readyz recovers", func() bool {
		status, body := p.call(t, http.MethodGet, "/readyz", "", nil)
		return status == http.StatusOK && !strings.Contains(body, "degraded")
	})
	if status, body := p.upload(t, "c.csv", "c\n"); status != http.StatusOK {
		t.Errorf("upload after Redis came back = %d %s", status, body)
	}
	if status, body := p.call(t, http.MethodGet, "/v1/files", "", nil); status != http.StatusOK || !strings.Contains(body, "c.csv") {
		t.Errorf("list after Redis came back = %d %s", status, body)
	}
}
