package opensandboxtest_test

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox/opensandboxtest"
)

type answer struct {
	status int
	header http.Header
	body   string
}

func call(t *testing.T, method, url, body string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

const createBody = `{"image":{"uri":"img"},"entrypoint":["/e"],"resourceLimits":{"cpu":"1","memory":"2Gi"},"timeout":600,"env":{"EXECD_ACCESS_TOKEN":"tok"},"metadata":{"k":"v"}}`

// TestLifecycleWire checks the lifecycle API's answers as the server gives them: auth, FastAPI's
// 422 shapes, the label check, 202 on create with the keys in order, 404s, renew and delete.
func TestLifecycleWire(t *testing.T) {
	srv := opensandboxtest.New(sandboxes.Provider(t))
	defer srv.Close()
	key := []string{"OPEN-SANDBOX-API-KEY", srv.APIKey()}
	base := srv.URL()
	for _, c := range []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		want                     string // a gjson path=value, or a body prefix
	}{
		{"no key", "GET", "/sandboxes", "", nil, 401, "code=MISSING_API_KEY"},
		{"wrong key", "GET", "/sandboxes", "", []string{"OPEN-SANDBOX-API-KEY", "x"}, 401, "code=INVALID_API_KEY"},
		{"health needs none", "GET", "/health", "", nil, 200, "status=healthy"},
		{"short timeout", "POST", "/sandboxes", strings.Replace(createBody, "600", "30", 1), key, 422, "detail.0.type=greater_than_equal"},
		{"no entrypoint", "POST", "/sandboxes", strings.Replace(createBody, `"entrypoint":["/e"],`, "", 1), key, 422, "detail.0.msg=Value error, Entrypoint is required when image is provided."},
		{"no resources", "POST", "/sandboxes", strings.Replace(createBody, `"resourceLimits":{"cpu":"1","memory":"2Gi"},`, "", 1), key, 422, "detail.0.type=value_error"},
		{"bad label", "POST", "/sandboxes", strings.Replace(createBody, `"k":"v"`, `"k":"a b"`, 1), key, 400, "code=SANDBOX::INVALID_METADATA_LABEL"},
		{"unknown sandbox", "GET", "/sandboxes/nope", "", key, 404, "code=KUBERNETES::SANDBOX_NOT_FOUND"},
		{"bad metadata filter", "GET", "/sandboxes?metadata=novalue", "", key, 400, "code=SANDBOX::INVALID_METADATA_FORMAT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := call(t, c.method, base+c.path, c.body, c.headers...)
			path, val, _ := strings.Cut(c.want, "=")
			if a.status != c.status || gjson.Get(a.body, path).String() != val {
				t.Errorf("%d %s, want %d with %s", a.status, a.body, c.status, c.want)
			}
			if a.header.Get("X-Request-ID") == "" {
				t.Error("no X-Request-ID")
			}
		})
	}
	a := call(t, "POST", base+"/sandboxes", createBody, key...)
	if a.status != 202 || !strings.HasPrefix(a.body, `{"id":"`) || !strings.Contains(a.body, `"status":{"state":"Running"`) {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	id := gjson.Get(a.body, "id").String()
	ep := call(t, "GET", base+"/sandboxes/"+id+"/endpoints/44772", "", key...)
	if gjson.Get(ep.body, "endpoint").String() == "" || strings.Contains(gjson.Get(ep.body, "endpoint").String(), "://") ||
		gjson.Get(ep.body, "headers.OpenSandbox-Ingress-To").String() != id+"-44772" {
		t.Errorf("endpoint %s", ep.body)
	}
	execd := "http://" + gjson.Get(ep.body, "endpoint").String()
	route := []string{"OpenSandbox-Ingress-To", id + "-44772"}
	if a := call(t, "GET", execd+"/ping", "", route...); a.status != 401 || gjson.Get(a.body, "error").String() == "" {
		t.Errorf("ping without the execd token: %d %s", a.status, a.body)
	}
	if a := call(t, "GET", execd+"/ping", "", "OpenSandbox-Ingress-To", "nope-44772"); a.status != 404 || a.body != "OpenSandbox Ingress: sandbox not found\n" {
		t.Errorf("ping of an unknown sandbox: %d %q", a.status, a.body)
	}
	auth := append(route, "X-EXECD-ACCESS-TOKEN", "tok")
	if a := call(t, "GET", execd+"/ping", "", auth...); a.status != 200 {
		t.Errorf("ping: %d", a.status)
	}
	ctxA := call(t, "POST", execd+"/code/context", `{"language":"python"}`, auth...)
	ctxID := gjson.Get(ctxA.body, "id").String()
	if len(ctxID) != 32 {
		t.Fatalf("context: %s", ctxA.body)
	}
	if a := call(t, "POST", execd+"/code", `{"code":"1","context":{"id":"nope","language":"python"}}`, auth...); a.status != 500 || gjson.Get(a.body, "message").String() != "error running codes context not found" {
		t.Errorf("unknown context: %d %s", a.status, a.body)
	}
	if a := call(t, "POST", execd+"/code", `{"context":{"id":"`+ctxID+`","language":"python"}}`, auth...); a.status != 400 || gjson.Get(a.body, "code").String() != "INVALID_REQUEST_BODY" {
		t.Errorf("no code: %d %s", a.status, a.body)
	}

	// The stream: bare JSON objects, each followed by a blank line, no "data:".
	req, _ := http.NewRequestWithContext(t.Context(), "POST", execd+"/code", strings.NewReader(`{"code":"print('a<b')\n1/0","context":{"id":"`+ctxID+`","language":"python"}}`))
	for i := 0; i+1 < len(auth); i += 2 {
		req.Header.Set(auth[i], auth[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Accel-Buffering") != "no" {
		t.Errorf("stream headers %v", resp.Header)
	}
	var types []string
	sc := bufio.NewScanner(resp.Body)
	for expectBlank := false; sc.Scan(); expectBlank = !expectBlank {
		line := sc.Text()
		if expectBlank {
			if line != "" {
				t.Fatalf("an event not followed by a blank line: %q", line)
			}
			continue
		}
		if !strings.HasPrefix(line, "{") || !gjson.Valid(line) {
			t.Fatalf("not a bare JSON object: %q", line)
		}
		ev := gjson.Parse(line)
		types = append(types, ev.Get("type").String())
		if ev.Get("type").String() == "stdout" && !strings.Contains(line, `a\u003cb`) {
			t.Errorf("stdout not HTML-escaped as Go writes it: %s", line)
		}
		if ev.Get("type").String() == "error" && !ev.Get("error.traceback").IsArray() {
			t.Errorf("traceback not a list: %s", line)
		}
		if ev.Get("type").String() == "execution_complete" {
			break
		}
	}
	if got := strings.Join(types, " "); got != "init ping stdout status error execution_complete" {
		t.Errorf("events %q", got)
	}
	resp.Body.Close()

	if a := call(t, "POST", base+"/sandboxes/"+id+"/renew-expiration", `{"expiresAt":"2000-01-01T00:00:00Z"}`, key...); a.status != 400 || gjson.Get(a.body, "code").String() != "DOCKER::INVALID_EXPIRATION" {
		t.Errorf("renew into the past: %d %s", a.status, a.body)
	}
	if a := call(t, "DELETE", base+"/sandboxes/"+id, "", key...); a.status != 204 || a.body != "" {
		t.Errorf("delete: %d %q", a.status, a.body)
	}
	if a := call(t, "DELETE", base+"/sandboxes/"+id, "", key...); a.status != 404 {
		t.Errorf("second delete: %d", a.status)
	}
	if srv.Live() != 0 {
		t.Error("a sandbox left")
	}
}
