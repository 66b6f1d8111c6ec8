package router

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestResponseWriter(t *testing.T) {
	cases := []struct {
		name       string
		write      func(w http.ResponseWriter)
		wantStatus int
		wantBytes  int64
		wantFlush  bool
	}{
		{"nothing written", func(w http.ResponseWriter) {}, 0, 0, false},
		{"write implies 200", func(w http.ResponseWriter) { _, _ = w.Write([]byte("abc")) }, 200, 3, false},
		{"first status wins", func(w http.ResponseWriter) { w.WriteHeader(404); w.WriteHeader(500) }, 404, 0, false},
		{"informational status is not the status", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(201) }, 201, 0, false},
		{"flush through a ResponseController implies 200", func(w http.ResponseWriter) {
			if err := http.NewResponseController(w).Flush(); err != nil {
				panic(err)
			}
		}, 200, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			w := wrapWriter(rec)
			tc.write(w)
			if w.status != tc.wantStatus || w.bytes != tc.wantBytes || rec.Flushed != tc.wantFlush {
				t.Errorf("status, bytes, flushed = %d, %d, %v; want %d, %d, %v", w.status, w.bytes, rec.Flushed, tc.wantStatus, tc.wantBytes, tc.wantFlush)
			}
			if wrapWriter(w) != w {
				t.Errorf("wrapWriter wrapped the router's writer twice")
			}
		})
	}
	t.Run("deadlines reach the connection through Unwrap", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := http.NewResponseController(wrapWriter(w)).SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Errorf("SetReadDeadline through the wrapper: %v", err)
			}
		}))
		defer srv.Close()
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	})
}
