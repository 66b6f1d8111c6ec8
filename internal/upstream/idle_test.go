package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/upstream/chat"
)

// TestStreamIdleTimeout: an upstream that sends its headers (and maybe a little) and then stalls
// is given up after its deployment's stream_idle_timeout, whichever way its body is read: the
// Responses seam's events and the chat seam's, streamed or JSON, end with a 504 upstream_timeout;
// a pass-through answer is a 504 upstream_timeout before its first byte, and a pass-through
// stream ends with an error event in its API's format. The guard is the test's own
// deadline, far beyond the idle timeout: a read still blocked then is the failure.
func TestStreamIdleTimeout(t *testing.T) {
	for _, tt := range []struct {
		name, ct, path, sent string
		chat, stream, proxy  bool
		want                 string // pass-through: in the client's answer
		status               int    // pass-through: the client's status (0: 200)
	}{
		{name: "Responses stream", ct: "text/event-stream", path: "/responses", stream: true,
			sent: "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"output\":[]}}\n\n"},
		{name: "Responses JSON", ct: "application/json", path: "/responses", sent: `{"id":"resp_1",`},
		{name: "chat stream", ct: "text/event-stream", path: "/chat/completions", chat: true, stream: true,
			sent: chunk(`{"content":"thinking"}`, "", "")},
		{name: "chat JSON", ct: "application/json", path: "/chat/completions", chat: true, sent: `{"object":"chat.completion",`},
		{name: "pass-through Responses stream", ct: "text/event-stream", path: "/responses", proxy: true, stream: true,
			sent: "event: response.created\ndata: {}\n\n", want: "event: error\ndata: {\"type\":\"error\",\"code\":\"upstream_timeout\","},
		{name: "pass-through chat stream", ct: "text/event-stream", path: "/chat/completions", proxy: true, stream: true,
			sent: chunk(`{"content":"a"}`, "", ""), want: `data: {"error":{"message":`},
		{name: "pass-through JSON, before its first byte", ct: "application/json", path: "/chat/completions", proxy: true, status: http.StatusGatewayTimeout,
			want: `"code":"upstream_timeout"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.ct)
				_, _ = io.WriteString(w, tt.sent)
				w.(http.Flusher).Flush()
				<-r.Context().Done() // stalls until the proxy gives the call up
			})
			d := config.Deployment{ModelName: "m", UpstreamModel: "m-up", APIBase: up.URL + "/v1", StreamIdleTimeout: 50 * time.Millisecond}
			if tt.chat {
				d.API = config.APIChatCompletions
			}
			target := newTestClient(t, nil).Target([]config.Deployment{d})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			body := []byte(`{"model":"m","input":"x","stream":` + map[bool]string{false: "false", true: "true"}[tt.stream] + `}`)

			if tt.proxy {
				srv := proxyServer(t, newTestClient(t, nil), []config.Deployment{d})
				req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1"+tt.path, bytes.NewReader(body))
				resp, err := plainClient(t).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil || ctx.Err() != nil {
					t.Fatalf("reading the pass-through answer: %v (test deadline: %v); want it ended by the idle timeout", err, ctx.Err())
				}
				if want := max(tt.status, http.StatusOK); resp.StatusCode != want || !strings.Contains(string(b), tt.want) || !strings.HasPrefix(string(b), tt.sent) {
					t.Errorf("pass-through answer %d %q; want %d, what the upstream sent, then %q", resp.StatusCode, b, want, tt.want)
				}
				return
			}
			var api ResponsesAPI = target
			if tt.chat {
				api = NewChatAPI(target, chat.Options{})
			}
			ev, err := api.Responses(ctx, body, http.Header{})
			if err == nil {
				defer ev.Close()
				_, err = drain(t, ev)
			}
			var ae *apierror.Error
			if ctx.Err() != nil || !errors.As(err, &ae) || ae.Status != http.StatusGatewayTimeout || ae.Code != "upstream_timeout" || !errors.Is(err, ErrUpstreamIdle) {
				t.Errorf("err = %v (test deadline: %v); want 504 upstream_timeout", err, ctx.Err())
			}
		})
	}
}
