package intercept

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

func TestDescribe(t *testing.T) {
	tests := []struct {
		name       string
		res        sandbox.Result
		err        error
		limit      int
		wantStatus string
		wantModel  string
		wantLogs   string
		wantImages int
	}{
		{"nothing printed", sandbox.Result{}, nil, 100, "completed", "[no output]", "", 0},
		{"stdout, stderr and the result in order", sandbox.Result{Stdout: "out\n", Stderr: "err\n", Results: []sandbox.Output{{Text: "42", IsMainResult: true}}}, nil, 100,
			"completed", "out\nerr\n42", "out\nerr\n42", 0},
		{"a traceback loses its ANSI codes", sandbox.Result{Error: &sandbox.ExecError{Name: "ValueError", Value: "bad", Traceback: "\x1b[0;31mValueError\x1b[0m: bad"}}, nil, 100,
			"failed", "ValueError: bad", "ValueError: bad", 0},
		{"an error without traceback", sandbox.Result{Error: &sandbox.ExecError{Name: "KeyError", Value: "'k'"}}, nil, 100, "failed", "KeyError: 'k'", "KeyError: 'k'", 0},
		{"images are lines for the model and data URLs for the client", sandbox.Result{Stdout: "ok", Results: []sandbox.Output{{PNG: "iVBOR"}, {JPEG: "/9j/"}}}, nil, 100,
			"completed", "ok\n[image/png produced: shown to the user]\n[image/jpeg produced: shown to the user]", "ok", 2},
		{"a timeout keeps the partial output", sandbox.Result{Stdout: "partial\n"}, fmt.Errorf("run: %w", sandbox.ErrTimeout), 100,
			"incomplete", "partial\nExecution timed out after 1.5 s", "partial\nExecution timed out after 1.5 s", 0},
		{"a lost sandbox", sandbox.Result{}, fmt.Errorf("x: %w", sandbox.ErrNotFound), 100,
			"failed", "Execution failed: the sandbox is gone (expired or deleted); its state was lost", "Execution failed: the sandbox is gone (expired or deleted); its state was lost", 0},
		{"truncation keeps head and tail and whole characters", sandbox.Result{Stdout: strings.Repeat("é", 20)}, nil, 11,
			"completed", "éé\n[output truncated: 10 of 40 bytes shown]\nééé", strings.Repeat("é", 20), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex := describe(tt.res, tt.err, 1500*time.Millisecond, tt.limit)
			if ex.status != tt.wantStatus || ex.model != tt.wantModel || ex.logs != tt.wantLogs || len(ex.images) != tt.wantImages {
				t.Errorf("describe = {%s %q logs %q images %d}; want {%s %q logs %q images %d}",
					ex.status, ex.model, ex.logs, len(ex.images), tt.wantStatus, tt.wantModel, tt.wantLogs, tt.wantImages)
			}
		})
	}
}

func TestCIItem(t *testing.T) {
	ex := &execution{status: "completed", logs: "1", images: []string{"data:image/png;base64,AA"}}
	tests := []struct {
		name string
		ex   *execution
		with bool
		want string
	}{
		{"in progress", nil, true, `{"id":"ci_1","type":"code_interpreter_call","status":"in_progress","code":"","container_id":"cntr_1","outputs":[]}`},
		{"outputs not included", ex, false, `{"id":"ci_1","type":"code_interpreter_call","status":"in_progress","code":"","container_id":"cntr_1","outputs":null}`},
		{"outputs included", ex, true, `{"id":"ci_1","type":"code_interpreter_call","status":"in_progress","code":"","container_id":"cntr_1","outputs":[{"type":"logs","logs":"1"},{"type":"image","url":"data:image/png;base64,AA"}]}`},
		{"no logs, no images", &execution{}, true, `{"id":"ci_1","type":"code_interpreter_call","status":"in_progress","code":"","container_id":"cntr_1","outputs":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(ciItem("ci_1", "in_progress", "", "cntr_1", tt.ex, tt.with)); got != tt.want {
				t.Errorf("ciItem = %s; want %s", got, tt.want)
			}
		})
	}
}
