package filename

import (
	"errors"
	"strings"
	"testing"
)

func TestClean(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr error
	}{
		{"a plain name is kept", "sales.csv", "sales.csv", nil},
		{"spaces and unicode are kept", "Q1 résumé — final (2).xlsx", "Q1 résumé — final (2).xlsx", nil},
		{"a leading dot is kept", ".env", ".env", nil},
		{"emoji with joiners are kept", "👩‍💻.txt", "👩‍💻.txt", nil},
		{"a directory part is dropped", "reports/2026/q1.csv", "q1.csv", nil},
		{"a windows path keeps its last element", `C:\Users\me\q1.csv`, "q1.csv", nil},
		{"traversal keeps only the last element", "../../etc/passwd", "passwd", nil},
		{"an absolute path keeps its last element", "/etc/shadow", "shadow", nil},
		{"exactly 255 bytes", strings.Repeat("a", 255), strings.Repeat("a", 255), nil},
		{"empty", "", "", ErrEmpty},
		{"only spaces", "   ", "", ErrEmpty},
		{"a trailing slash leaves nothing", "dir/", "", ErrEmpty},
		{"dot", ".", "", ErrDots},
		{"dot dot", "..", "", ErrDots},
		{"dot dot after a directory", "a/..", "", ErrDots},
		{"NUL", "a\x00.csv", "", ErrControl},
		{"newline", "a\nb.csv", "", ErrControl},
		{"escape", "\x1b[31mred.txt", "", ErrControl},
		{"DEL", "a\x7f", "", ErrControl},
		{"C1 control", "a\u0085b", "", ErrControl},
		{"right-to-left override", "invoice\u202Efdp.exe", "", ErrControl},
		{"isolate", "a\u2066b", "", ErrControl},
		{"invalid UTF-8", "a\xffb", "", ErrEncoding},
		{"256 bytes", strings.Repeat("a", 256), "", ErrTooLong},
		{"multi-byte over 255 bytes", strings.Repeat("é", 128), "", ErrTooLong},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Clean(tc.in)
			if got != tc.want || !errors.Is(err, tc.wantErr) {
				t.Errorf("Clean(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func FuzzClean(f *testing.F) {
	for _, s := range []string{"a.csv", "../x", "a\x00", "", "C:\\a\\b", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := Clean(in)
		if err != nil {
			return
		}
		if got == "" || got == "." || got == ".." || strings.ContainsAny(got, "/\\\x00") || len(got) > MaxLen {
			t.Fatalf("Clean(%q) = %q: not one safe path element", in, got)
		}
		if again, err := Clean(got); err != nil || again != got {
			t.Fatalf("Clean(Clean(%q)) = %q, %v; want it unchanged", in, again, err)
		}
	})
}
