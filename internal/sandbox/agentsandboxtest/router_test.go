package agentsandboxtest

import (
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"
)

func TestRouter(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool", Router: true, RouterAuthz: "scoped-token"})
	_, sb, ip := readyClaim(t, s, client(t, s), newClaim("pool"))
	if err := writeFile(s.PodDataDir(sb)+"/hello.txt", "hi"); err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(s.FilesPort())
	ns := s.Namespace()
	valid := s.MintScopedToken(ns, sb, time.Now().Add(time.Minute))
	tests := []struct {
		name    string
		headers map[string]string
		refuse  bool
		code    int
		body    string
	}{
		{"valid", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Namespace": ns, "X-Sandbox-Port": port, "Authorization": "Bearer " + valid}, false, 200, "hi"},
		{"no id", map[string]string{"Authorization": "Bearer " + valid}, false, 400, `{"detail":"X-Sandbox-ID header is required."}` + "\n"},
		{"bad id", map[string]string{"X-Sandbox-ID": "Bad_ID"}, false, 400, `{"detail":"Invalid sandbox ID format."}` + "\n"},
		{"bad namespace", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Namespace": "a.b"}, false, 400, `{"detail":"Invalid namespace format."}` + "\n"},
		{"bad port", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": "http"}, false, 400, `{"detail":"Invalid port format."}` + "\n"},
		{"no token", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": port}, false, 401, `{"detail":"unauthenticated"}` + "\n"},
		{"wrong sandbox", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": port, "Authorization": "Bearer " + s.MintScopedToken(ns, "other", time.Now().Add(time.Minute))}, false, 403, `{"detail":"forbidden"}` + "\n"},
		{"wrong namespace", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": port, "Authorization": "Bearer " + s.MintScopedToken("elsewhere", sb, time.Now().Add(time.Minute))}, false, 403, `{"detail":"forbidden"}` + "\n"},
		{"expired", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": port, "Authorization": "Bearer " + s.MintScopedToken(ns, sb, time.Now())}, false, 401, `{"detail":"unauthenticated"}` + "\n"},
		{"forged", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": port, "Authorization": "Bearer " + valid + "x"}, false, 401, `{"detail":"unauthenticated"}` + "\n"},
		{"pod ip header refused", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": port, "X-Sandbox-Pod-IP": ip, "Authorization": "Bearer " + valid}, false, 403, `{"detail":"forbidden"}` + "\n"},
		{"refused", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": port, "Authorization": "Bearer " + valid}, true, 401, `{"detail":"unauthenticated"}` + "\n"},
		{"unknown sandbox", map[string]string{"X-Sandbox-ID": "nope", "X-Sandbox-Port": port, "Authorization": "Bearer " + s.MintScopedToken(ns, "nope", time.Now().Add(time.Minute))}, false, 502, `{"detail":"Could not connect to the backend sandbox: nope"}` + "\n"},
		{"closed port", map[string]string{"X-Sandbox-ID": sb, "X-Sandbox-Port": "1", "Authorization": "Bearer " + valid}, false, 502, `{"detail":"Could not connect to the backend sandbox: ` + sb + `"}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.RefuseRouterTokens(tc.refuse)
			req, _ := http.NewRequest("GET", s.RouterURL()+"/v1/files/hello.txt", nil)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code || string(b) != tc.body {
				t.Errorf("= %d %q; want %d %q", resp.StatusCode, b, tc.code, tc.body)
			}
		})
	}
	s.RefuseRouterTokens(false)
	resp, err := http.Get(s.RouterURL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != `{"status":"ok"}`+"\n" {
		t.Errorf("healthz %q", b)
	}
}

func TestRouterAllowAll(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool", Router: true})
	_, sb, ip := readyClaim(t, s, client(t, s), newClaim("pool"))
	for _, h := range []map[string]string{{"X-Sandbox-ID": sb}, {"X-Sandbox-ID": sb, "X-Sandbox-Pod-IP": ip}} {
		req, _ := http.NewRequest("GET", s.RouterURL()+"/v1/health", nil)
		req.Header.Set("X-Sandbox-Namespace", s.Namespace())
		req.Header.Set("X-Sandbox-Port", strconv.Itoa(s.FilesPort()))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%v = %d", h, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest("GET", s.RouterURL()+"/v1/health", nil)
	req.Header.Set("X-Sandbox-ID", sb)
	req.Header.Set("X-Sandbox-Pod-IP", "10.0.0.1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("unknown pod IP = %d; want 400", resp.StatusCode)
	}
}
