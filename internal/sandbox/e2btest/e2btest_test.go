package e2btest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
)

// sandboxes is the local sandbox every emulator in these tests executes through; one provider
// serves the whole package, since tests run one at a time. Tests skip where it cannot run.
var sandboxes = localsandbox.New(local.Options{PoolSize: -1})

func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }

// env is an emulator executing through a real local provider.
type env struct {
	t     *testing.T
	srv   *e2btest.Server
	exec  *local.Provider
	http  *http.Client
	start time.Time
}

func newEnv(t *testing.T) *env {
	t.Helper()
	execProvider := sandboxes.Provider(t)
	srv := e2btest.New(execProvider)
	e := &env{t: t, srv: srv, exec: execProvider, http: srv.Client(), start: time.Date(2026, 8, 21, 18, 0, 0, 0, time.UTC)}
	// A fixed clock: expiry happens only when a test advances it.
	srv.SetClock(func() time.Time { return e.start })
	t.Cleanup(func() {
		srv.Close()
		if n := execProvider.Live(); n != 0 {
			t.Errorf("exec sandboxes alive after Close: %d", n)
		}
	})
	return e
}

type response struct {
	status int
	header http.Header
	body   string
}

// do sends one request; hdr holds header pairs.
func (e *env) do(method, url string, body string, hdr ...string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: reading: %v", method, url, err)
	}
	return response{resp.StatusCode, resp.Header, string(b)}
}

// api sends an authenticated control-plane request.
func (e *env) api(method, path, body string) response {
	e.t.Helper()
	return e.do(method, e.srv.URL()+path, body, "X-API-Key", e.srv.APIKey(), "Content-Type", "application/json")
}

// create makes a v1 sandbox and returns its Sandbox body.
func (e *env) create(body string) map[string]any {
	e.t.Helper()
	r := e.api("POST", "/sandboxes", body)
	if r.status != http.StatusCreated {
		e.t.Fatalf("create: %d %s", r.status, r.body)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(r.body), &m); err != nil {
		e.t.Fatal(err)
	}
	return m
}

// data sends a data-plane request through the SandboxURL with routing headers.
func (e *env) data(id string, port int, method, path, body string, hdr ...string) response {
	e.t.Helper()
	hdr = append([]string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", strconv.Itoa(port)}, hdr...)
	return e.do(method, e.srv.SandboxURL()+path, body, hdr...)
}

func (e *env) execute(id, body string, hdr ...string) response {
	e.t.Helper()
	return e.data(id, e2btest.JupyterPort, "POST", "/execute", body, hdr...)
}

var (
	sandboxIDRe = regexp.MustCompile(`^i[a-z0-9]{20}$`)
	timestampRe = regexp.MustCompile(`"timestamp": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00"`)
)

func TestCreateResponse(t *testing.T) {
	e := newEnv(t)
	e.srv.SetLazyKernels(true) // control plane only
	tests := []struct {
		name       string
		path, body string
		wantToken  bool
		wantLife   time.Duration
	}{
		{"v1 secure with timeout", "/sandboxes", `{"templateID":"code-interpreter-v1","timeout":300,"secure":true}`, true, 300 * time.Second},
		{"v1 without timeout lives 15s", "/sandboxes", `{"templateID":"code-interpreter-v1"}`, false, 15 * time.Second},
		{"v2 is always secured and defaults to 300s", "/v2/sandboxes", `{"templateID":"code-interpreter-v1"}`, true, 300 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.api("POST", tc.path, tc.body)
			if r.status != http.StatusCreated {
				t.Fatalf("status = %d %s; want 201", r.status, r.body)
			}
			var sb map[string]any
			if err := json.Unmarshal([]byte(r.body), &sb); err != nil {
				t.Fatal(err)
			}
			id, _ := sb["sandboxID"].(string)
			if !sandboxIDRe.MatchString(id) {
				t.Errorf("sandboxID = %q; want i + 20 [a-z0-9]", id)
			}
			if sb["clientID"] != "6532622b" || sb["envdVersion"] != "0.6.13" || sb["alias"] != "code-interpreter-v1" || sb["templateID"] == "" {
				t.Errorf("sandbox = %s", r.body)
			}
			if _, has := sb["domain"]; has {
				t.Errorf("domain present: %s", r.body)
			}
			if _, has := sb["envdAccessToken"]; has != tc.wantToken {
				t.Errorf("envdAccessToken present = %v; want %v", has, tc.wantToken)
			}
			d := e.api("GET", "/sandboxes/"+id, "")
			var det struct{ StartedAt, EndAt time.Time }
			if err := json.Unmarshal([]byte(d.body), &det); err != nil {
				t.Fatal(err)
			}
			if got := det.EndAt.Sub(det.StartedAt); got != tc.wantLife {
				t.Errorf("lifetime = %v; want %v", got, tc.wantLife)
			}
		})
	}
}

