package upstream

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
)

func TestPostUnusableDeployment(t *testing.T) {
	up := newUpstream(t, status(200, `{"ok":1}`))
	unusable := dep("m", up.URL, "")
	unusable.Provider, unusable.UpstreamModel, unusable.Line = "bedrock", "anthropic.claude-3", 12
	unusable.Unusable = "provider bedrock calls AWS's native API with AWS SigV4 signing, which this proxy does not do"
	c := newTestClient(t, nil)

	t.Run("alone, it is a 501 naming the deployment and why", func(t *testing.T) {
		_, _, err := c.Target([]config.Deployment{unusable}).Post(context.Background(), "/responses", []byte(`{}`), nil)
		var ae *apierror.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusNotImplemented || ae.Code != "deployment_not_supported" || ae.Type != "server_error" {
			t.Fatalf("Post error = %#v; want a 501 deployment_not_supported", err)
		}
		want := `Model "alias" cannot be served by this proxy: its deployment bedrock/anthropic.claude-3 (line 12 of the configuration) uses a provider that calls AWS's native API with AWS SigV4 signing, which this proxy does not do.`
		if ae.Message != want {
			t.Errorf("message = %q\nwant      %q", ae.Message, want)
		}
		if ae.Header.Get("X-Should-Retry") != "false" {
			t.Errorf("headers = %v; want x-should-retry: false, so that SDKs do not retry", ae.Header)
		}
		if up.hits() != 0 {
			t.Errorf("upstream called %d times", up.hits())
		}
	})
	t.Run("beside a usable deployment, that one serves", func(t *testing.T) {
		resp, d, err := c.Target([]config.Deployment{unusable, dep("m", up.URL, "")}).Post(context.Background(), "/responses", []byte(`{}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || d.Unusable != "" {
			t.Errorf("Post = %d from %+v", resp.StatusCode, d)
		}
	})
}

func TestPostAttempts(t *testing.T) {
	tests := []struct {
		name     string
		attempts int
		fails    int32 // the first N calls answer 503
		deps     int
		want     int // the status the caller sees
		wantHits int
	}{
		{"unset: each deployment once", 0, 5, 2, 503, 2},
		{"num_retries 2 on one deployment: three calls", 3, 2, 1, 200, 3},
		{"num_retries 0: no failover", 1, 1, 2, 503, 1},
		{"retries go round the deployments", 4, 3, 2, 200, 4},
		{"retries stop at the first answer", 5, 1, 1, 200, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) <= tc.fails {
					status(503, `{"error":{"message":"busy"}}`)(w, r)
					return
				}
				status(200, `{"ok":1}`)(w, r)
			})
			var deps []config.Deployment
			for range tc.deps {
				d := dep("m", up.URL, "")
				d.Attempts = tc.attempts
				deps = append(deps, d)
			}
			resp, _, err := newTestClient(t, nil).Target(deps).Post(context.Background(), "/responses", []byte(`{}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want || up.hits() != tc.wantHits {
				t.Errorf("status %d after %d calls; want %d after %d", resp.StatusCode, up.hits(), tc.want, tc.wantHits)
			}
		})
	}
}

// TestPostTimeout: a deployment that sends no headers within its timeout is given up for the next;
// once headers came, the body may take longer than the timeout.
func TestPostTimeout(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	silent := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	bodyWait := make(chan struct{})
	slowBody := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		_, _ = io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-bodyWait // held past the timeout: the test reads the first event, then lets it end
		_, _ = io.WriteString(w, "data: 2\n\n")
	})
	m := NewMetrics(nil)
	c := newTestClient(t, m)
	timed := func(base string, timeout time.Duration) config.Deployment {
		d := dep("m", base, "")
		d.Timeout, d.StreamTimeout = time.Hour, timeout // a streaming request uses StreamTimeout
		return d
	}
	const short = 50 * time.Millisecond

	t.Run("no headers in time fails over", func(t *testing.T) {
		resp, d, err := c.Target([]config.Deployment{timed(silent.URL, short), timed(slowBody.URL, short)}).
			Post(context.Background(), "/responses", []byte(`{"stream":true}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if !strings.HasPrefix(d.APIBase, slowBody.URL) {
			t.Fatalf("answered by %s; want the second deployment", d.APIBase)
		}
		first := make([]byte, len("data: 1\n\n"))
		if _, err := io.ReadFull(resp.Body, first); err != nil {
			t.Fatal(err)
		}
		// The stream outlives the timeout: let the upstream finish only now that it has passed.
		time.AfterFunc(2*short, func() { close(bodyWait) })
		rest, err := io.ReadAll(resp.Body)
		if err != nil || string(rest) != "data: 2\n\n" {
			t.Errorf("rest of the stream = %q, %v; want the second event: the timeout must not cut a body", rest, err)
		}
		if got := value(t, m.errors.WithLabelValues("openai", "timeout")); got != 1 {
			t.Errorf("timeout errors = %v; want 1", got)
		}
	})
	t.Run("every deployment silent is a 504", func(t *testing.T) {
		_, _, err := c.Target([]config.Deployment{timed(silent.URL, short)}).Post(context.Background(), "/responses", []byte(`{"stream":true}`), nil)
		var ae *apierror.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusGatewayTimeout || ae.Code != "upstream_timeout" {
			t.Fatalf("Post error = %v; want a 504 upstream_timeout", err)
		}
	})
}
