package sandbox

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// Transcripts as e2b's code-interpreter server writes them (docs/wire-e2b.md).
const (
	transcriptHello = `{"type": "number_of_executions", "execution_count": 1}
{"type": "stdout", "text": "hi\n", "timestamp": "2026-08-21T18:51:27.123456+00:00"}
{"type": "result", "text": "2", "extra": {}, "is_main_result": true}
{"type": "end_of_execution"}
`
	transcriptNameError = `{"type": "number_of_executions", "execution_count": 2}
{"type": "error", "name": "NameError", "value": "name 'x' is not defined", "traceback": "\u001b[0;31mNameError\u001b[0m: name 'x' is not defined"}
{"type": "end_of_execution"}
`
	transcriptFigure = `{"type": "number_of_executions", "execution_count": 3}
{"type": "result", "text": "<Figure size 640x480 with 1 Axes>", "png": "iVBORw0KGgo=", "chart": {"type": "line", "title": "t"}, "extra": {}, "is_main_result": false}
{"type": "end_of_execution"}
`
)

func TestDecodeExecution(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		limit int
		want  Result
		types []string // messages passed to onMessage, in order
	}{
		{
			name: "stdout and main result",
			in:   transcriptHello,
			want: Result{Stdout: "hi\n", ExecutionCount: 1, Results: []Output{
				{Text: "2", Extra: json.RawMessage(`{}`), IsMainResult: true}}},
			types: []string{"number_of_executions", "stdout", "result", "end_of_execution"},
		},
		{
			name: "python exception is the error",
			in:   transcriptNameError,
			want: Result{ExecutionCount: 2, Error: &ExecError{Name: "NameError",
				Value: "name 'x' is not defined", Traceback: "\x1b[0;31mNameError\x1b[0m: name 'x' is not defined"}},
			types: []string{"number_of_executions", "error", "end_of_execution"},
		},
		{
			name: "figure with png and chart",
			in:   transcriptFigure,
			want: Result{ExecutionCount: 3, Results: []Output{{
				Text: "<Figure size 640x480 with 1 Axes>", PNG: "iVBORw0KGgo=",
				Chart: json.RawMessage(`{"type": "line", "title": "t"}`), Extra: json.RawMessage(`{}`)}}},
			types: []string{"number_of_executions", "result", "end_of_execution"},
		},
		{
			name: "keepalive and unknown types are ignored",
			in: `{"type": "keepalive"}
{"type": "stdout", "text": "a", "timestamp": "x"}
{"type": "future_thing", "text": "zzz", "extra": 5}
{"type": "keepalive"}
{"type": "stdout", "text": "b", "timestamp": "x"}
{"type": "end_of_execution"}
`,
			want:  Result{Stdout: "ab"},
			types: []string{"keepalive", "stdout", "future_thing", "keepalive", "stdout", "end_of_execution"},
		},
		{
			name: "stdout and stderr chunks are joined in order",
			in: `{"type": "stderr", "text": "warn: ", "timestamp": "x"}
{"type": "stdout", "text": "par", "timestamp": "x"}
{"type": "stderr", "text": "careful\n", "timestamp": "x"}
{"type": "stdout", "text": "tial\n", "timestamp": "x"}
{"type": "end_of_execution"}
`,
			want:  Result{Stdout: "partial\n", Stderr: "warn: careful\n"},
			types: []string{"stderr", "stdout", "stderr", "stdout", "end_of_execution"},
		},
		{
			name: "last error wins",
			in: `{"type": "error", "name": "A", "value": "1", "traceback": ""}
{"type": "error", "name": "UnexpectedEndOfExecution", "value": "Connection to the execution was closed before the execution was finished", "traceback": ""}
{"type": "end_of_execution"}
`,
			want: Result{Error: &ExecError{Name: "UnexpectedEndOfExecution",
				Value: "Connection to the execution was closed before the execution was finished"}},
			types: []string{"error", "error", "end_of_execution"},
		},
		{
			name: "anything after end_of_execution is not read",
			in: `{"type": "stdout", "text": "x", "timestamp": "t"}
{"type": "end_of_execution"}
{"type": "stdout", "text": "late", "timestamp": "t"}
not json at all
`,
			want:  Result{Stdout: "x"},
			types: []string{"stdout", "end_of_execution"},
		},
		{
			name:  "end_of_execution without a final newline, CRLF and blank lines",
			in:    "{\"type\": \"stdout\", \"text\": \"x\"}\r\n\r\n\n{\"type\": \"end_of_execution\"}",
			want:  Result{Stdout: "x"},
			types: []string{"stdout", "end_of_execution"},
		},
		{
			name: "compact JSON as the local kernel writes it",
			in: `{"type":"number_of_executions","execution_count":7}
{"type":"result","text":"'quoted'","html":"<b>x</b>","data":{"a":[1,2]},"extra":{"x":1},"is_main_result":true}
{"type":"end_of_execution"}
`,
			want: Result{ExecutionCount: 7, Results: []Output{{Text: "'quoted'", HTML: "<b>x</b>",
				Data: json.RawMessage(`{"a":[1,2]}`), Extra: json.RawMessage(`{"x":1}`), IsMainResult: true}}},
			types: []string{"number_of_executions", "result", "end_of_execution"},
		},
		{
			name: "stdout over the limit is cut with a note and decoding continues",
			in: `{"type": "stdout", "text": "hello world", "timestamp": "t"}
{"type": "stderr", "text": "more", "timestamp": "t"}
{"type": "result", "text": "x", "extra": {}, "is_main_result": true}
{"type": "number_of_executions", "execution_count": 4}
{"type": "error", "name": "E", "value": "v", "traceback": "tb"}
{"type": "end_of_execution"}
`,
			limit: 5,
			want: Result{Stdout: "hello\n[output truncated: over 5 bytes]\n", ExecutionCount: 4,
				Error: &ExecError{Name: "E", Value: "v", Traceback: "tb"}, Truncated: true},
			types: []string{"stdout", "number_of_executions", "error", "end_of_execution"},
		},
		{
			name: "a result that does not fit is dropped whole",
			in: `{"type": "stdout", "text": "ab\n", "timestamp": "t"}
{"type": "result", "text": "0123456789", "extra": {}, "is_main_result": false}
{"type": "stdout", "text": "c", "timestamp": "t"}
{"type": "end_of_execution"}
`,
			limit: 12,
			want:  Result{Stdout: "ab\n[output truncated: over 12 bytes]\n", Truncated: true},
			types: []string{"stdout", "end_of_execution"},
		},
		{
			name:  "a cut never splits a UTF-8 character",
			in:    `{"type": "stdout", "text": "aé", "timestamp": "t"}` + "\n" + `{"type": "end_of_execution"}`,
			limit: 2,
			want:  Result{Stdout: "a\n[output truncated: over 2 bytes]\n", Truncated: true},
			types: []string{"stdout", "end_of_execution"},
		},
		{
			name:  "output exactly at the limit is not truncated",
			in:    `{"type": "stdout", "text": "abc", "timestamp": "t"}` + "\n" + `{"type": "end_of_execution"}`,
			limit: 3,
			want:  Result{Stdout: "abc"},
			types: []string{"stdout", "end_of_execution"},
		},
	}
	readers := map[string]func(string) io.Reader{
		"whole":    func(s string) io.Reader { return strings.NewReader(s) },
		"one byte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
	}
	for _, tt := range tests {
		for rname, mk := range readers {
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				var types []string
				got, err := DecodeExecution(mk(tt.in), tt.limit, func(m Message) { types = append(types, m.Type) })
				if err != nil {
					t.Fatalf("DecodeExecution() error = %v", err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("DecodeExecution() =\n%#v\nwant\n%#v", got, tt.want)
				}
				if !reflect.DeepEqual(types, tt.types) {
					t.Errorf("onMessage types = %q; want %q", types, tt.types)
				}
			})
		}
	}
}

