package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store"
)

func TestHandleErrors(t *testing.T) {
	secret := errors.New("dial tcp 10.0.0.7:443: secret-internal-detail")
	cases := []struct {
		name       string
		h          handlerFunc
		cancel     bool
		wantStatus int
		wantBody   string // substring
		notInBody  string
		wantLog    string // log message, "" for none
	}{
		{
			name:       "nil error writes nothing more",
			h:          func(w http.ResponseWriter, r *http.Request) error { _, _ = io.WriteString(w, "fine"); return nil },
			wantStatus: http.StatusOK, wantBody: "fine",
		},
		{
			name: "api error is sent as it is",
			h: func(w http.ResponseWriter, r *http.Request) error {
				return apierror.BadRequest("bad thing", "input", "bad_code")
			},
			wantStatus: http.StatusBadRequest, wantBody: `"code":"bad_code"`,
		},
		{
			name: "wrapped api error keeps its status, hides its cause",
			h: func(w http.ResponseWriter, r *http.Request) error {
				return fmt.Errorf("calling: %w", apierror.BadGateway("The upstream request failed.", "upstream_error", secret))
			},
			wantStatus: http.StatusBadGateway, wantBody: "The upstream request failed.", notInBody: "secret-internal-detail",
			wantLog: "request failed",
		},
		{
			name: "an unreachable store is a 503, even under a sandbox error",
			h: func(w http.ResponseWriter, r *http.Request) error {
				cause := fmt.Errorf("%w: redis: %w", store.ErrUnavailable, secret)
				return apierror.BadGateway("The code interpreter sandbox is unavailable.", "sandbox_unavailable", cause)
			},
			wantStatus: http.StatusServiceUnavailable, wantBody: `"code":"store_unavailable"`, notInBody: "secret-internal-detail",
			wantLog: "request failed",
		},
		{
			name:       "other error is a generic 500",
			h:          func(w http.ResponseWriter, r *http.Request) error { return fmt.Errorf("loading: %w", secret) },
			wantStatus: http.StatusInternalServerError, wantBody: `"type":"server_error"`, notInBody: "secret-internal-detail",
			wantLog: "request failed",
		},
		{
			name: "error after the response started is only logged",
			h: func(w http.ResponseWriter, r *http.Request) error {
				w.WriteHeader(http.StatusAccepted)
				_, _ = io.WriteString(w, "partial")
				return secret
			},
			wantStatus: http.StatusAccepted, wantBody: "partial", notInBody: "error",
			wantLog: "error after the response started",
		},
		{
			name: "client gone is not an error",
			h: func(w http.ResponseWriter, r *http.Request) error {
				return fmt.Errorf("upstream: %w", context.Canceled)
			},
			cancel: true, wantStatus: http.StatusOK, // the recorder's default: nothing was written
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			s := &server{log: zap.New(core)}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			rec := httptest.NewRecorder()
			s.handle(tc.h).ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/x", nil))
			body := rec.Body.String()
			if rec.Code != tc.wantStatus || !strings.Contains(body, tc.wantBody) {
				t.Errorf("status, body = %d %q; want %d containing %q", rec.Code, body, tc.wantStatus, tc.wantBody)
			}
			if tc.notInBody != "" && strings.Contains(body, tc.notInBody) {
				t.Errorf("body %q contains %q", body, tc.notInBody)
			}
			if tc.wantStatus >= 400 {
				decodeError(t, rec.Body.Bytes())
			}
			entries := logs.All()
			if tc.wantLog == "" {
				if len(entries) != 0 {
					t.Errorf("logged %v; want nothing", entries)
				}
				return
			}
			if len(entries) != 1 || entries[0].Message != tc.wantLog {
				t.Fatalf("logged %v; want one %q", entries, tc.wantLog)
			}
			if !strings.Contains(fmt.Sprint(entries[0].ContextMap()["error"]), "secret-internal-detail") {
				t.Errorf("log %v lacks the cause", entries[0].ContextMap())
			}
		})
	}
}
