package daytonatest_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox/daytonatest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
)

var sandboxes = localsandbox.New(local.Options{PoolSize: -1})

func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }

func newDouble(t *testing.T) *daytonatest.Server {
	exec := sandboxes.Provider(t)
	srv := daytonatest.New(exec)
	t.Cleanup(func() {
		srv.Close()
		if n := exec.Live(); n != 0 {
			t.Errorf("%d exec sandboxes left", n)
		}
	})
	return srv
}

func call(t *testing.T, srv *daytonatest.Server, method, url, key, body string) (int, gjson.Result) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, gjson.ParseBytes(raw)
}

// started creates a sandbox and waits until it is started.
func started(t *testing.T, srv *daytonatest.Server) string {
	t.Helper()
	st, sb := call(t, srv, http.MethodPost, srv.URL()+"/sandbox", srv.APIKey(), `{"labels":{"k":"v"},"autoDeleteInterval":0}`)
	if st != 200 || sb.Get("state").String() != "creating" {
		t.Fatalf("create: %d %s", st, sb.Raw)
	}
	id := sb.Get("id").String()
	testutil.Eventually(t, "started", func() bool { return srv.State(id) == daytonatest.StateStarted })
	return id
}

func TestAPI(t *testing.T) {
	srv := newDouble(t)
	for _, tc := range []struct {
		name, method, path, key, body string
		status                        int
		message                       string
	}{
		{"no key", "GET", "/sandbox", "", "", 401, "Unauthorized"},
		{"wrong key", "GET", "/sandbox", "nope", "", 401, "Unauthorized"},
		{"resources with a snapshot", "POST", "/sandbox", "KEY", `{"snapshot":"s","cpu":2}`, 400, "Cannot specify Sandbox resources when using a snapshot"},
		{"bad types", "POST", "/sandbox", "KEY", `{"labels":{"a":1},"autoStopInterval":"x"}`, 400, "autoStopInterval must be an integer number, labels must be a record of strings"},
		{"not JSON", "POST", "/sandbox", "KEY", `{`, 400, ""},
		{"unknown sandbox", "GET", "/sandbox/nope", "KEY", "", 404, "Sandbox with ID or name nope not found"},
		{"list", "GET", "/sandbox?labels=%7B%7D", "KEY", "", 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := strings.ReplaceAll(tc.key, "KEY", srv.APIKey())
			st, body := call(t, srv, tc.method, srv.URL()+tc.path, key, tc.body)
			if st != tc.status {
				t.Fatalf("status %d, want %d: %s", st, tc.status, body.Raw)
			}
			if st >= 400 && (body.Get("statusCode").Int() != int64(st) || body.Get("error").String() == "" || body.Get("path").String() == "") {
				t.Errorf("not NestJS's error body: %s", body.Raw)
			}
			if tc.message != "" && body.Get("message").String() != tc.message {
				t.Errorf("message %q, want %q", body.Get("message").String(), tc.message)
			}
		})
	}
	if srv.Live() != 0 {
		t.Errorf("%d live", srv.Live())
	}
}

