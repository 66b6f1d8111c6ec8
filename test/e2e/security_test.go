package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestMasterKey: with master_key set, every API route (with and without /v1) and /metrics refuse
// a request without the key or with a wrong one, before anything reaches the upstream; the key
// (as a bearer token or x-api-key) is let through. /healthz and /readyz stay open.
func TestMasterKey(t *testing.T) {
	t.Parallel()
	const master = "sk-master-route-check"
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	p := startProxy(t, setup{Upstream: up.URL(), MasterKey: master}.yaml())

	body := []byte(`{"model":"` + clientModel + `","input":"hi","messages":[{"role":"user","content":"hi"}],"prompt":"hi"}`)
	// The scripted upstream refuses Responses fields on chat completions, as OpenAI does.
	chatBody := []byte(`{"model":"` + clientModel + `","messages":[{"role":"user","content":"hi"}]}`)
	routes := []struct {
		method, path string
		body         []byte
		wantOK       bool // with the key: 200 (else: anything but 401)
	}{
		{"POST", "/responses", body, true},
		{"GET", "/responses/resp_123", nil, false},
		{"DELETE", "/responses/resp_123", nil, false},
		{"GET", "/responses/resp_123/input_items", nil, false},
		{"POST", "/responses/resp_123/cancel", nil, false},
		{"POST", "/chat/completions", chatBody, true},
		{"POST", "/completions", body, false},
		{"POST", "/embeddings", body, false},
		{"GET", "/models", nil, true},
		{"GET", "/models/" + clientModel, nil, true},
		{"GET", "/no/such/route", nil, false},
	}
	for _, prefix := range []string{"/v1", ""} {
		for _, rt := range routes {
			if prefix == "" && rt.path == "/no/such/route" {
				continue // an unknown path outside /v1 is a plain 404, key or not
			}
			t.Run(rt.method+" "+prefix+rt.path, func(t *testing.T) {
				url := p.URL + prefix + rt.path
				before := len(up.Requests())
				for name, hdr := range map[string][]string{
					"no key":           nil,
					"wrong key":        {"Authorization: Bearer sk-wrong"},
					"key as prefix":    {"Authorization: Bearer " + master + "x"},
					"basic scheme":     {"Authorization: Basic " + master},
					"wrong x-api-key":  {"x-api-key: sk-wrong"},
					"empty bearer":     {"Authorization: Bearer "},
					"key in the query": nil,
				} {
					u := url
					if name == "key in the query" {
						u += "?api_key=" + master + "&key=" + master
					}
					resp := do(t, rt.method, u, rt.body, hdr...)
					if resp.Status != http.StatusUnauthorized {
						t.Errorf("%s: status %d, want 401: %.200s", name, resp.Status, resp.Body)
						continue
					}
					if typ, _, _ := apiError(t, resp.Body); typ != "invalid_request_error" && typ != "authentication_error" {
						t.Errorf("%s: error type %q", name, typ)
					}
				}
				if n := len(up.Requests()); n != before {
					t.Errorf("refused requests reached the upstream (%d requests)", n-before)
				}
				for _, hdr := range []string{"Authorization: Bearer " + master, "x-api-key: " + master} {
					resp := do(t, rt.method, url, rt.body, hdr)
					if resp.Status == http.StatusUnauthorized || (rt.wantOK && resp.Status != http.StatusOK) {
						t.Errorf("with %q: status %d: %.200s", strings.SplitN(hdr, ":", 2)[0], resp.Status, resp.Body)
					}
				}
			})
		}
	}
	t.Run("metrics", func(t *testing.T) {
		for _, hdr := range [][]string{nil, {"Authorization: Bearer sk-wrong"}} {
			if resp := do(t, "GET", p.URL+"/metrics", nil, hdr...); resp.Status != http.StatusUnauthorized {
				t.Errorf("/metrics with %v: status %d, want 401", hdr, resp.Status)
			}
		}
		resp := do(t, "GET", p.URL+"/metrics", nil, "Authorization: Bearer "+master)
		if resp.Status != http.StatusOK || !bytes.Contains(resp.Body, []byte("go_goroutines")) {
			t.Errorf("/metrics with the key: status %d: %.200s", resp.Status, resp.Body)
		}
	})
	t.Run("health", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz"} {
			if resp := do(t, "GET", p.URL+path, nil); resp.Status != http.StatusOK {
				t.Errorf("%s without a key: status %d, want 200", path, resp.Status)
			}
		}
	})
}