func TestDecodeExecutionErrors(t *testing.T) {
	errRead := errors.New("connection reset")
	tests := []struct {
		name       string
		in         io.Reader
		want       Result
		incomplete bool
		wrapped    error
		msg        string
	}{
		{
			name:       "empty stream is incomplete",
			in:         strings.NewReader(""),
			incomplete: true,
		},
		{
			name: "EOF before end_of_execution keeps what arrived",
			in: strings.NewReader(`{"type": "number_of_executions", "execution_count": 1}
{"type": "stdout", "text": "partial", "timestamp": "t"}
`),
			want:       Result{Stdout: "partial", ExecutionCount: 1},
			incomplete: true,
		},
		{
			name: "read error is incomplete and keeps the cause",
			in: io.MultiReader(strings.NewReader(`{"type": "stdout", "text": "x", "timestamp": "t"}`+"\n"),
				iotest.ErrReader(errRead)),
			want:       Result{Stdout: "x"},
			incomplete: true,
			wrapped:    errRead,
		},
		{
			name: "stream cut inside a line is incomplete",
			in: strings.NewReader(`{"type": "stdout", "text": "x", "timestamp": "t"}
{"type": "stdout", "te`),
			want:       Result{Stdout: "x"},
			incomplete: true,
			msg:        "cut inside line 2",
		},
		{
			name: "malformed line",
			in: strings.NewReader(`{"type": "stdout", "text": "x", "timestamp": "t"}
{"type": "stdout", "text": 
{"type": "end_of_execution"}
`),
			want: Result{Stdout: "x"},
			msg:  "line 2",
		},
		{
			name: "line that is not an object",
			in:   strings.NewReader("[1,2]\n{\"type\": \"end_of_execution\"}\n"),
			msg:  "line 1: not a JSON object",
		},
		{
			name: "wrong field type",
			in:   strings.NewReader(`{"type": "number_of_executions", "execution_count": "one"}` + "\n"),
			msg:  "line 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeExecution(tt.in, 0, nil)
			if err == nil {
				t.Fatalf("DecodeExecution() error = nil; want an error")
			}
			if errors.Is(err, ErrIncomplete) != tt.incomplete {
				t.Errorf("errors.Is(%v, ErrIncomplete) = %v; want %v", err, !tt.incomplete, tt.incomplete)
			}
			if tt.wrapped != nil && !errors.Is(err, tt.wrapped) {
				t.Errorf("error %v does not wrap %v", err, tt.wrapped)
			}
			if tt.msg != "" && !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecodeExecution() = %#v; want %#v", got, tt.want)
			}
		})
	}
}