func TestControlPlaneErrors(t *testing.T) {
	e := newEnv(t)
	e.srv.SetLazyKernels(true) // control plane only
	tests := []struct {
		name       string
		method     string
		path, body string
		hdr        []string
		wantStatus int
		wantBody   string
	}{
		{"missing key", "POST", "/sandboxes", `{"templateID":"base"}`, nil, 401,
			`{"code":401,"message":"authorization header is missing"}`},
		{"bad key", "POST", "/sandboxes", `{"templateID":"base"}`, []string{"X-API-Key", "e2b_00"}, 401,
			`{"code":401,"message":"Invalid API key, please visit https://e2b.dev/docs/api-key for more information."}`},
		{"key without prefix", "GET", "/v2/sandboxes", "", []string{"X-API-Key", "abc"}, 401,
			`{"code":401,"message":"Invalid API key, please visit https://e2b.dev/docs/api-key for more information."}`},
		{"zero timeout", "POST", "/sandboxes", `{"templateID":"base","timeout":0}`, []string{"X-API-Key", e.srv.APIKey()}, 400,
			`{"code":400,"message":"Timeout must be greater than 0"}`},
		{"kill unknown", "DELETE", "/sandboxes/inope", "", []string{"X-API-Key", e.srv.APIKey()}, 404,
			`{"code":404,"message":"Sandbox \"inope\" doesn't exist or you don't have access to it"}`},
		{"timeout unknown", "POST", "/sandboxes/inope/timeout", `{"timeout":10}`, []string{"X-API-Key", e.srv.APIKey()}, 404,
			`{"code":404,"message":"Sandbox \"inope\" doesn't exist or you don't have access to it"}`},
		{"connect without timeout", "POST", "/sandboxes/inope/connect", `{}`, []string{"X-API-Key", e.srv.APIKey()}, 400, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, e.srv.URL()+tc.path, tc.body, tc.hdr...)
			if r.status != tc.wantStatus {
				t.Fatalf("status = %d; want %d (%s)", r.status, tc.wantStatus, r.body)
			}
			if tc.wantBody != "" && r.body != tc.wantBody {
				t.Errorf("body = %s; want %s", r.body, tc.wantBody)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
		})
	}
	if e.srv.Live() != 0 || e.srv.Creates() != 0 {
		t.Errorf("Live = %d, Creates = %d; want 0, 0", e.srv.Live(), e.srv.Creates())
	}
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":60,"secure":true,"metadata":{"k":"v"}}`)["sandboxID"].(string)

	endAt := func() time.Time {
		t.Helper()
		r := e.api("GET", "/sandboxes/"+id+"-6532622b", "") // the legacy id form works too
		if r.status != 200 {
			t.Fatalf("get: %d %s", r.status, r.body)
		}
		var d struct {
			EndAt    time.Time
			State    string
			Metadata map[string]string
		}
		if err := json.Unmarshal([]byte(r.body), &d); err != nil {
			t.Fatal(err)
		}
		if d.Metadata["k"] != "v" {
			t.Errorf("metadata = %v", d.Metadata)
		}
		return d.EndAt
	}
	if got, want := endAt(), e.start.Add(60*time.Second); !got.Equal(want) {
		t.Errorf("endAt = %v; want %v", got, want)
	}
	if r := e.api("POST", "/sandboxes/"+id+"/timeout", `{"timeout":10}`); r.status != 204 || r.body != "" {
		t.Fatalf("timeout: %d %q", r.status, r.body)
	}
	if got, want := endAt(), e.start.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("after /timeout 10: endAt = %v; want %v (it may shorten)", got, want)
	}
	if r := e.api("POST", "/sandboxes/"+id+"/connect", `{"timeout":5}`); r.status != 200 {
		t.Fatalf("connect: %d %s", r.status, r.body)
	}
	if got, want := endAt(), e.start.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("after connect 5: endAt = %v; want %v (connect never shortens)", got, want)
	}
	if r := e.api("POST", "/sandboxes/"+id+"/refreshes", `{"duration":30}`); r.status != 204 {
		t.Fatalf("refreshes: %d %s", r.status, r.body)
	}
	if got, want := endAt(), e.start.Add(30*time.Second); !got.Equal(want) {
		t.Errorf("after refresh 30: endAt = %v; want %v", got, want)
	}
	if r := e.api("POST", "/sandboxes/"+id+"/pause", ""); r.status != 204 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	if r := e.execute(id, `{"code":"1"}`); r.status != 502 {
		t.Errorf("execute on a paused sandbox: %d; want 502", r.status)
	}
	if r := e.api("POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":100}`); r.status != 201 {
		t.Fatalf("connect to paused: %d %s; want 201", r.status, r.body)
	}
	if r := e.execute(id, `{"code":"1"}`); r.status != 200 {
		t.Errorf("execute after resume: %d %s", r.status, r.body)
	}
	if r := e.api("DELETE", "/sandboxes/"+id, ""); r.status != 204 || r.body != "" {
		t.Fatalf("delete: %d %q", r.status, r.body)
	}
	if r := e.api("DELETE", "/sandboxes/"+id, ""); r.status != 404 {
		t.Fatalf("second delete: %d; want 404", r.status)
	}
	if e.srv.Creates() != 1 || e.srv.Deletes() != 1 || e.exec.Live() != 0 {
		t.Errorf("creates %d deletes %d exec live %d; want 1 1 0", e.srv.Creates(), e.srv.Deletes(), e.exec.Live())
	}
}

func TestExpiry(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":30,"secure":true}`)["sandboxID"].(string)
	paused := e.create(`{"templateID":"code-interpreter-v1","timeout":30,"autoPause":true}`)["sandboxID"].(string)
	if e.exec.Live() != 2 {
		t.Fatalf("exec live = %d; want 2", e.exec.Live())
	}
	e.srv.Advance(29 * time.Second)
	if e.srv.Live() != 2 {
		t.Fatalf("Live before the end = %d", e.srv.Live())
	}
	e.srv.Advance(time.Second)
	r := e.execute(id, `{"code":"1"}`)
	if want := `{"sandboxId":"` + id + `","message":"The sandbox was not found","code":502}`; r.status != 502 || r.body != want {
		t.Errorf("execute after expiry = %d %s; want 502 %s", r.status, r.body, want)
	}
	if r := e.data(id, e2btest.EnvdPort, "GET", "/health", ""); r.status != 502 {
		t.Errorf("envd health after expiry = %d; want 502", r.status)
	}
	if got := e.srv.SandboxIDs(); len(got) != 1 || got[0] != paused {
		t.Errorf("SandboxIDs = %v; want only the auto-paused %s", got, paused)
	}
	if e.exec.Live() != 1 {
		t.Errorf("exec live = %d; want 1 (the expired sandbox's kernel is gone)", e.exec.Live())
	}
	var d struct{ State string }
	_ = json.Unmarshal([]byte(e.api("GET", "/sandboxes/"+paused, "").body), &d)
	if d.State != "paused" {
		t.Errorf("auto-paused state = %q", d.State)
	}
}