func TestInterpreterProtocol(t *testing.T) {
	srv := newDouble(t)
	id := started(t, srv)
	tb := srv.ToolboxURL() + "/" + id
	hdr := http.Header{"Authorization": {"Bearer " + srv.APIKey()}}
	dial := func(t *testing.T) *websocket.Conn {
		conn, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(tb, "http")+"/process/interpreter/execute", &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.CloseNow() })
		return conn
	}
	read := func(t *testing.T, conn *websocket.Conn) ([]gjson.Result, websocket.CloseError) {
		var msgs []gjson.Result
		for {
			_, data, err := conn.Read(context.Background())
			if err != nil {
				var ce websocket.CloseError
				errors.As(err, &ce)
				return msgs, ce
			}
			msgs = append(msgs, gjson.ParseBytes(data))
		}
	}
	for _, tc := range []struct {
		name, send string
		code       websocket.StatusCode
		reason     string
		types      string
	}{
		{"not JSON", "{", websocket.StatusProtocolError, "invalid JSON payload", ""},
		{"no code", `{"code":""}`, websocket.StatusPolicyViolation, "code is required", ""},
		{"unknown context", `{"code":"1","contextId":"nope"}`, websocket.StatusPolicyViolation, "context not found: nope", ""},
		{"run", `{"code":"print(1)\n1/0"}`, websocket.StatusNormalClosure, "", "stdout,error,control"},
		{"no value of a trailing expression", `{"code":"2+2"}`, websocket.StatusNormalClosure, "", "control"},
		{"timeout", `{"code":"import time\ntime.sleep(30)","timeout":1}`, 4008, "", "control"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := dial(t)
			if err := conn.Write(context.Background(), websocket.MessageText, []byte(tc.send)); err != nil {
				t.Fatal(err)
			}
			msgs, ce := read(t, conn)
			if ce.Code != tc.code || (tc.reason != "" && ce.Reason != tc.reason) {
				t.Errorf("close %d %q, want %d %q", ce.Code, ce.Reason, tc.code, tc.reason)
			}
			var types []string
			for _, m := range msgs {
				types = append(types, m.Get("type").String())
				for _, k := range []string{"type", "text", "name", "value", "traceback"} {
					if !m.Get(k).Exists() {
						t.Errorf("message without %s: %s", k, m.Raw)
					}
				}
			}
			if strings.Join(types, ",") != tc.types {
				t.Errorf("messages %v, want %s", types, tc.types)
			}
			if tc.name == "run" && (msgs[1].Get("name").String() != "ZeroDivisionError" || !strings.Contains(msgs[1].Get("traceback").String(), "<stdin>")) {
				t.Errorf("error %s", msgs[1].Raw)
			}
		})
	}
}

func TestSessionLogs(t *testing.T) {
	srv := newDouble(t)
	id := started(t, srv)
	tb := srv.ToolboxURL() + "/" + id
	key := srv.APIKey()
	if st, _ := call(t, srv, "POST", tb+"/process/session", key, `{"sessionId":"s1"}`); st != 201 {
		t.Fatalf("session: %d", st)
	}
	st, body := call(t, srv, "POST", tb+"/process/session/s1/exec", key, `{"command":"echo out; echo err >&2","runAsync":true}`)
	if st != 202 || body.Get("cmdId").String() == "" {
		t.Fatalf("exec: %d %s", st, body.Raw)
	}
	cmd := body.Get("cmdId").String()
	conn, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(tb, "http")+"/process/session/s1/command/"+cmd+"/logs?follow=true",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		t.Fatal(err)
	}
	var log []byte
	for {
		_, data, err := conn.Read(context.Background())
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Errorf("close: %v", err)
			}
			break
		}
		log = append(log, data...)
	}
	if !bytes.Contains(log, []byte("\x01\x01\x01out\n")) || !bytes.Contains(log, []byte("\x02\x02\x02err\n")) {
		t.Errorf("log %q", log)
	}
	testutil.Eventually(t, "exit code", func() bool {
		_, c := call(t, srv, "GET", tb+"/process/session/s1/command/"+cmd, key, "")
		return c.Get("exitCode").Exists() && c.Get("exitCode").Int() == 0
	})
	if st, _ := call(t, srv, "DELETE", tb+"/process/session/s1", key, ""); st != 204 {
		t.Errorf("delete session: %d", st)
	}
	srv.Advance(20 * time.Minute)
	if srv.Live() != 0 {
		t.Errorf("auto-stop and auto-delete 0 left %d", srv.Live())
	}
	if st, body := call(t, srv, "GET", tb+"/files?path=/", key, ""); st != 404 || body.Get("code").Exists() {
		t.Errorf("a gone sandbox's toolbox: %d %s (the proxy answers, not the daemon)", st, body.Raw)
	}
}
