package local

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

// TestKernelWireFormat runs kernel.py directly (no sandbox) and compares its bytes with e2b's
// code-interpreter transcripts: json.dumps with default separators, fields in e2b's order.
func TestKernelWireFormat(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "kernel.py")
	if err := os.WriteFile(script, kernel.Source(), 0o644); err != nil {
		t.Fatal(err)
	}
	in := strings.Join([]string{
		`{"id": 1, "code": "print('hi')\n1+1"}`,
		`{"id": 2, "code": "x"}`,
		`{"id": 3, "code": "'quoted'"}`,
	}, "\n") + "\n"
	cmd := exec.Command(DefaultPython, "-I", "-B", script, `{"memory": 2147483648}`)
	cmd.Stdin = strings.NewReader(in)
	cmd.Env = []string{"LANG=C.UTF-8"}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kernel: %v", err)
	}
	ts := `"timestamp": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00"`
	want := []string{
		`^\{"type": "ready"\}$`,
		`^\{"type": "number_of_executions", "execution_count": 1\}$`,
		`^\{"type": "stdout", "text": "hi\\n", ` + ts + `\}$`,
		`^\{"type": "result", "text": "2", "extra": \{\}, "is_main_result": true\}$`,
		`^\{"type": "end_of_execution"\}$`,
		`^\{"type": "number_of_executions", "execution_count": 2\}$`,
		`^\{"type": "error", "name": "NameError", "value": "name 'x' is not defined", "traceback": "Traceback \(most recent call last\):\\n  File \\"Cell In\[2\]\\", line 1, in <module>\\n    x\\nNameError: name 'x' is not defined\\n"\}$`,
		`^\{"type": "end_of_execution"\}$`,
		`^\{"type": "number_of_executions", "execution_count": 3\}$`,
		`^\{"type": "result", "text": "quoted", "extra": \{\}, "is_main_result": true\}$`,
		`^\{"type": "end_of_execution"\}$`,
	}
	lines := bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n"))
	if len(lines) != len(want) {
		t.Fatalf("got %d lines; want %d:\n%s", len(lines), len(want), out)
	}
	for i, re := range want {
		if !regexp.MustCompile(re).Match(lines[i]) {
			t.Errorf("line %d = %s; want match for %s", i+1, lines[i], re)
		}
	}
}
