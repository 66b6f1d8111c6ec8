package router

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/sse"
	"github.com/ciproxy/ciproxy/internal/testutil"
)

func TestAccessLog(t *testing.T) {
	const bodyMarker = "body-marker-must-not-be-logged"
	up := newUpstream(t, nil)
	p := newProxy(t, testConfig(up.URL+"/v1", withMasterKey))
	auth := []string{"Authorization", "Bearer " + masterKey, RequestIDHeader, "req-from-client"}

	cases := []struct {
		name, method, path, body string
		header                   []string
		wantStatus               int
		wantModel, wantDep       string
	}{
		{"pass-through with a model", http.MethodPost, "/v1/chat/completions?api_key=" + masterKey, `{"model":"gpt-test","messages":"` + bodyMarker + `"}`, auth, 200, "gpt-test", "openai/gpt-test-upstream@line3"},
		{"stored response by id", http.MethodGet, "/responses/resp_1", "", auth, 200, "", "openai/gpt-test-upstream@line3"},
		{"refused without a key", http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"` + bodyMarker + `"}`, []string{"Authorization", "Bearer sk-wrong-key-123"}, 401, "", ""},
		{"unknown model", http.MethodPost, "/v1/responses", `{"model":"nope","input":"` + bodyMarker + `"}`, auth, 400, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p.logs.TakeAll()
			status, h, _ := p.do(t, tc.method, tc.path, tc.body, tc.header...)
			if status != tc.wantStatus {
				t.Fatalf("%s %s = %d; want %d", tc.method, tc.path, status, tc.wantStatus)
			}
			// The line is written after the response was flushed, so it may trail the client.
			lines := waitForLog(t, p.logs, "request")
			if len(lines) != 1 {
				t.Fatalf("access log lines = %d; want 1", len(lines))
			}
			f := lines[0].ContextMap()
			wantPath := strings.Split(tc.path, "?")[0]
			if f["request_id"] != h.Get(RequestIDHeader) || f["request_id"] == "" || f["method"] != tc.method || f["path"] != wantPath ||
				f["status"] != int64(tc.wantStatus) {
				t.Errorf("access log fields = %v; want id %q, %s %s, status %d", f, h.Get(RequestIDHeader), tc.method, wantPath, tc.wantStatus)
			}
			if b, ok := f["bytes"].(int64); !ok || b <= 0 {
				t.Errorf("bytes = %v; want the body size", f["bytes"])
			}
			if d, ok := f["duration"].(time.Duration); !ok || d <= 0 {
				t.Errorf("duration = %v; want > 0", f["duration"])
			}
			if got, _ := f["model"].(string); got != tc.wantModel {
				t.Errorf("model = %q; want %q", got, tc.wantModel)
			}
			if got, _ := f["deployment"].(string); got != tc.wantDep {
				t.Errorf("deployment = %q; want %q", got, tc.wantDep)
			}
			if tc.header[len(tc.header)-1] == "req-from-client" && f["request_id"] != "req-from-client" {
				t.Errorf("request_id = %v; want the client's X-Request-Id", f["request_id"])
			}
			assertNoSecrets(t, p.logs.All(), masterKey, "sk-wrong-key-123", "sk-upstream-secret", bodyMarker)
		})
	}
}

// waitForLog returns the entries with message msg once there is at least one.
func waitForLog(t *testing.T, logs *observer.ObservedLogs, msg string) []observer.LoggedEntry {
	t.Helper()
	var lines []observer.LoggedEntry
	testutil.Eventually(t, "a log line "+strconv.Quote(msg), func() bool {
		lines = logs.FilterMessage(msg).All()
		return len(lines) > 0
	})
	return lines
}

// assertNoSecrets fails if any log entry's message or field mentions one of secrets.
func assertNoSecrets(t *testing.T, entries []observer.LoggedEntry, secrets ...string) {
	t.Helper()
	for _, e := range entries {
		line := e.Message + " " + fmt.Sprint(e.ContextMap())
		for _, s := range secrets {
			if strings.Contains(line, s) {
				t.Errorf("log line %q contains %q", line, s)
			}
		}
	}
}

// TestSSEThroughChain sends a stream through every middleware and the pass-through, and checks
// that each event reaches the client before the upstream writes the next: the upstream waits for
// the client's acknowledgement of event i before it sends event i+1, so any buffering on the way
// stalls the stream and fails the test.
func TestSSEThroughChain(t *testing.T) {
	const events = 5
	acks := make(chan int)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":%d}\n\n", i)
			http.NewResponseController(w).Flush()
			if i == events-1 {
				return
			}
			select {
			case got := <-acks:
				if got != i {
					t.Errorf("acknowledged %d; want %d", got, i)
					return
				}
			case <-time.After(10 * time.Second):
				t.Errorf("event %d was never acknowledged: the proxy held it back", i)
				return
			case <-r.Context().Done():
				return
			}
		}
	})
	p := newProxy(t, testConfig(up.URL+"/v1", withMasterKey))
	for _, path := range []string{"/v1/responses", "/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, p.URL+path, strings.NewReader(`{"model":"gpt-test","stream":true}`))
			req.Header.Set("Authorization", "Bearer "+masterKey)
			resp, err := p.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
			}
			rd := sse.NewReader(resp.Body)
			for i := range events {
				ev, err := rd.Next()
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if want := fmt.Sprintf(`{"type":"response.output_text.delta","sequence_number":%d}`, i); ev.Name != "response.output_text.delta" || string(ev.Data) != want {
					t.Fatalf("event %d = %s %s; want %s", i, ev.Name, ev.Data, want)
				}
				if i < events-1 {
					select {
					case acks <- i:
					case <-time.After(10 * time.Second):
						t.Fatalf("the upstream stopped waiting for event %d's acknowledgement", i)
					}
				}
			}
			if _, err := rd.Next(); err != io.EOF {
				t.Errorf("after the last event: %v; want io.EOF", err)
			}
		})
	}
}