// secret returns a distinctive random secret with a prefix.
func secret(prefix string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// leakProbe is Python that prints everything in the sandbox a secret could hide in: the
// environment, its own and PID 1's /proc environ, every readable /proc/*/environ and cmdline, and
// the files that could hold a configuration.
const leakProbe = `import os, glob
print("ENV", dict(os.environ))
for path in ["/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline", "/proc/1/cmdline"]:
    try:
        print(path, open(path, "rb").read())
    except Exception as e:
        print(path, "unreadable", type(e).__name__)
readable = []
for path in sorted(glob.glob("/proc/*/environ")) + sorted(glob.glob("/proc/*/cmdline")):
    try:
        data = open(path, "rb").read()
        readable.append(path)
        print(path, data)
    except Exception as e:
        print(path, "unreadable", type(e).__name__)
print("READABLE", readable)
for root in ["/mnt/data", "/tmp", "/etc"]:
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                print(p, open(p, "rb").read(65536))
            except Exception as e:
                pass
print("PROBE-END")
`

// TestNoSecretLeaks runs a full intercepted exchange, streamed and not, plus error paths (a
// sandbox create the engine refuses among them), with a distinctive upstream key and master key
// and the engine's API key (the e2b, Daytona or OpenSandbox lifecycle key; all given to the proxy
// through its environment, as os.environ/ references), and then looks for each secret in the
// proxy's whole log, in every response body a client saw, in everything the sandbox could read,
// and in what the upstream received; the engine must have received no proxy secret. For every
// sandbox tool; the local tool's run configures an e2b tool beside it, whose key must not reach a
// local sandbox either.
func TestNoSecretLeaks(t *testing.T) {
	t.Parallel()
	for _, tool := range sandboxTools {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			upstreamKey := secret("sk-upstream-secret-")
			masterKey := secret("sk-master-secret-")
			up := upstreamtest.New(t, upstreamtest.WithAPIKey(upstreamKey))
			up.Script(func(req upstreamtest.Request) upstreamtest.Turn {
				switch lastUserText(req) {
				case "upstream error":
					return upstreamtest.Turn{Error: upstreamtest.APIError(http.StatusBadRequest, "invalid_value", "scripted failure", "input")}
				case "upstream 500":
					return upstreamtest.Turn{Error: upstreamtest.APIError(http.StatusInternalServerError, "", "scripted server error", "")}
				}
				return runUserCode(req)
			})
			eng := newEngine(t, tool)
			if eng == nil {
				eng = newEngine(t, "e2b")
			}
			engineKey := eng.Key()
			// A second model whose upstream is a closed port: connection errors.
			dead := httptest.NewServer(http.NotFoundHandler())
			deadURL := dead.URL
			dead.Close()
			wd := workDir(t)
			s := setup{
				WorkDir: wd, Upstream: up.URL(), UpstreamKey: "os.environ/E2E_UPSTREAM_KEY", MasterKey: "os.environ/E2E_MASTER_KEY", Tool: tool,
				ExtraModels: "  - model_name: dead\n    litellm_params:\n      model: openai/dead\n      api_base: " + deadURL + "/v1\n      api_key: os.environ/E2E_UPSTREAM_KEY\n",
			}
			env := append(eng.Configure(&s), "E2E_UPSTREAM_KEY="+upstreamKey, "E2E_MASTER_KEY="+masterKey)
			p := startProxy(t, s.yaml(), env...)

			auth := "Authorization: Bearer " + masterKey
			var seen bytes.Buffer // every body a client received
			send := func(method, path string, body string, wantStatus int, hdr ...string) []byte {
				t.Helper()
				var b []byte
				if body != "" {
					b = []byte(body)
				}
				resp := do(t, method, p.URL+path, b, hdr...)
				seen.Write(resp.Body)
				for k, vs := range resp.Header {
					fmt.Fprintf(&seen, "%s: %s\n", k, strings.Join(vs, ","))
				}
				if wantStatus != 0 && resp.Status != wantStatus {
					t.Errorf("%s %s (%.60s): status %d, want %d: %.300s", method, path, body, resp.Status, wantStatus, resp.Body)
				}
				return resp.Body
			}
			ci := func(code string, stream bool) string {
				b, _ := json.Marshal(map[string]any{
					"model": clientModel, "input": code, "stream": stream,
					"tools":   []any{map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}},
					"include": []string{"code_interpreter_call.outputs"},
				})
				return string(b)
			}

			// The exchange, with the probe as the model's code.
			probe := send("POST", "/v1/responses", ci(leakProbe, false), http.StatusOK, auth)
			if !bytes.Contains(probe, []byte("PROBE-END")) || !bytes.Contains(probe, []byte("/proc/self/environ")) || !bytes.Contains(probe, []byte("ENV {")) {
				t.Fatalf("the probe did not run to its end: %.1000s", probe)
			}
			streamed := send("POST", "/v1/responses", ci(leakProbe, true), http.StatusOK, auth)
			if !bytes.Contains(streamed, []byte("PROBE-END")) {
				t.Errorf("the streamed probe did not run to its end: %.500s", streamed)
			}
			// The sandbox cannot reach the proxy (which holds the keys), the upstream or the engine.
			var net strings.Builder
			net.WriteString("import socket\n")
			for _, u := range []string{p.URL, up.URL(), eng.URL()} {
				pu, err := url.Parse(u)
				if err != nil {
					t.Fatal(err)
				}
				hostPort := pu.Host
				host, port, _ := strings.Cut(hostPort, ":")
				fmt.Fprintf(&net, "try:\n    socket.create_connection((%q, %s), timeout=3).close()\n    print('NET %s reachable')\n"+
					"except Exception as e:\n    print('NET %s blocked', type(e).__name__)\n", host, port, hostPort, hostPort)
			}
			upBefore := len(up.Requests())
			netOut := send("POST", "/v1/responses", ci(net.String(), false), http.StatusOK, auth)
			if bytes.Contains(netOut, []byte(`reachable\n`)) || bytes.Count(netOut, []byte(" blocked")) < 3 {
				t.Errorf("the sandbox's network view: %.1500s", netOut)
			}
			if n := len(up.Requests()) - upBefore; n != 2 {
				t.Errorf("%d upstream requests for one code call, want 2", n)
			}
			send("POST", "/v1/responses", ci("raise RuntimeError('boom')", false), http.StatusOK, auth)
			send("POST", "/v1/responses", `{"model":"`+clientModel+`","input":"hi"}`, http.StatusOK, auth)
			send("POST", "/v1/chat/completions", `{"model":"`+clientModel+`","messages":[{"role":"user","content":"hi"}]}`, http.StatusOK, auth)

			// Error paths.
			send("POST", "/v1/responses", ci("print(1)", false), http.StatusUnauthorized, "Authorization: Bearer sk-wrong")
			send("POST", "/v1/responses", ci("print(1)", false), http.StatusUnauthorized)
			send("POST", "/v1/responses", ci("upstream error", false), http.StatusBadRequest, auth)
			send("POST", "/v1/responses", ci("upstream error", true), 0, auth)
			send("POST", "/v1/responses", ci("upstream 500", false), 0, auth)
			send("POST", "/v1/responses", `{"model":"dead","input":"hi"}`, http.StatusBadGateway, auth)
			send("POST", "/v1/responses", strings.Replace(ci("print(1)", false), clientModel, "dead", 1), http.StatusBadGateway, auth)
			send("POST", "/v1/responses", strings.Replace(ci("print(1)", true), clientModel, "dead", 1), 0, auth)
			send("POST", "/v1/responses", `{"model":"no-such-model","input":"hi"}`, 0, auth)
			send("POST", "/v1/responses", `{"model":`, http.StatusBadRequest, auth)
			send("POST", "/v1/responses", ci("print(1)", false)[:40], http.StatusBadRequest, auth)
			send("POST", "/v1/responses", strings.Replace(ci("print(1)", false), `{"type":"auto"}`, `"cntr_forged"`, 1), http.StatusNotFound, auth)
			send("GET", "/v1/models", "", http.StatusOK, auth)
			send("GET", "/metrics", "", http.StatusOK, auth)
			if tool != "local" {
				// A sandbox the engine refuses to create: 502 sandbox_unavailable, no key in it.
				eng.FailNextCreates(3, http.StatusUnauthorized)
				body := send("POST", "/v1/responses", ci("print(1)", false), http.StatusBadGateway, auth)
				if _, code, _ := apiError(t, body); code != "sandbox_unavailable" {
					t.Errorf("failed sandbox create: code %q, want sandbox_unavailable", code)
				}
			}

			p.Stop()
			checkNoLeftovers(t, wd)
			// (Sandboxes left in the engine are TestNoE2BSandboxLeakWhenUpstreamFails's subject: the
			// fast upstream failures above can leave one, depending on timing.)
			log := p.Log()
			if !strings.Contains(log, `"msg":"listening"`) || !strings.Contains(log, "/v1/responses") {
				t.Fatalf("the log does not look like the proxy's (no access log): %.500s", log)
			}
			secrets := map[string]string{"upstream key": upstreamKey, "master key": masterKey, eng.Tool() + " key": engineKey}
			for name, s := range secrets {
				// The whole secret, and its random part alone (a secret shown masked or cut).
				needles := []string{s, s[len(s)-16:]}
				for _, n := range needles {
					if strings.Contains(log, n) {
						t.Errorf("the %s appears in the proxy's log", name)
					}
					if bytes.Contains(seen.Bytes(), []byte(n)) {
						t.Errorf("the %s appears in a response a client received (the sandbox's view included)", name)
					}
				}
			}
			// The upstream saw its own key and nothing of the others.
			for _, rq := range up.Requests() {
				if got := rq.Header.Get("Authorization"); got != "Bearer "+upstreamKey {
					t.Errorf("upstream request %d: Authorization %q, want the upstream key", rq.N, got)
				}
				all := mustJSON(rq.Header) + string(rq.Body)
				for _, s := range []string{masterKey, engineKey, masterKey[len(masterKey)-16:], engineKey[len(engineKey)-16:]} {
					if strings.Contains(all, s) {
						t.Errorf("upstream request %d carries a client or %s secret", rq.N, eng.Tool())
					}
				}
			}
			// What the engine received (its control plane, its data plane) holds the engine's key
			// where it belongs only: never the upstream or master key.
			received := eng.Received()
			if tool != "local" && len(received) == 0 {
				t.Errorf("the %s double never got a create or a run", tool)
			}
			for _, r := range received {
				for _, s := range []string{masterKey, upstreamKey, masterKey[len(masterKey)-16:], upstreamKey[len(upstreamKey)-16:]} {
					if strings.Contains(r.Text, s) {
						t.Errorf("the %s request %s carries a proxy secret", tool, r.Route)
					}
				}
				if r.InSandbox && strings.Contains(r.Text, engineKey[len(engineKey)-16:]) {
					t.Errorf("the %s request %s, served inside the sandbox, carries the %s key", tool, r.Route, tool)
				}
			}
			if tool != "local" && eng.Creates() == 0 {
				t.Errorf("the probe did not run in %s", tool)
			}
		})
	}
}

