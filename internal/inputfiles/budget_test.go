package inputfiles

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

func TestBudget(t *testing.T) {
	lim := Limits{InFlight: 100, PerOwner: 60}
	var b Budget
	tests := []struct {
		owner  string
		n      int64
		status int // 0: admitted
		limit  string
	}{
		{"a", 50, 0, ""},
		{"a", 20, 429, "max_inline_bytes_in_flight_per_key"},
		{"b", 40, 0, ""},
		{"c", 20, 503, "max_inline_bytes_in_flight)"},
		{"c", 61, 400, "max_inline_bytes_in_flight_per_key"},
		{"c", 10, 0, ""},
		{"c", 0, 0, ""},
	}
	var held []func()
	for i, tt := range tests {
		release, err := b.Reserve(tt.owner, tt.n, lim)
		var ae *apierror.Error
		switch {
		case tt.status == 0 && err != nil:
			t.Fatalf("%d: Reserve(%s, %d) = %v; want admitted", i, tt.owner, tt.n, err)
		case tt.status == 0:
			held = append(held, release)
		case !errors.As(err, &ae) || ae.Status != tt.status || !strings.Contains(ae.Message, tt.limit):
			t.Fatalf("%d: Reserve(%s, %d) = %v; want a %d naming %s", i, tt.owner, tt.n, err, tt.status, tt.limit)
		}
	}
	if total, a := b.InFlight("a"); total != 100 || a != 50 {
		t.Errorf("InFlight = %d, %d; want 100, 50", total, a)
	}
	for _, release := range held {
		release()
		release() // once only
	}
	if total, a := b.InFlight("a"); total != 0 || a != 0 {
		t.Errorf("after release: InFlight = %d, %d; want 0", total, a)
	}
	if _, err := b.Reserve("a", 1<<40, Limits{}); err != nil {
		t.Errorf("no limits: %v", err)
	}
}

// A stream gives exactly the base64 of the stored file, and refuses a file whose size is not
// the one it announced.
func TestStreamExactSize(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{0, 1, 2, 3, 3071, 3072, 3073, 10_000} {
		data := strings.Repeat("a", size)
		files := storetest.NewMemFiles()
		files.Add("k", "file-a", "a.txt", data, int64(size))
		rc, err := stream(files, "k", "file-a", "p", "@", int64(size)).Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(got) != base64.StdEncoding.EncodeToString([]byte(data)) {
			t.Errorf("size %d: %v, %d bytes; want the file's base64", size, err, len(got))
		}
	}
	files := storetest.NewMemFiles()
	files.Add("k", "file-short", "a.txt", "abc", 4) // the record says 4, the bytes are 3
	files.Add("k", "file-long", "a.txt", "abcde", 4)
	for _, id := range []string{"file-short", "file-long"} {
		rc, err := stream(files, "k", id, "p", "@", 4).Open(ctx)
		if err == nil {
			_, err = io.ReadAll(rc)
			rc.Close()
		}
		if err == nil {
			t.Errorf("%s: read without error; want the size mismatch", id)
		}
	}
	if _, err := stream(files, "k", "file-gone", "p", "@", 4).Open(ctx); !errors.As(err, new(*apierror.Error)) {
		t.Errorf("a deleted file: %v; want the 404", err)
	}
}