func TestListV2Paging(t *testing.T) {
	e := newEnv(t)
	e.srv.SetLazyKernels(true) // control plane only
	var ids []string
	for i := range 3 {
		e.start = e.start.Add(time.Second) // distinct start times, newest first in the listing
		meta := `{"n":"` + strconv.Itoa(i) + `","team":"a"}`
		if i == 2 {
			meta = `{"n":"2","team":"b"}`
		}
		ids = append(ids, e.create(`{"templateID":"base","timeout":60,"metadata":` + meta + `}`)["sandboxID"].(string))
	}
	list := func(q string) ([]string, string, response) {
		t.Helper()
		r := e.api("GET", "/v2/sandboxes"+q, "")
		if r.status != 200 {
			t.Fatalf("list %s: %d %s", q, r.status, r.body)
		}
		var items []struct{ SandboxID, State string }
		if err := json.Unmarshal([]byte(r.body), &items); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, it := range items {
			got = append(got, it.SandboxID)
		}
		return got, r.header.Get("X-Next-Token"), r
	}
	page1, tok, r := list("?limit=2")
	if len(page1) != 2 || page1[0] != ids[2] || page1[1] != ids[1] || tok == "" {
		t.Fatalf("page 1 = %v token %q; want [%s %s] and a token", page1, tok, ids[2], ids[1])
	}
	if r.header.Get("X-Total-Running") != "3" {
		t.Errorf("X-Total-Running = %q", r.header.Get("X-Total-Running"))
	}
	page2, tok2, _ := list("?limit=2&nextToken=" + tok)
	if len(page2) != 1 || page2[0] != ids[0] || tok2 != "" {
		t.Errorf("page 2 = %v token %q; want [%s] and no token", page2, tok2, ids[0])
	}
	if got, _, _ := list("?metadata=team%3Da"); len(got) != 2 {
		t.Errorf("metadata team=a: %v", got)
	}
	if got, _, _ := list("?state=paused"); len(got) != 0 {
		t.Errorf("state=paused: %v", got)
	}
	if r := e.api("GET", "/v2/sandboxes?limit=101", ""); r.status != 400 {
		t.Errorf("limit=101: %d", r.status)
	}
	if r := e.api("GET", "/sandboxes?metadata=team%3Db", ""); r.status != 200 || !strings.Contains(r.body, ids[2]) || strings.Contains(r.body, ids[0]) {
		t.Errorf("v1 list: %d %s", r.status, r.body)
	}
}

