package opensandbox

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// TestTranslator reads execd streams framed every way the SDKs accept, and broken ones.
func TestTranslator(t *testing.T) {
	done := `{"type":"stdout","text":"` + strings.ReplaceAll(strings.ReplaceAll(doneMarker, "\x1e", `\u001e`), "\x1f", `\u001f`)
	done = strings.TrimSuffix(done, "\n") + `\n"}`
	for _, c := range []struct {
		name, stream string
		stdout       string
		results      int
		err          error
		lost         bool
	}{
		{"bare json", `{"type":"init","text":"c"}` + "\n\n" + `{"type":"ping","text":"pong"}` + "\n\n" + `{"type":"stdout","text":"hi\n"}` + "\n\n" + done + "\n\n" + `{"type":"execution_complete","execution_time":3}` + "\n\n", "hi\n", 0, nil, false},
		{"data prefixes and fields", "event: message\nid: 1\n: comment\ndata: {\"type\":\"stdout\",\"text\":\"a\"}\n\ndata:" + done + "\r\n\r\nretry: 10\ndata: {\"type\":\"execution_complete\"}\n\n", "a", 0, nil, false},
		{"result", `{"type":"execution_count","execution_count":2}` + "\n\n" + `{"type":"result","results":{"text":"2","image/png":"iVBOR"}}` + "\n\n" + done + "\n\n" + `{"type":"execution_complete"}` + "\n\n", "", 1, nil, false},
		{"nothing after complete is read", done + "\n\n" + `{"type":"execution_complete"}` + "\n\nnot json at all\n", "", 0, nil, false},
		{"no marker: the kernel died", `{"type":"stdout","text":"x"}` + "\n\n" + `{"type":"execution_complete"}` + "\n\n", "x", 0, nil, true},
		{"eof before complete", `{"type":"stdout","text":"x"}` + "\n\n", "x", 0, sandbox.ErrIncomplete, false},
		{"appended error", `{"type":"stdout","text":"x"}` + "\n\n" + `{"code":"RUNTIME_ERROR","message":"boom"}`, "x", 0, sandbox.ErrIncomplete, false},
		{"not json", "<html>\n\n", "", 0, sandbox.ErrIncomplete, false},
		{"cut mid-line", `{"type":"stdout","text":"x"}` + "\n\n" + `{"type":"std`, "x", 0, sandbox.ErrIncomplete, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newTranslator(strings.NewReader(c.stream))
			res, err := sandbox.DecodeExecution(tr, 0, nil)
			if c.err == nil && err != nil || c.err != nil && !errors.Is(err, c.err) {
				t.Fatalf("err %v, want %v", err, c.err)
			}
			if res.Stdout != c.stdout || len(res.Results) != c.results || (c.err == nil && !tr.done != c.lost) {
				t.Errorf("stdout %q results %d done %v", res.Stdout, len(res.Results), tr.done)
			}
			if c.lost && !strings.Contains(res.Stderr, "kernel died") {
				t.Errorf("stderr %q", res.Stderr)
			}
		})
	}
}

// TestTranslatorFigureAcrossChunks: a figure printed across several stdout events, between plain
// output, becomes one result and leaves the text around it intact.
func TestTranslatorFigureAcrossChunks(t *testing.T) {
	tr := &translator{}
	for _, chunk := range []string{"before ", "\x1e", "\x1fciproxy-fig", "ure iVBOR", "w0KGgo\x1e", "\nafter\n", doneMarker} {
		tr.stdout(chunk)
	}
	res, err := sandbox.DecodeExecution(io.MultiReader(&tr.out, strings.NewReader(`{"type":"end_of_execution"}`+"\n")), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "before after\n" || len(res.Results) != 1 || res.Results[0].PNG != "iVBORw0KGgo" || !tr.done {
		t.Errorf("stdout %q results %+v", res.Stdout, res.Results)
	}
}

// TestTranslatorLongLine: a line over the cap is an error without being held.
func TestTranslatorLongLine(t *testing.T) {
	r := io.MultiReader(strings.NewReader(`{"type":"stdout","text":"`), strings.NewReader(strings.Repeat("x", maxEventLine+10)), strings.NewReader("\"}\n\n"))
	_, err := sandbox.DecodeExecution(newTranslator(r), 0, nil)
	if !errors.Is(err, sandbox.ErrIncomplete) {
		t.Errorf("err %v", err)
	}
}
