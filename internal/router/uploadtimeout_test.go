package router

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/config"
)

// cutBody gives its chunks one read each and then fails as a connection does at its read
// deadline: net/http cancels the request's context as the read fails, and the last chunk comes
// with the timeout.
type cutBody struct {
	chunks []string
	cancel context.CancelFunc
}

func (b *cutBody) Read(p []byte) (int, error) {
	if len(b.chunks) == 0 {
		return 0, b.timeout()
	}
	n := copy(p, b.chunks[0])
	if n < len(b.chunks[0]) {
		b.chunks[0] = b.chunks[0][n:]
		return n, nil
	}
	b.chunks = b.chunks[1:]
	if len(b.chunks) == 0 {
		return n, b.timeout()
	}
	return n, nil
}

func (b *cutBody) timeout() error {
	b.cancel()
	// Past upload_timeout (a nanosecond) whatever the clock's resolution.
	time.Sleep(time.Millisecond)
	return fmt.Errorf("read tcp 127.0.0.1:1->127.0.0.1:2: %w", os.ErrDeadlineExceeded)
}

// TestUploadTimeoutCutMidway: an upload cut by upload_timeout is a 408 however the cut falls,
// even where the layers between the body and the handler lose the read's error or see the
// request's context canceled first. Either used to pass for a client that left: the handler wrote
// nothing and the client got an empty 200.
func TestUploadTimeoutCutMidway(t *testing.T) {
	tests := []struct {
		name  string
		parts form
		// cut returns the chunks the body is read in, the last one arriving with the timeout.
		cut func(body string) []string
	}{
		// bufio's ReadLine drops an error that comes with part of a line, so textproto sees the
		// cut header line alone and calls it malformed.
		{"in a part's header", form{{"purpose", "user_data", ""}, {"file", "data", "a.bin"}}, func(body string) []string {
			i := strings.Index(body, "Content-Disposit") + len("Content-Disposit")
			return []string{body[:i], ""}
		}},
		// The file's bytes up to the "\r" that may start the boundary come with the timeout: the
		// part returns them without it, and the store's next read sees the canceled context
		// before the part would have reported the timeout.
		{"in the file, the store first", form{{"file", "tttttt", "a.bin"}, {"purpose", "user_data", ""}}, func(body string) []string {
			i := strings.Index(body, "tttttt")
			return []string{body[:i+4], body[i+4 : i+7]}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newFilesProxy(t, filesConfig(func(c *config.Config) { c.General.UploadTimeout = time.Nanosecond }), "")
			body, ct := multipartBody(tc.parts)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/files", &cutBody{chunks: tc.cut(body), cancel: cancel})
			req.Header.Set("Content-Type", ct)
			rec := httptest.NewRecorder()
			p.Config.Handler.ServeHTTP(rec, req)
			if rec.Code != http.StatusRequestTimeout {
				t.Fatalf("a cut upload got %d %q; want a 408", rec.Code, rec.Body.String())
			}
			msg, typ, _, _ := decodeError(t, rec.Body.Bytes())
			if typ != "invalid_request_error" || !strings.Contains(msg, "limit of 1ns") {
				t.Errorf("408 body %s; want invalid_request_error naming the limit of 1ns", rec.Body.String())
			}
			p.nothingStored(t, "")
		})
	}
}