// lines splits an NDJSON body and checks that every line ends with "\n".
func lines(t *testing.T, body string) []string {
	t.Helper()
	if body != "" && !strings.HasSuffix(body, "\n") {
		t.Errorf("body does not end with a newline: %q", body)
	}
	return strings.Split(strings.TrimSuffix(body, "\n"), "\n")
}

func TestExecuteTranscript(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"secure":true}`)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	tests := []struct {
		name string
		code string
		want []string
	}{
		{"print and expression", "print('hi')\n1+1", []string{
			`{"type": "number_of_executions", "execution_count": 1}`,
			`{"type": "stdout", "text": "hi\n", "timestamp": "*"}`,
			`{"type": "result", "text": "2", "extra": {}, "is_main_result": true}`,
			`{"type": "end_of_execution"}`,
		}},
		{"error", "x", []string{
			`{"type": "number_of_executions", "execution_count": 2}`,
			`{"type": "error", "name": "NameError", "value": "name 'x' is not defined", "traceback": "*"}`,
			`{"type": "end_of_execution"}`,
		}},
		{"non-ASCII is escaped as Python does", "print('é😀<&>')", []string{
			`{"type": "number_of_executions", "execution_count": 3}`,
			`{"type": "stdout", "text": "\u00e9\ud83d\ude00<&>\n", "timestamp": "*"}`,
			`{"type": "end_of_execution"}`,
		}},
		{"string result loses its quotes", "'a\"b'", []string{
			`{"type": "number_of_executions", "execution_count": 4}`,
			`{"type": "result", "text": "a\"b", "extra": {}, "is_main_result": true}`,
			`{"type": "end_of_execution"}`,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body, _ := json.Marshal(map[string]any{"code": tc.code, "context_id": nil, "language": nil, "env_vars": map[string]string{}})
			r := e.execute(id, string(body), "X-Access-Token", token)
			if r.status != 200 {
				t.Fatalf("status %d %s", r.status, r.body)
			}
			if ct, has := r.header["Content-Type"]; has {
				t.Errorf("Content-Type = %q; the server sets none", ct)
			}
			got := lines(t, r.body)
			if len(got) != len(tc.want) {
				t.Fatalf("lines:\n%s\nwant %d lines", r.body, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if strings.Contains(w, `"timestamp": "*"`) {
					if !timestampRe.MatchString(g) {
						t.Errorf("line %d timestamp: %s", i, g)
					}
					g = timestampRe.ReplaceAllString(g, `"timestamp": "*"`)
				}
				if strings.Contains(w, `"traceback": "*"`) {
					g = regexp.MustCompile(`"traceback": ".*"}$`).ReplaceAllString(g, `"traceback": "*"}`)
				}
				if g != w {
					t.Errorf("line %d =\n%s\nwant\n%s", i, g, w)
				}
			}
		})
	}
	req, ok := e.srv.LastRequest("49999 POST /execute")
	if !ok || req.Header.Get("X-Access-Token") != token || !strings.Contains(string(req.Body), `"context_id":null`) {
		t.Errorf("LastRequest = %+v, %v", req, ok)
	}
}

func TestExecuteRequestErrors(t *testing.T) {
	e := newEnv(t)
	e.srv.SetLazyKernels(true) // nothing here reaches a kernel
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":300}`)["sandboxID"].(string)
	tests := []struct {
		name       string
		port       int
		method     string
		path, body string
		wantStatus int
		wantBody   string
		wantCT     string
	}{
		{"both context and language", 49999, "POST", "/execute", `{"code":"1","context_id":"c","language":"python"}`, 400,
			"Only one of context_id or language can be provided", "text/plain; charset=utf-8"},
		{"unknown context", 49999, "POST", "/execute", `{"code":"1","context_id":"nope"}`, 404, "Context nope not found", "text/plain; charset=utf-8"},
		{"missing code", 49999, "POST", "/execute", `{}`, 422, "", "application/json"},
		{"jupyter health", 49999, "GET", "/health", "", 200, `"OK"`, "application/json"},
		{"envd health", 49983, "GET", "/health", "", 204, "", ""},
		{"closed port", 8080, "GET", "/", "", 502,
			`{"sandboxId":"` + id + `","message":"The sandbox is running but port is not open","port":8080,"code":502}`, "application/json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.data(id, tc.port, tc.method, tc.path, tc.body)
			if r.status != tc.wantStatus {
				t.Fatalf("status = %d %s; want %d", r.status, r.body, tc.wantStatus)
			}
			if tc.wantBody != "" && r.body != tc.wantBody {
				t.Errorf("body = %q; want %q", r.body, tc.wantBody)
			}
			if ct := r.header.Get("Content-Type"); ct != tc.wantCT {
				t.Errorf("Content-Type = %q; want %q", ct, tc.wantCT)
			}
		})
	}
	if r := e.data("inope", 49999, "GET", "/health", ""); r.status != 502 ||
		r.body != `{"sandboxId":"inope","message":"The sandbox was not found","code":502}` {
		t.Errorf("unknown sandbox: %d %s", r.status, r.body)
	}
}

