package e2btest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

func TestPyLine(t *testing.T) {
	now := time.Date(2026, 8, 21, 18, 51, 27, 123456789, time.UTC)
	tests := []struct {
		name string
		msg  sandbox.Message
		want string
	}{
		{"count", sandbox.Message{Type: "number_of_executions", ExecutionCount: 3},
			`{"type": "number_of_executions", "execution_count": 3}`},
		{"stdout with the exec timestamp", sandbox.Message{Type: "stdout", Text: "hi\n", Timestamp: "2026-08-21T18:51:27.000001+00:00"},
			`{"type": "stdout", "text": "hi\n", "timestamp": "2026-08-21T18:51:27.000001+00:00"}`},
		{"stderr stamped now", sandbox.Message{Type: "stderr", Text: "w"},
			`{"type": "stderr", "text": "w", "timestamp": "2026-08-21T18:51:27.123456+00:00"}`},
		{"whole seconds have no fraction", sandbox.Message{Type: "stdout", Text: "", Timestamp: "2026-08-21T18:51:27Z"},
			`{"type": "stdout", "text": "", "timestamp": "2026-08-21T18:51:27+00:00"}`},
		{"escapes", sandbox.Message{Type: "stdout", Text: "\"\\/\b\f\n\r\t\x01\x7fé€😀<>&", Timestamp: "2026-08-21T18:51:27Z"},
			`{"type": "stdout", "text": "\"\\/\b\f\n\r\t\u0001\u007f\u00e9\u20ac\ud83d\ude00<>&", "timestamp": "2026-08-21T18:51:27+00:00"}`},
		{"result in declaration order", sandbox.Message{Type: "result", Output: sandbox.Output{
			Text: "t", PNG: "iVBOR", HTML: "<b>", JSON: json.RawMessage(`{"b":1,"a":[1,2.50,{"x":null}]}`),
			Data: json.RawMessage(`{"col":["é"]}`), Chart: json.RawMessage(`{}`), IsMainResult: false}},
			`{"type": "result", "text": "t", "html": "<b>", "png": "iVBOR", "json": {"b": 1, "a": [1, 2.5, {"x": null}]}, "data": {"col": ["\u00e9"]}, "chart": {}, "extra": {}, "is_main_result": false}`},
		{"main result keeps extra", sandbox.Message{Type: "result", Output: sandbox.Output{Text: "2", Extra: json.RawMessage(`{"k":true}`), IsMainResult: true}},
			`{"type": "result", "text": "2", "extra": {"k": true}, "is_main_result": true}`},
		{"error", sandbox.Message{Type: "error", ExecError: sandbox.ExecError{Name: "NameError", Value: "name 'x' is not defined", Traceback: "T"}},
			`{"type": "error", "name": "NameError", "value": "name 'x' is not defined", "traceback": "T"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := pyLine(tc.msg, now)
			if err != nil || !ok {
				t.Fatalf("pyLine = %v, %v", ok, err)
			}
			if string(got) != tc.want+"\n" {
				t.Errorf("pyLine =\n%s\nwant\n%s", got, tc.want)
			}
			// Python's output is still JSON Go reads back to the same message.
			var back sandbox.Message
			if err := json.Unmarshal(got, &back); err != nil {
				t.Errorf("unmarshal: %v", err)
			}
		})
	}
	for _, n := range []string{"1", "-3", "2.50", "1e16", "1.5e16", "1234567890123456.0", "0.0001", "0.00001",
		"1.5E-7", "-0.0", "100.0", "0.1", "123.456", "12345678901234567890"} {
		if got, want := pyNumber(n), pyRepr[n]; got != want {
			t.Errorf("pyNumber(%s) = %s; want %s", n, got, want)
		}
	}
	for _, typ := range []string{"keepalive", "end_of_execution", "unknown"} {
		if _, ok, _ := pyLine(sandbox.Message{Type: typ}, now); ok {
			t.Errorf("pyLine(%s) is forwarded; the stream writes those itself", typ)
		}
	}
}

// pyRepr is json.dumps(json.loads(n)) for each n, as printed by CPython 3.
var pyRepr = map[string]string{
	"1": "1", "-3": "-3", "2.50": "2.5", "1e16": "1e+16", "1.5e16": "1.5e+16",
	"1234567890123456.0": "1234567890123456.0", "0.0001": "0.0001", "0.00001": "1e-05",
	"1.5E-7": "1.5e-07", "-0.0": "-0.0", "100.0": "100.0", "0.1": "0.1", "123.456": "123.456",
	"12345678901234567890": "12345678901234567890",
}