// TestHostileRequests: a body over the limit, deeply nested JSON, a huge input array and a
// slowloris client get clean answers (or a closed connection), and the proxy stays healthy.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(runUserCode)
	trimmer := newInputTrimmer(t, up.URL())
	p := startProxy(t, setup{Upstream: trimmer.URL + "/v1", MaxBody: "8m"}.yaml())

	t.Run("slowloris", func(t *testing.T) {
		t.Parallel()
		// Half the headers, then silence: the server's header timeout must close the connection.
		conn, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "POST /v1/responses HTTP/1.1\r\nHost: "+p.Addr+"\r\nContent-Type: application/json\r\n"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		got, err := io.ReadAll(conn)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the server kept a connection with half its headers open for 30s")
		}
		t.Logf("closed after %v (read %q, %v)", time.Since(start).Round(time.Millisecond), got, err)
		if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 408")) && !bytes.HasPrefix(got, []byte("HTTP/1.1 400")) {
			t.Errorf("answer to a half-sent request: %q", got)
		}
	})

	t.Run("oversize body", func(t *testing.T) {
		big := `{"model":"` + clientModel + `","input":"` + strings.Repeat("a", 9<<20) + `"}`
		resp := do(t, "POST", p.URL+"/v1/responses", []byte(big))
		if resp.Status != http.StatusRequestEntityTooLarge {
			t.Errorf("declared length over the limit: status %d, want 413: %.200s", resp.Status, resp.Body)
		}
		apiError(t, resp.Body)
		// Chunked, without a declared length: the limit holds while reading.
		req, _ := http.NewRequestWithContext(ctx(t, 30*time.Second), "POST", p.URL+"/v1/responses", io.MultiReader(strings.NewReader(big)))
		req.ContentLength = -1
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("chunked oversize body: %v", err)
		}
		b, _ := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if r.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked body over the limit: status %d, want 413: %.200s", r.StatusCode, b)
		}
		apiError(t, b)
	})

	t.Run("deeply nested JSON", func(t *testing.T) {
		for name, body := range map[string]string{
			"unclosed":              `{"model":"` + clientModel + `","input":` + strings.Repeat("[", 100000),
			"closed":                `{"model":"` + clientModel + `","input":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`,
			"objects":               `{"model":"` + clientModel + `","input":` + strings.Repeat(`{"a":`, 100000) + "1" + strings.Repeat("}", 100000) + `}`,
			"in tools, intercepted": `{"model":"` + clientModel + `","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"input":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`,
			"in the tool":           `{"model":"` + clientModel + `","input":"hi","tools":[{"type":"code_interpreter","container":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}]}`,
		} {
			resp := do(t, "POST", p.URL+"/v1/responses", []byte(body))
			switch {
			case resp.Status == http.StatusBadRequest:
				apiError(t, resp.Body)
			case name == "in the tool" && resp.Status == http.StatusOK:
				// Valid JSON; the proxy treats a container it does not understand as "auto".
			default:
				t.Errorf("%s: status %d, want 400: %.200s", name, resp.Status, resp.Body)
			}
			p.Alive(t)
		}
	})

	t.Run("huge input array", func(t *testing.T) {
		const items = 200000
		var b strings.Builder
		b.WriteString(`{"model":"` + clientModel + `","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"input":[`)
		for i := range items {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"role":"user","content":"x"}`)
		}
		b.WriteString(`]}`)
		if b.Len() >= 8<<20 {
			t.Fatalf("body is %d bytes, over the limit", b.Len())
		}
		before := len(up.Requests())
		resp := do(t, "POST", p.URL+"/v1/responses", []byte(b.String()))
		// The last user message "x" is the code the scripted model runs: a NameError, answered.
		if resp.Status != http.StatusOK {
			t.Errorf("status %d: %.300s", resp.Status, resp.Body)
		}
		if got := trimmer.maxItems.Load(); got < items {
			t.Errorf("the upstream got at most %d input items, want all %d", got, items)
		}
		if n := len(up.Requests()) - before; n < 2 {
			t.Errorf("%d upstream calls, want the code call and the answer", n)
		}
		p.Alive(t)
	})

	// After all of it, an ordinary request still works.
	t.Run("still serving", func(t *testing.T) {
		resp := do(t, "POST", p.URL+"/v1/responses", []byte(`{"model":"`+clientModel+`","input":"hi"}`))
		if resp.Status != http.StatusOK {
			t.Errorf("status %d: %.200s", resp.Status, resp.Body)
		}
	})
}

// TestClientCannotRedirect: nothing a client sends (body fields named like the proxy's settings,
// forwarding headers, a foreign Host) changes where the proxy connects: the configured upstream and
// e2b get the traffic, decoys get none.
func TestClientCannotRedirect(t *testing.T) {
	t.Parallel()
	var decoyHits atomic.Int64
	decoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		decoyHits.Add(1)
		http.Error(w, "decoy", http.StatusTeapot)
	}))
	defer decoy.Close()
	decoyHost := strings.TrimPrefix(decoy.URL, "http://")

	up := upstreamtest.New(t)
	up.Script(runUserCode)
	emu, _ := newEmulator(t)
	p := startProxy(t, setup{Upstream: up.URL(), Tool: "e2b", E2B: emu, E2BKey: emu.APIKey()}.yaml())

	over := map[string]any{
		"api_base": decoy.URL + "/v1", "base_url": decoy.URL + "/v1", "sandbox_url": decoy.URL,
		"api_key": "sk-decoy", "e2b_api_key": "e2b_decoy", "domain": decoyHost, "upstream": decoy.URL,
	}
	tool := map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}
	for k, v := range over {
		tool[k] = v
	}
	body := map[string]any{
		"model": clientModel, "input": "print('ran')", "tools": []any{tool},
		"include":        []string{"code_interpreter_call.outputs"},
		"metadata":       map[string]any{"api_base": decoy.URL, "sandbox_url": decoy.URL},
		"litellm_params": over, "extra_body": over,
	}
	for k, v := range over {
		body[k] = v
	}
	raw, _ := json.Marshal(body)
	headers := []string{
		"Host: " + decoyHost, "X-Forwarded-Host: " + decoyHost, "X-Forwarded-For: 127.0.0.1",
		"X-Forwarded-Proto: http", "Forwarded: for=127.0.0.1;host=" + decoyHost, "X-Original-URL: " + decoy.URL + "/v1/responses",
		"X-Rewrite-URL: " + decoy.URL, "E2b-Sandbox-Id: decoy", "X-Api-Base: " + decoy.URL, "OpenAI-Base-URL: " + decoy.URL,
	}
	for _, stream := range []bool{false, true} {
		b := raw
		if stream {
			b = bytes.Replace(raw, []byte(`{`), []byte(`{"stream":true,`), 1)
		}
		upBefore, execBefore := len(up.Requests()), emu.Executions()
		resp := do(t, "POST", p.URL+"/v1/responses", b, headers...)
		if resp.Status != http.StatusOK && resp.Status != http.StatusBadRequest {
			t.Errorf("stream=%v: status %d: %.300s", stream, resp.Status, resp.Body)
		}
		if len(up.Requests()) == upBefore {
			t.Errorf("stream=%v: the configured upstream got nothing", stream)
		}
		if resp.Status == http.StatusOK {
			if emu.Executions() == execBefore {
				t.Errorf("stream=%v: the code did not run in the configured e2b", stream)
			}
			if !bytes.Contains(resp.Body, []byte(`ran\n`)) {
				t.Errorf("stream=%v: no output from the code: %.300s", stream, resp.Body)
			}
		}
	}
	// Pass-through routes too.
	chat, _ := json.Marshal(map[string]any{"model": clientModel, "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "api_base": decoy.URL, "base_url": decoy.URL})
	if resp := do(t, "POST", p.URL+"/v1/chat/completions", chat, headers...); resp.Status != http.StatusOK {
		t.Errorf("chat completion: status %d: %.200s", resp.Status, resp.Body)
	}
	if resp := do(t, "POST", p.URL+"/v1/responses", []byte(`{"model":"`+clientModel+`","input":"hi","api_base":"`+decoy.URL+`"}`), headers...); resp.Status != http.StatusOK {
		t.Errorf("plain response: status %d: %.200s", resp.Status, resp.Body)
	}
	if n := decoyHits.Load(); n != 0 {
		t.Errorf("the decoy got %d requests: a client redirected the proxy", n)
	}
	for _, rq := range up.Requests() {
		if h := rq.Header.Get("X-Forwarded-Host"); h != "" {
			t.Logf("note: upstream request %d carries X-Forwarded-Host %q", rq.N, h)
		}
	}
}

// inputTrimmer stands between the proxy and the scripted upstream: it records how many input
// items each request carries and forwards it with only the last three, so that the scripted
// upstream (which decodes every item several times) stays fast under the race detector.
type inputTrimmer struct {
	*httptest.Server
	maxItems atomic.Int64
}

func newInputTrimmer(t *testing.T, upstream string) *inputTrimmer {
	tr := &inputTrimmer{}
	target := strings.TrimSuffix(upstream, "/v1")
	tr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if in := gjson.GetBytes(body, "input"); in.IsArray() {
			all := in.Array()
			if n := int64(len(all)); n > tr.maxItems.Load() {
				tr.maxItems.Store(n)
			}
			if len(all) > 3 {
				keep := "["
				for i, it := range all[len(all)-3:] {
					if i > 0 {
						keep += ","
					}
					keep += it.Raw
				}
				body, _ = sjson.SetRawBytes(body, "input", []byte(keep+"]"))
			}
		}
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		req.ContentLength = int64(len(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
				http.NewResponseController(w).Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(tr.Close)
	return tr
}
