package e2btest_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
)

// envelope frames one Connect message.
func envelope(flags byte, msg string) string {
	head := make([]byte, 5)
	head[0] = flags
	binary.BigEndian.PutUint32(head[1:], uint32(len(msg)))
	return string(head) + msg
}

// envelopes splits a Start stream into its messages; the last one's flags are returned too.
func envelopes(t *testing.T, body string) ([]string, byte) {
	t.Helper()
	var msgs []string
	var last byte
	for b := []byte(body); len(b) > 0; {
		if len(b) < 5 {
			t.Fatalf("a cut envelope header: %q", b)
		}
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 5+n {
			t.Fatalf("a cut envelope: %q", b)
		}
		last = b[0]
		msgs = append(msgs, string(b[5:5+n]))
		b = b[5+n:]
	}
	return msgs, last
}

func TestProcessService(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"secure":true}`)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	start := func(body string, hdr ...string) response {
		hdr = append([]string{"Content-Type", "application/connect+json", "Connect-Protocol-Version", "1", "X-Access-Token", token}, hdr...)
		return e.data(id, e2btest.EnvdPort, "POST", "/process.Process/Start", envelope(0, body), hdr...)
	}
	const run = `{"process":{"cmd":"/bin/bash","args":["-c",%s],"cwd":"/mnt/data"},"stdin":false}`
	q := func(s string) string { b, _ := json.Marshal(s); return strings.Replace(run, "%s", string(b), 1) }

	for _, tc := range []struct {
		name    string
		command string
		hdr     []string
		events  []string // in order; data events decoded
		end     string
	}{
		{name: "exit 0", command: "echo hi", events: []string{"start", "stdout:hi\n", `{"end":{"exited":true,"status":"exit status 0"}}`}, end: `{}`},
		{name: "exit 3 with stderr", command: "echo err >&2; exit 3", events: []string{"start", "stderr:err\n", `{"end":{"error":"exit status 3","exitCode":3,"exited":true,"status":"exit status 3"}}`}, end: `{}`},
		{name: "deadline", command: "echo part; sleep 30", hdr: []string{"Connect-Timeout-Ms", "500"}, events: []string{"start", "stdout:part\n"}, end: `{"error":{"code":"deadline_exceeded","message":"context deadline exceeded"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := start(q(tc.command), tc.hdr...)
			if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/connect+json" {
				t.Fatalf("Start = %d %s %q", r.status, r.header.Get("Content-Type"), r.body)
			}
			msgs, last := envelopes(t, r.body)
			if last != 2 || msgs[len(msgs)-1] != tc.end {
				t.Errorf("end of stream %#x %s; want 0x2 %s", last, msgs[len(msgs)-1], tc.end)
			}
			var got []string
			for _, m := range msgs[:len(msgs)-1] {
				var ev struct {
					Event map[string]json.RawMessage `json:"event"`
				}
				if err := json.Unmarshal([]byte(m), &ev); err != nil {
					t.Fatalf("%s: %v", m, err)
				}
				switch {
				case ev.Event["start"] != nil:
					got = append(got, "start")
				case ev.Event["data"] != nil:
					var d map[string]string
					json.Unmarshal(ev.Event["data"], &d)
					for k, v := range d {
						raw, err := base64.StdEncoding.DecodeString(v)
						if err != nil {
							t.Errorf("data %s is not base64: %v", v, err)
						}
						got = append(got, k+":"+string(raw))
					}
				default:
					b, _ := json.Marshal(ev.Event)
					got = append(got, string(b))
				}
			}
			if strings.Join(got, "|") != strings.Join(tc.events, "|") {
				t.Errorf("events %q; want %q", got, tc.events)
			}
		})
	}

	if r := start(q("true"), "X-Access-Token", "wrong"); r.status != http.StatusUnauthorized ||
		r.body != `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}` {
		t.Errorf("Start with a wrong token = %d %s", r.status, r.body)
	}
	if r := e.data(id, e2btest.EnvdPort, "POST", "/process.Process/Start", q("true"), "Content-Type", "application/json", "X-Access-Token", token); r.status != http.StatusUnsupportedMediaType {
		t.Errorf("Start as unary JSON = %d", r.status)
	}
	unary := func(method, body string) response {
		return e.data(id, e2btest.EnvdPort, "POST", "/process.Process/"+method, body, "Content-Type", "application/json", "Connect-Protocol-Version", "1", "X-Access-Token", token)
	}
	if r := unary("SendSignal", `{"process":{"pid":4242},"signal":"SIGNAL_SIGKILL"}`); r.status != http.StatusNotFound || r.body != `{"code":"not_found","message":"process with pid 4242 not found"}` {
		t.Errorf("SendSignal to an unknown pid = %d %s", r.status, r.body)
	}
	if r := unary("SendSignal", `{"process":{"pid":1},"signal":"SIGNAL_SIGHUP"}`); r.status != http.StatusNotImplemented || !strings.Contains(r.body, `"unimplemented"`) {
		t.Errorf("SendSignal SIGHUP = %d %s", r.status, r.body)
	}
	if r := unary("List", `{}`); r.status != http.StatusOK || r.body != `{"processes":[]}` {
		t.Errorf("List = %d %s", r.status, r.body)
	}
}