func TestContexts(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":300}`)["sandboxID"].(string)
	r := e.data(id, 49999, "GET", "/contexts", "")
	var ctxs []struct{ ID, Language, Cwd string }
	if err := json.Unmarshal([]byte(r.body), &ctxs); err != nil || len(ctxs) != 2 || ctxs[0].Language != "python" || ctxs[1].Language != "javascript" {
		t.Fatalf("GET /contexts = %s (%v)", r.body, err)
	}
	if e.execute(id, `{"code":"x = 1"}`).status != 200 {
		t.Fatal("execute in the default context")
	}
	r = e.data(id, 49999, "POST", "/contexts", `{"language":"Python","cwd":"/tmp"}`)
	var c struct{ ID, Language, Cwd string }
	if err := json.Unmarshal([]byte(r.body), &c); err != nil || c.Language != "python" || c.Cwd != "/tmp" || len(c.ID) != 36 {
		t.Fatalf("POST /contexts = %d %s", r.status, r.body)
	}
	// A new context is a new kernel: the default context's x is not there.
	r = e.execute(id, `{"code":"x","context_id":"`+c.ID+`"}`)
	if !strings.Contains(r.body, `"name": "NameError"`) || !strings.Contains(r.body, `"execution_count": 1}`) {
		t.Errorf("execute in the new context = %s", r.body)
	}
	if r := e.execute(id, `{"code":"x","language":"python"}`); !strings.Contains(r.body, `"text": "1"`) {
		t.Errorf("execute by language = %s", r.body)
	}
	if r := e.data(id, 49999, "POST", "/contexts/"+c.ID+"/restart", ""); r.status != 200 || r.body != "null" {
		t.Errorf("restart = %d %s", r.status, r.body)
	}
	if r := e.execute(id, `{"code":"1","context_id":"`+c.ID+`"}`); !strings.Contains(r.body, `"execution_count": 1}`) {
		t.Errorf("after restart = %s", r.body)
	}
	if r := e.data(id, 49999, "DELETE", "/contexts/"+c.ID, ""); r.status != 200 || r.body != "null" {
		t.Errorf("delete = %d %s", r.status, r.body)
	}
	if r := e.data(id, 49999, "DELETE", "/contexts/"+c.ID, ""); r.status != 404 || r.body != "Context "+c.ID+" not found" {
		t.Errorf("second delete = %d %s", r.status, r.body)
	}
	if e.exec.Live() != 1 {
		t.Errorf("exec live = %d; want 1 (deleted contexts free their kernels)", e.exec.Live())
	}
}

