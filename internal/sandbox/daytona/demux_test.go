package daytona

import (
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// TestDemux cuts one stdout stream at every position into two pieces: the text and the markers
// come out the same, whatever the cut.
func TestDemux(t *testing.T) {
	tok := "\x1eabc:"
	for _, tc := range []struct {
		name, in, text string
		marks          []string
	}{
		{"plain", "hello\nworld", "hello\nworld", nil},
		{"marker at a line start", "a\n" + tok + `{"n":1}` + "\nb\n", "a\nb\n", []string{`{"n":1}`}},
		{"marker mid-line", "partial" + tok + `{"text":"2"}` + "\n", "partial", []string{`{"text":"2"}`}},
		{"two markers", tok + "1\n" + tok + "2\nend", "end", []string{"1", "2"}},
		{"a prefix of the token that is not one", "x\x1eab-y", "x\x1eab-y", nil},
		{"an unterminated marker is dropped", "t" + tok + "cut", "t", nil},
	} {
		for cut := 0; cut <= len(tc.in); cut++ {
			var text strings.Builder
			var marks []string
			d := demux{token: tok}
			for _, piece := range []string{tc.in[:cut], tc.in[cut:]} {
				d.feed(piece, func(s string) { text.WriteString(s) }, func(m string) { marks = append(marks, m) })
			}
			d.flush(func(s string) { text.WriteString(s) })
			if text.String() != tc.text || strings.Join(marks, "|") != strings.Join(tc.marks, "|") {
				t.Errorf("%s, cut at %d: text %q marks %q", tc.name, cut, text.String(), marks)
			}
		}
	}
}

// TestLogDemux: a session log cut anywhere, markers included, splits into the same streams.
func TestLogDemux(t *testing.T) {
	in := []byte("\x01\x01\x01out\n\x02\x02\x02err\n\x01\x01\x01more")
	for cut := 0; cut <= len(in); cut++ {
		var got [2]strings.Builder
		var d logDemux
		emit := func(s int, b []byte) { got[s].Write(b) }
		for _, piece := range [][]byte{in[:cut], in[cut:]} {
			d.feed(piece, func(s sandbox.Stream, b []byte) { emit(int(s), b) })
		}
		d.flush(func(s sandbox.Stream, b []byte) { emit(int(s), b) })
		if got[0].String() != "out\nmore" || got[1].String() != "err\n" {
			t.Errorf("cut at %d: %q %q", cut, got[0].String(), got[1].String())
		}
	}
}
