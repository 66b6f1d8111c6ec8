package sandbox

import (
	"io"
	"math"
	"strings"
	"testing"
)

func TestUTF8Decoder(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"ascii", "abc", "abc"},
		{"euro cut byte by byte", "a€b", "a€b"},
		{"invalid byte", "a\xffb", "a\uFFFDb"},
		{"cut sequence at the end", "a\xe2\x82", "a\uFFFD"},
		{"mixed", "a€b\xffc", "a€b\uFFFDc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var u UTF8Decoder
			var got string
			for i := range len(tc.in) {
				got += u.Decode([]byte(tc.in[i : i+1]))
			}
			got += u.Flush()
			if got != tc.want {
				t.Errorf("pieces = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCappedReader(t *testing.T) {
	tests := []struct {
		in       string
		max      int64
		want     string
		wantOver bool
	}{
		{"abc", 3, "abc", false},
		{"abcd", 3, "abc", true},
		{"", 0, "", false},
		{"a", 0, "", true},
		{"abc", math.MaxInt64, "abc", false},
	}
	for _, tc := range tests {
		c := NewCappedReader(strings.NewReader(tc.in), tc.max)
		b, err := io.ReadAll(c)
		if err != nil || string(b) != tc.want || c.Over() != tc.wantOver {
			t.Errorf("%q capped at %d: %q, over %v, %v; want %q, over %v", tc.in, tc.max, b, c.Over(), err, tc.want, tc.wantOver)
		}
	}
}