// A figure several MB long fits in one line under the default limit.
func TestDecodeExecutionLongLines(t *testing.T) {
	png := strings.Repeat("iVBORw0K", 512<<10) // 4 MiB of base64
	in := `{"type": "result", "png": "` + png + `", "extra": {}, "is_main_result": false}` + "\n" +
		`{"type": "end_of_execution"}` + "\n"
	got, err := DecodeExecution(iotest.HalfReader(strings.NewReader(in)), 0, nil)
	if err != nil {
		t.Fatalf("DecodeExecution() error = %v", err)
	}
	if len(got.Results) != 1 || got.Results[0].PNG != png || got.Truncated {
		t.Fatalf("DecodeExecution() kept %d results, truncated=%v; want the 4 MiB png whole", len(got.Results), got.Truncated)
	}
}

// A line far beyond the limit is skipped without being kept, and the stream is still drained.
func TestDecodeExecutionHugeLineSkipped(t *testing.T) {
	const limit = 1000
	huge := strings.Repeat("A", limit+lineSlack+10)
	in := `{"type": "stdout", "text": "before\n", "timestamp": "t"}` + "\n" +
		`{"type": "result", "png": "` + huge + `", "extra": {}, "is_main_result": false}` + "\n" +
		`{"type": "number_of_executions", "execution_count": 9}` + "\n" +
		`{"type": "end_of_execution"}` + "\n"
	r := strings.NewReader(in)
	got, err := DecodeExecution(r, limit, nil)
	if err != nil {
		t.Fatalf("DecodeExecution() error = %v", err)
	}
	want := Result{Stdout: "before\n[output truncated: over 1000 bytes]\n", ExecutionCount: 9, Truncated: true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("DecodeExecution() = %#v; want %#v", got, want)
	}
	if r.Len() != 0 {
		t.Errorf("%d bytes left unread; want the stream drained", r.Len())
	}
}