func TestEnvVars(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"envVars":{"SB":"s"}}`)["sandboxID"].(string)
	r := e.execute(id, `{"code":"import os; os.environ.get('SB'), os.environ.get('RUN')","env_vars":{"RUN":"r"}}`)
	if !strings.Contains(r.body, `"text": "('s', 'r')"`) {
		t.Errorf("env vars = %s", r.body)
	}
}

func TestRoutingByHost(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":300}`)["sandboxID"].(string)
	r := e.do("POST", "https://49999-"+id+"."+e2btest.Domain+"/execute", `{"code":"6*7"}`)
	if r.status != 200 || !strings.Contains(r.body, `"text": "42"`) {
		t.Errorf("execute by host = %d %s", r.status, r.body)
	}
	if r := e.do("GET", "https://49983-"+id+".e2b.app/health", ""); r.status != 204 {
		t.Errorf("envd health by host = %d", r.status)
	}
	req, _ := e.srv.LastRequest("49999 POST /execute")
	if req.Host != "49999-"+id+"."+e2btest.Domain {
		t.Errorf("Host = %q", req.Host)
	}
}

func TestTrafficToken(t *testing.T) {
	e := newEnv(t)
	e.srv.SetLazyKernels(true) // nothing here reaches a kernel
	sb := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"network":{"allowPublicTraffic":false}}`)
	id, tok := sb["sandboxID"].(string), sb["trafficAccessToken"].(string)
	if tok == "" {
		t.Fatal("no trafficAccessToken")
	}
	tests := []struct {
		name       string
		hdr        []string
		wantStatus int
		wantMsg    string
	}{
		{"missing", nil, 403, "Token header 'e2b-traffic-access-token' is missing"},
		{"wrong", []string{"E2B-Traffic-Access-Token", "x"}, 403, "Provided token in header 'e2b-traffic-access-token' is invalid"},
		{"right", []string{"E2B-Traffic-Access-Token", tok}, 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.data(id, e2btest.JupyterPort, "GET", "/health", "", tc.hdr...)
			if r.status != tc.wantStatus || !strings.Contains(r.body, tc.wantMsg) {
				t.Errorf("= %d %s; want %d %q", r.status, r.body, tc.wantStatus, tc.wantMsg)
			}
		})
	}
	if r := e.data(id, 49983, "GET", "/health", ""); r.status != 204 {
		t.Errorf("envd does not need the traffic token: %d", r.status)
	}
}

func TestKeepaliveAndDelay(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":300}`)["sandboxID"].(string)
	e.srv.SetKeepaliveInterval(10 * time.Millisecond)
	e.srv.SetExecDelay(100 * time.Millisecond)
	r := e.execute(id, `{"code":"1"}`)
	got := lines(t, r.body)
	if got[0] != `{"type": "keepalive"}` || got[len(got)-1] != `{"type": "end_of_execution"}` {
		t.Errorf("stream = %s", r.body)
	}
}

