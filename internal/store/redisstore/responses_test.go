package redisstore

import (
	"regexp"
	"strings"
	"testing"
)

// TestSafeName: an id is stored when it is 1 to 128 letters, digits, '_' or '-'; and the pattern
// that checks it is cheap to hold, since every process compiles it at start.
func TestSafeName(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"resp_01Ab-9", true}, {strings.Repeat("a", 128), true}, {strings.Repeat("a", 129), false},
		{"", false}, {".", false}, {"..", false}, {"a/b", false}, {"a\x00", false}, {"a b", false}, {"é", false}, {"a\n", false},
	} {
		if got := safeName(tc.id); got != tc.ok {
			t.Errorf("safeName(%q) = %v; want %v", tc.id, got, tc.ok)
		}
	}
	if n := testing.AllocsPerRun(1, func() { regexp.MustCompile(safeNameRE.String()) }); n > 100 {
		t.Errorf("compiling the id pattern allocates %v times; want at most 100 (a counted repetition compiles to a copy per count)", n)
	}
}
