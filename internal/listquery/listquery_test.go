package listquery

import (
	"errors"
	"net/url"
	"testing"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

func TestLimit(t *testing.T) {
	for _, tt := range []struct {
		query string
		want  int
		code  string // "": no error
	}{
		{"", 20, ""},
		{"limit=1", 1, ""},
		{"limit=100", 100, ""},
		{"limit=0", 0, "integer_below_min_value"},
		{"limit=-3", 0, "integer_below_min_value"},
		{"limit=101", 0, "integer_above_max_value"},
		{"limit=ten", 0, "invalid_value"},
		{"limit=", 0, "invalid_value"},
		{"limit=1.5", 0, "invalid_value"},
	} {
		q, _ := url.ParseQuery(tt.query)
		got, err := Limit(q, 20, 100)
		if code := codeOf(t, err); got != tt.want || code != tt.code {
			t.Errorf("Limit(%q) = %d, code %q; want %d, code %q", tt.query, got, code, tt.want, tt.code)
		}
	}
}

func TestOrder(t *testing.T) {
	for _, tt := range []struct{ query, want, code string }{
		{"", "desc", ""},
		{"order=asc", "asc", ""},
		{"order=desc", "desc", ""},
		{"order=up", "", "invalid_value"},
		{"order=", "", "invalid_value"},
	} {
		q, _ := url.ParseQuery(tt.query)
		got, err := Order(q)
		if code := codeOf(t, err); got != tt.want || code != tt.code {
			t.Errorf("Order(%q) = %q, code %q; want %q, code %q", tt.query, got, code, tt.want, tt.code)
		}
	}
}

// codeOf returns the OpenAI code of err, a 400 naming its parameter, or "" for nil.
func codeOf(t *testing.T, err error) string {
	t.Helper()
	if err == nil {
		return ""
	}
	var e *apierror.Error
	if !errors.As(err, &e) || e.Status != 400 || e.Type != "invalid_request_error" || e.Param == "" {
		t.Fatalf("error %v is not a 400 naming its parameter", err)
	}
	return e.Code
}
