package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
)

// drain reads every event of an answer.
func drain(t *testing.T, ev ResponseEvents) ([]string, error) {
	t.Helper()
	defer ev.Close()
	var out []string
	for {
		data, err := ev.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(data))
	}
}

func TestTargetResponses(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    []string // the events, in order
		wantErr error    // matched with errors.Is; nil: no error
	}{
		{"a stream is read event by event, data: [DONE] skipped", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			_, _ = io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\"}\n\n: a comment\n\ndata: {\"type\":\"response.completed\"}\n\ndata: [DONE]\n\n")
		}, []string{`{"type":"response.created"}`, `{"type":"response.completed"}`}, nil},
		{"a JSON answer is its terminal event, bytes kept", status(200, `{"id":"resp_up", "status":"completed","output":[]}`),
			[]string{`{"type":"response.completed","response":{"id":"resp_up", "status":"completed","output":[]}}`}, nil},
		{"an incomplete JSON answer ends incomplete", status(200, `{"status":"incomplete","output":[]}`),
			[]string{`{"type":"response.incomplete","response":{"status":"incomplete","output":[]}}`}, nil},
		{"a failed JSON answer ends failed", status(200, `{"status":"failed","output":[],"error":{"code":"server_error"}}`),
			[]string{`{"type":"response.failed","response":{"status":"failed","output":[],"error":{"code":"server_error"}}}`}, nil},
		{"a JSON answer without output is malformed", status(200, `{"id":"resp_up"}`), nil, ErrMalformed},
		{"a JSON answer that is not an object is malformed", status(200, `[1]`), nil, ErrMalformed},
		{"a JSON answer cut short is malformed", status(200, `{"status":"completed","output":[],"x":"abc`), nil, ErrMalformed},
		{"a JSON answer with trailing bytes is malformed", status(200, `{"status":"completed","output":[]} {"y":1}`), nil, ErrMalformed},
		{"a JSON answer over the size cap is malformed, not truncated", func(w http.ResponseWriter, r *http.Request) {
			// Valid JSON whose start alone looks like a complete, empty answer.
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"status":"completed","output":[],"x":"`)
			chunk := []byte(strings.Repeat("a", 1<<20))
			for range maxAnswerBody / len(chunk) {
				_, _ = w.Write(chunk)
			}
			_, _ = io.WriteString(w, `"}`)
		}, nil, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, tt.handler)
			target := newTestClient(t, nil).Target([]config.Deployment{dep("m-up", up.URL, "sk-up")})
			ev, err := target.Responses(context.Background(), []byte(`{"model":"m","input":"x"}`), http.Header{})
			if err != nil {
				t.Fatalf("Responses = %v", err)
			}
			got, err := drain(t, ev)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("reading the answer: %v; want %v", err, tt.wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("events = %q; want %q", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("event %d = %s; want %s", i, got[i], tt.want[i])
				}
			}
			if r := up.last(t); r.Path != "/v1/responses" || gjson.GetBytes(r.Body, "model").Str != "m-up" || r.Header.Get("Authorization") != "Bearer sk-up" {
				t.Errorf("upstream got %s %s with %q", r.Path, r.Body, r.Header.Get("Authorization"))
			}
		})
	}
}

func TestTargetResponsesErrors(t *testing.T) {
	t.Run("a non-2xx answer is a StatusError, written as it came", func(t *testing.T) {
		body := `{"error":{"message":"Slow down.","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}`
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "3")
			w.Header().Set("X-Internal", "not for clients")
			status(http.StatusTooManyRequests, body)(w, r)
		})
		target := newTestClient(t, nil).Target([]config.Deployment{dep("m-up", up.URL, "")})
		_, err := target.Responses(context.Background(), []byte(`{"model":"m"}`), http.Header{})
		var se *StatusError
		if !errors.As(err, &se) || se.Status != http.StatusTooManyRequests || string(se.Body) != body {
			t.Fatalf("Responses = %v; want a StatusError 429 with the body", err)
		}
		w := httptest.NewRecorder()
		se.Write(w)
		if w.Code != http.StatusTooManyRequests || w.Body.String() != body || w.Header().Get("Retry-After") != "3" ||
			w.Header().Get("Content-Type") != "application/json" || w.Header().Get("X-Internal") != "" {
			t.Errorf("Write = %d %v %s", w.Code, w.Header(), w.Body.String())
		}
	})
	t.Run("a redirect is malformed, never followed", func(t *testing.T) {
		for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusNotModified} {
			var followed atomic.Bool
			elsewhere := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { followed.Store(true) })
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", elsewhere.URL+"/v1/responses")
				w.WriteHeader(code)
			})
			target := newTestClient(t, nil).Target([]config.Deployment{dep("m-up", up.URL, "")})
			_, err := target.Responses(context.Background(), []byte(`{"model":"m"}`), http.Header{})
			if !errors.Is(err, ErrMalformed) || followed.Load() {
				t.Errorf("%d: Responses = %v, followed %v; want ErrMalformed, not followed", code, err, followed.Load())
			}
		}
	})
	t.Run("an error body over the cap is replaced, not cut", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"`+strings.Repeat("x", maxErrorBody)+`"}}`)
		})
		target := newTestClient(t, nil).Target([]config.Deployment{dep("m-up", up.URL, "")})
		_, err := target.Responses(context.Background(), []byte(`{"model":"m"}`), http.Header{})
		var se *StatusError
		if !errors.As(err, &se) || se.Status != http.StatusBadRequest || !json.Valid(se.Body) || len(se.Body) > 1024 ||
			!strings.Contains(string(se.Body), "error body over") {
			t.Fatalf("Responses = %v; want a 400 StatusError with a short valid body", err)
		}
	})
	t.Run("an upstream nobody answers is a 502", func(t *testing.T) {
		target := newTestClient(t, nil).Target([]config.Deployment{dep("m-up", refusedURL(t), "")})
		_, err := target.Responses(context.Background(), []byte(`{"model":"m"}`), http.Header{})
		var ae *apierror.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway {
			t.Errorf("Responses = %v; want a 502 *apierror.Error", err)
		}
	})
}