func TestStreamFaults(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":300}`)["sandboxID"].(string)

	e.srv.CutNextStreams(1, 2, false)
	if r := e.execute(id, `{"code":"print(1)\n2"}`); len(lines(t, r.body)) != 2 || strings.Contains(r.body, "end_of_execution") {
		t.Errorf("cut after 2 lines = %q", r.body)
	}

	e.srv.CutNextStreams(1, 1, true)
	req, _ := http.NewRequest("POST", e.srv.SandboxURL()+"/execute", strings.NewReader(`{"code":"print(1)"}`))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Line 0 arrives whole, line 1 (the stdout chunk) half, then the connection breaks.
	first, rest, _ := bytes.Cut(b, []byte("\n"))
	if err == nil || !bytes.HasPrefix(first, []byte(`{"type": "number_of_executions"`)) ||
		!bytes.HasPrefix(rest, []byte(`{"type": "std`)) || bytes.Contains(rest, []byte("\n")) {
		t.Errorf("mid-line drop: body %q, err %v; want one line, half a line and a read error", b, err)
	}

	e.srv.FailNextExecutions(1, 502)
	if r := e.execute(id, `{"code":"1"}`); r.status != 502 || !strings.Contains(r.body, "The sandbox was not found") {
		t.Errorf("failed execution = %d %s", r.status, r.body)
	}
	if r := e.execute(id, `{"code":"1"}`); r.status != 200 || !strings.Contains(r.body, "end_of_execution") {
		t.Errorf("execution after the faults = %d %s", r.status, r.body)
	}
}

func TestCreateFaults(t *testing.T) {
	e := newEnv(t)
	e.srv.SetLazyKernels(true) // control plane only
	e.srv.FailNextCreates(2, 429, 3*time.Second)
	for i := range 2 {
		r := e.api("POST", "/sandboxes", `{"templateID":"base","timeout":10}`)
		if r.status != 429 || r.header.Get("Retry-After") != "3" || r.body != `{"code":429,"message":"Rate limit exceeded"}` {
			t.Errorf("create %d = %d %q %s", i, r.status, r.header.Get("Retry-After"), r.body)
		}
	}
	if r := e.api("POST", "/sandboxes", `{"templateID":"base","timeout":10}`); r.status != 201 {
		t.Errorf("third create = %d", r.status)
	}
	e.srv.SetMaxConcurrent(1)
	if r := e.api("POST", "/sandboxes", `{"templateID":"base","timeout":10}`); r.status != 429 || !strings.Contains(r.body, "maximum number of concurrent E2B sandboxes (1)") {
		t.Errorf("over the cap = %d %s", r.status, r.body)
	}
}

// TestClientDisconnectInterrupts shows that a client going away interrupts the running cell: the
// next execution in the same context runs at once.
func TestClientDisconnectInterrupts(t *testing.T) {
	e := newEnv(t)
	id := e.create(`{"templateID":"code-interpreter-v1","timeout":300}`)["sandboxID"].(string)
	e.srv.SetKeepaliveInterval(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.SandboxURL()+"/execute",
		strings.NewReader(`{"code":"import time\nprint('start', flush=True)\ntime.sleep(60)"}`))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading: %v", err)
		}
		if strings.Contains(line, `"start\n"`) {
			break
		}
	}
	cancel()
	resp.Body.Close()

	done := make(chan response, 1)
	go func() {
		done <- e.execute(id, `{"code":"'after'"}`)
	}()
	select {
	case r := <-done:
		if !strings.Contains(r.body, `"text": "after"`) {
			t.Errorf("next execution = %s", r.body)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the interrupted cell still holds the context")
	}
}

func TestCloseDeletesEverything(t *testing.T) {
	exec := sandboxes.Provider(t)
	srv := e2btest.New(exec)
	e := &env{t: t, srv: srv, exec: exec, http: srv.Client()}
	e.create(`{"templateID":"code-interpreter-v1","timeout":300}`)
	e.create(`{"templateID":"code-interpreter-v1","timeout":300}`)
	if exec.Live() != 2 {
		t.Fatalf("exec live = %d", exec.Live())
	}
	srv.Close()
	if exec.Live() != 0 {
		t.Errorf("exec live after Close = %d", exec.Live())
	}
}

