package e2btest_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
	// envd looks the process up before it checks the signal (TestProcessTags sends one to a live process).
	if r := unary("SendSignal", `{"process":{"pid":1},"signal":"SIGNAL_SIGHUP"}`); r.status != http.StatusNotFound || !strings.Contains(r.body, `"not_found"`) {
		t.Errorf("SendSignal SIGHUP to an unknown pid = %d %s", r.status, r.body)
	}
	if r := unary("List", `{}`); r.status != http.StatusOK || r.body != `{"processes":[]}` {
		t.Errorf("List = %d %s", r.status, r.body)
	}
}

// TestProcessTags checks tags as envd keeps them: a Start's tag is listed and selects the process
// for SendSignal, a selector is looked up before its signal is checked, and a lookup by tag stops
// at the first tagged process whose tag differs (the emulator ranges by ascending pid).
func TestProcessTags(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"code-interpreter-v1","timeout":300,"secure":true}`)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	client := e.srv.Client()
	// startAsync runs a Start to its end in the background and sends its body.
	startAsync := func(tag, command string) <-chan string {
		body := map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-c", command}}, "stdin": false}
		if tag != "" {
			body["tag"] = tag
		}
		msg, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", e.srv.SandboxURL()+"/process.Process/Start", strings.NewReader(envelope(0, string(msg))))
		for k, v := range map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", "X-Access-Token": token} {
			req.Header.Set(k, v)
		}
		out := make(chan string, 1)
		go func() {
			resp, err := client.Do(req)
			if err != nil {
				out <- "error: " + err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			out <- string(b)
		}()
		return out
	}
	unary := func(method, body string) response {
		return e.data(id, e2btest.EnvdPort, "POST", "/process.Process/"+method, body, "Content-Type", "application/json", "Connect-Protocol-Version", "1", "X-Access-Token", token)
	}
	// waitFor polls Processes until want holds.
	waitFor := func(what string, want func([]e2btest.Process) bool) []e2btest.Process {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			ps := e.srv.Processes(id)
			if want(ps) {
				return ps
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: processes %+v", what, ps)
			}
		}
	}
	endEvent := func(stream string) string {
		msgs, _ := envelopes(t, stream)
		for _, m := range msgs {
			if strings.Contains(m, `"end":`) {
				return m
			}
		}
		return ""
	}

	// The start event is held back: the process runs, is listed with its tag, and is killed by tag.
	e.srv.DelayNextStarts(1, time.Minute)
	a := startAsync("tag-a", "sleep 30")
	ps := waitFor("a listed", func(ps []e2btest.Process) bool { return len(ps) == 1 })
	if ps[0].Tag != "tag-a" || ps[0].Cmd != "/bin/bash" || strings.Join(ps[0].Args, " ") != "-c sleep 30" {
		t.Errorf("Processes = %+v", ps)
	}
	if r := unary("List", `{}`); r.status != http.StatusOK || !strings.Contains(r.body, `"tag":"tag-a"`) {
		t.Errorf("List = %d %s", r.status, r.body)
	}
	for _, tc := range []struct{ body, status, want string }{
		{`{"process":{"tag":"tag-a"},"signal":"SIGNAL_SIGHUP"}`, "501", `{"code":"unimplemented","message":"invalid signal: SIGNAL_SIGHUP"}`},
		{`{"process":{"tag":"nope"},"signal":"SIGNAL_SIGKILL"}`, "404", `{"code":"not_found","message":"process with tag nope not found"}`},
		{`{"process":{"pid":7},"signal":"SIGNAL_SIGHUP"}`, "404", `{"code":"not_found","message":"process with pid 7 not found"}`},
		{`{"process":{},"signal":"SIGNAL_SIGKILL"}`, "501", `"unimplemented"`},
		{`{"process":{"pid":7,"tag":"tag-a"},"signal":"SIGNAL_SIGKILL"}`, "400", `"invalid_argument"`},
	} {
		if r := unary("SendSignal", tc.body); fmt.Sprint(r.status) != tc.status || !strings.Contains(r.body, tc.want) {
			t.Errorf("SendSignal %s = %d %s; want %s %s", tc.body, r.status, r.body, tc.status, tc.want)
		}
	}
	if len(e.srv.Processes(id)) != 1 {
		t.Fatalf("a refused SendSignal ended the process: %+v", e.srv.Processes(id))
	}
	if r := unary("SendSignal", `{"process":{"tag":"tag-a"},"signal":"SIGNAL_SIGKILL"}`); r.status != http.StatusOK {
		t.Errorf("SendSignal by tag = %d %s", r.status, r.body)
	}
	waitFor("a killed", func(ps []e2btest.Process) bool { return len(ps) == 0 })
	if got := endEvent(<-a); got != `{"event":{"end":{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}}}` {
		t.Errorf("end of the killed process = %s", got)
	}

	// Three at once: an untagged one does not stop the lookup, a tagged one with another tag does.
	u := startAsync("", "sleep 30")
	waitFor("u listed", func(ps []e2btest.Process) bool { return len(ps) == 1 })
	b := startAsync("tag-b", "sleep 30")
	waitFor("b listed", func(ps []e2btest.Process) bool { return len(ps) == 2 })
	c := startAsync("tag-c", "sleep 30")
	ps = waitFor("c listed", func(ps []e2btest.Process) bool { return len(ps) == 3 })
	if ps[0].Tag != "" || ps[1].Tag != "tag-b" || ps[2].Tag != "tag-c" {
		t.Fatalf("Processes = %+v", ps)
	}
	if r := unary("SendSignal", `{"process":{"tag":"tag-c"},"signal":"SIGNAL_SIGKILL"}`); r.status != http.StatusNotFound {
		t.Errorf("SendSignal by a tag behind another = %d %s; want envd's not_found", r.status, r.body)
	}
	if r := unary("SendSignal", `{"process":{"tag":"tag-b"},"signal":"SIGNAL_SIGKILL"}`); r.status != http.StatusOK {
		t.Errorf("SendSignal by tag past an untagged process = %d %s", r.status, r.body)
	}
	waitFor("b killed", func(ps []e2btest.Process) bool { return len(ps) == 2 })
	if r := unary("SendSignal", `{"process":{"tag":"tag-c"},"signal":"SIGNAL_SIGKILL"}`); r.status != http.StatusOK {
		t.Errorf("SendSignal by tag, the first tagged one now = %d %s", r.status, r.body)
	}
	if r := unary("SendSignal", fmt.Sprintf(`{"process":{"pid":%d},"signal":"SIGNAL_SIGKILL"}`, ps[0].PID)); r.status != http.StatusOK {
		t.Errorf("SendSignal by pid = %d %s", r.status, r.body)
	}
	waitFor("all killed", func(ps []e2btest.Process) bool { return len(ps) == 0 })
	for _, ch := range []<-chan string{u, b, c} {
		if got := endEvent(<-ch); !strings.Contains(got, `"signal: killed"`) {
			t.Errorf("end of a killed process = %s", got)
		}
	}
}
