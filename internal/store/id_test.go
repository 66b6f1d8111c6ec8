package store

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestKindValid(t *testing.T) {
	g := NewIDGenerator(nil)
	tests := []struct {
		kind Kind
		id   string
		want bool
	}{
		{FileKind, g.New(FileKind), true},
		{ContainerKind, g.New(ContainerKind), true},
		{ContainerFileKind, g.New(ContainerFileKind), true},
		{FileKind, "file-abc123", false},
		{FileKind, "file-" + strings.Repeat("a", 21) + "_", false},
		{FileKind, "file-" + strings.Repeat("a", 23), false},
		{ContainerKind, "cntr_" + strings.Repeat("A", 48), false}, // hex is lower case
		{ContainerKind, "file-" + strings.Repeat("0", 22), false},
		{ContainerFileKind, "cfile_" + strings.Repeat("0", 32), true},
		{ContainerFileKind, "", false},
	}
	for _, tc := range tests {
		if got := tc.kind.Valid(tc.id); got != tc.want {
			t.Errorf("%s Valid(%q) = %v; want %v", tc.kind.Prefix(), tc.id, got, tc.want)
		}
	}
}

func TestIDsEncodeTheirTime(t *testing.T) {
	at := time.Date(2026, 8, 21, 12, 0, 0, 0, time.UTC)
	g := NewIDGenerator(func() time.Time { return at })
	id := g.New(ContainerKind)
	if want := "cntr_" + "01a024313600"; !strings.HasPrefix(id, want) { // 1787313600000 ms in hex
		t.Errorf("New(ContainerKind) = %s; want it to start with %s", id, want)
	}
	// A generator that has seen a later id (another process, the store before a restart) mints
	// after it, even with its clock behind.
	late := NewIDGenerator(func() time.Time { return at.Add(time.Hour) }).New(FileKind)
	g.Observe(FileKind, late)
	if next := g.New(FileKind); next <= late {
		t.Errorf("after Observe(%s), New = %s; want it to sort after", late, next)
	}
	g.Observe(FileKind, "file-nonsense") // ignored
}

// TestSafeID: a response or call id is 1 to 128 letters, digits, '_' or '-'; and the pattern
// that checks it is cheap to hold, since every process compiles it at start.
func TestSafeID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"resp_01Ab-9", true}, {strings.Repeat("a", 128), true}, {strings.Repeat("a", 129), false},
		{"", false}, {".", false}, {"..", false}, {"a/b", false}, {"a\x00", false}, {"a b", false}, {"é", false}, {"a\n", false},
	} {
		if got := SafeID(tc.id); got != tc.ok {
			t.Errorf("SafeID(%q) = %v; want %v", tc.id, got, tc.ok)
		}
	}
	if n := testing.AllocsPerRun(1, func() { regexp.MustCompile(safeIDRE.String()) }); n > 100 {
		t.Errorf("compiling the id pattern allocates %v times; want at most 100 (a counted repetition compiles to a copy per count)", n)
	}
}