func TestMessageJSON(t *testing.T) {
	tests := []struct {
		name string
		msg  Message
		want string
	}{
		{"stdout", Message{Type: "stdout", Text: "hi\n", Timestamp: "2026-08-21T18:51:27+00:00"},
			`{"type":"stdout","text":"hi\n","timestamp":"2026-08-21T18:51:27+00:00"}`},
		{"result text goes to Output.Text", Message{Type: "result", Output: Output{Text: "2", IsMainResult: true}},
			`{"type":"result","text":"2","extra":{},"is_main_result":true}`},
		{"result with png", Message{Type: "result", Output: Output{PNG: "iVBO", Extra: json.RawMessage(`{"k":1}`)}},
			`{"type":"result","png":"iVBO","extra":{"k":1},"is_main_result":false}`},
		{"error", Message{Type: "error", ExecError: ExecError{Name: "E", Value: "v", Traceback: ""}},
			`{"type":"error","name":"E","value":"v","traceback":""}`},
		{"number_of_executions", Message{Type: "number_of_executions", ExecutionCount: 3},
			`{"type":"number_of_executions","execution_count":3}`},
		{"end_of_execution", Message{Type: "end_of_execution"}, `{"type":"end_of_execution"}`},
		{"keepalive", Message{Type: "keepalive"}, `{"type":"keepalive"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.msg)
			if err != nil {
				t.Fatalf("Marshal() error = %v", err)
			}
			if string(b) != tt.want {
				t.Errorf("Marshal() = %s; want %s", b, tt.want)
			}
			var back Message
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatalf("Unmarshal(%s) error = %v", b, err)
			}
			want := tt.msg
			if want.Type == "result" && want.Extra == nil {
				want.Extra = json.RawMessage(`{}`)
			}
			if !reflect.DeepEqual(back, want) {
				t.Errorf("Unmarshal(Marshal(m)) = %#v; want %#v", back, want)
			}
		})
	}
	if _, err := json.Marshal(Message{}); err == nil {
		t.Errorf("Marshal(Message{}) error = nil; want an error for a message without a type")
	}
}

// FuzzDecodeExecution checks that no input panics and that the limit holds.
func FuzzDecodeExecution(f *testing.F) {
	for _, s := range []string{transcriptHello, transcriptNameError, transcriptFigure, "", "\n", "{}", "{\"type\":\"stdout\",\"text\":\"é\"}\n"} {
		f.Add([]byte(s), 0)
		f.Add([]byte(s), 3)
	}
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		if limit > 1<<20 || limit < -1 {
			limit %= 1 << 20
		}
		res, err := DecodeExecution(strings.NewReader(string(data)), limit, func(Message) {})
		if err != nil {
			return
		}
		eff := limit
		if eff <= 0 {
			eff = DefaultOutputLimit
		}
		size := len(res.Stderr)
		for i := range res.Results {
			size += res.Results[i].payloadSize()
		}
		stdout := res.Stdout
		if res.Truncated {
			var ok bool
			stdout, ok = strings.CutSuffix(stdout, "[output truncated: over "+itoa(eff)+" bytes]\n")
			if !ok {
				t.Fatalf("truncated Stdout %q lacks the note", res.Stdout)
			}
			stdout = strings.TrimSuffix(stdout, "\n")
		}
		if size+len(stdout) > eff {
			t.Fatalf("kept %d bytes of output; limit %d", size+len(stdout), eff)
		}
	})
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func BenchmarkDecodeExecution(b *testing.B) {
	figure := `{"type": "result", "text": "<Figure size 640x480 with 1 Axes>", "png": "` +
		strings.Repeat("iVBORw0K", 64<<10) + `", "extra": {}, "is_main_result": false}` + "\n"
	for _, bc := range []struct{ name, in string }{
		{"print and result", transcriptHello},
		{"100 stdout chunks", strings.Repeat(`{"type": "stdout", "text": "line of output\n", "timestamp": "2026-08-21T18:51:27.123456+00:00"}`+"\n", 100) +
			`{"type": "end_of_execution"}` + "\n"},
		{"512 KiB figure", figure + `{"type": "end_of_execution"}` + "\n"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeExecution(strings.NewReader(bc.in), 0, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