func TestFiles(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"secure":true}`)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	auth := []string{"X-Access-Token", token}
	if r := e.execute(id, `{"code":"import os; os.getcwd()"}`); !strings.Contains(r.body, `"execution_count": 1}`) {
		t.Fatalf("first run = %s", r.body)
	}

	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, _ := mw.CreateFormFile("file", "ignored.txt")
	_, _ = fw.Write([]byte("a,b\n1,2\n"))
	_ = mw.Close()
	r := e.data(id, e2btest.EnvdPort, "POST", "/files?path=data/in.csv", form.String(), append([]string{"Content-Type", mw.FormDataContentType()}, auth...)...)
	var entries []struct{ Path, Name, Type string }
	if err := json.Unmarshal([]byte(r.body), &entries); r.status != 200 || err != nil || len(entries) != 1 ||
		entries[0].Name != "in.csv" || entries[0].Type != "file" || !strings.HasSuffix(entries[0].Path, "/data/in.csv") {
		t.Fatalf("multipart upload = %d %s", r.status, r.body)
	}
	if r := e.data(id, e2btest.EnvdPort, "POST", "/files?path=/tmp/raw.bin", "\x00\x01raw", append([]string{"Content-Type", "application/octet-stream"}, auth...)...); r.status != 200 {
		t.Fatalf("octet-stream upload = %d %s", r.status, r.body)
	}

	// The kernel sees the files, and the hidden helper runs do not show in execution_count.
	r = e.execute(id, `{"code":"open('data/in.csv').read(), open('/tmp/raw.bin','rb').read()"}`)
	if !strings.Contains(r.body, `"execution_count": 2}`) || !strings.Contains(r.body, `"text": "('a,b\\n1,2\\n', b'\\x00\\x01raw')"`) {
		t.Errorf("kernel view = %s", r.body)
	}
	tests := []struct {
		name       string
		query      string
		hdr        []string
		wantStatus int
		wantBody   string
	}{
		{"download", "?path=data/in.csv", auth, 200, "a,b\n1,2\n"},
		{"binary", "?path=/tmp/raw.bin", auth, 200, "\x00\x01raw"},
		{"missing", "?path=/nope", auth, 404, `{"code":404,"message":"path '/nope' does not exist"}`},
		{"directory", "?path=/tmp", auth, 400, `{"code":400,"message":"path '/tmp' is a directory"}`},
		{"no token", "?path=data/in.csv", nil, 401, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.data(id, e2btest.EnvdPort, "GET", "/files"+tc.query, "", tc.hdr...)
			if r.status != tc.wantStatus || (tc.wantBody != "" && r.body != tc.wantBody) {
				t.Errorf("= %d %q; want %d %q", r.status, r.body, tc.wantStatus, tc.wantBody)
			}
		})
	}
	if r := e.data(id, e2btest.EnvdPort, "GET", "/files?path=data/in.csv", "", auth...); r.header.Get("Content-Disposition") != `inline; filename=in.csv` {
		t.Errorf("Content-Disposition = %q", r.header.Get("Content-Disposition"))
	}
}

// TestOfficialSDK runs e2b's own JavaScript SDK against the emulator (testdata/sdk_check.cjs). It
// needs node and the packages that test/node pins (scripts/deps.sh installs them); make test sets
// CIPROXY_CLIENT_TESTS=1, which makes their absence a failure. E2B_SDK_DIR points elsewhere.
func TestOfficialSDK(t *testing.T) {
	required := os.Getenv("CIPROXY_CLIENT_TESTS") == "1"
	dir := os.Getenv("E2B_SDK_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "test", "node")
	}
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "@e2b", "code-interpreter"))
	}
	if err != nil {
		if required {
			t.Fatalf("the official e2b SDK is needed (run scripts/deps.sh): %v", err)
		}
		t.Skipf("the official e2b SDK is not installed (run scripts/deps.sh): %v", err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	script, err := filepath.Abs("testdata/sdk_check.cjs")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(),
		"NODE_PATH="+filepath.Join(dir, "node_modules"),
		"E2B_API_URL="+e.srv.URL(),
		"E2B_SANDBOX_URL="+e.srv.SandboxURL(),
		"E2B_API_KEY="+e.srv.APIKey(),
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sdk_check: %v\n%s\n%s", err, out, stderr.String())
	}
	t.Logf("sdk_check: %s\n%s", out, stderr.String())
	if e.srv.Live() != 0 {
		t.Errorf("Live = %d after the SDK killed its sandbox", e.srv.Live())
	}
	if req, ok := e.srv.LastRequest("POST /v2/sandboxes"); !ok || !strings.HasPrefix(req.Header.Get("User-Agent"), "e2b-js-sdk/") {
		t.Errorf("the SDK's create was not seen on /v2/sandboxes: %+v", req)
	}
}
