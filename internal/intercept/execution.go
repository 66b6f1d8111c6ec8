package intercept

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Statuses of a code_interpreter_call item.
const (
	statusCompleted  = "completed"
	statusFailed     = "failed"
	statusIncomplete = "incomplete"
)

var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

// execution is one stand-in call's outcome, in the two forms that leave the proxy: the text the
// model is given and the outputs the client sees.
type execution struct {
	status string
	logs   string   // client-visible logs: what ran printed, returned and raised
	images []string // data URLs of the figures produced
	model  string   // the function_call_output text
}

// describe turns a sandbox result into an execution. runErr is Run's error (nil, or the reason the
// execution could not finish); limit is the model-output limit in bytes.
func describe(res sandbox.Result, runErr error, timeout time.Duration, limit int) execution {
	var b strings.Builder
	add := func(s string) {
		if s == "" {
			return
		}
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
		b.WriteString(s)
	}
	add(res.Stdout)
	add(res.Stderr)
	var images []string
	var imageLines []string
	for _, o := range res.Results {
		switch {
		case o.PNG != "":
			images = append(images, "data:image/png;base64,"+o.PNG)
			imageLines = append(imageLines, "[image/png produced: shown to the user]")
		case o.JPEG != "":
			images = append(images, "data:image/jpeg;base64,"+o.JPEG)
			imageLines = append(imageLines, "[image/jpeg produced: shown to the user]")
		case o.Text != "":
			add(o.Text)
		}
	}
	ex := execution{status: statusCompleted}
	if e := res.Error; e != nil {
		ex.status = statusFailed
		tb := ansiEscape.ReplaceAllString(e.Traceback, "")
		if strings.TrimSpace(tb) == "" {
			tb = e.Name + ": " + e.Value
		}
		add(tb)
	}
	var note string
	switch {
	case runErr == nil:
	case errors.Is(runErr, sandbox.ErrTimeout):
		ex.status = statusIncomplete
		note = "Execution timed out"
		if timeout > 0 {
			note += " after " + strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64) + " s"
		}
	default:
		ex.status = statusFailed
		note = "Execution failed: " + runFailure(runErr)
	}
	add(note)
	ex.logs = b.String()
	ex.images = images

	// The model sees the output up to the limit: its start and its end (where a traceback or
	// the final result is), and the note about a timeout or failure in full.
	model := b.String()
	if note != "" {
		model = strings.TrimSuffix(strings.TrimSuffix(model, note), "\n")
	}
	if limit > 0 && len(model) > limit {
		head := cutUTF8(model, limit/2)
		tail := model[len(model)-len(cutUTF8Tail(model, limit-len(head))):]
		model = head + fmt.Sprintf("\n[output truncated: %d of %d bytes shown]\n", len(head)+len(tail), len(model)) + tail
	}
	model = joinLines(append([]string{model}, append(imageLines, note)...)...)
	if model == "" {
		model = "[no output]"
	}
	ex.model = model
	return ex
}

// kernelRestartedNote opens what the model is told of an execution that ran in a fresh kernel: the
// container's was restarted while idle (kernel_idle_timeout), and code that relies on earlier
// variables fails without it knowing why otherwise.
const kernelRestartedNote = "[Note: the Python state was reset: this container's kernel was restarted after being idle, so variables, imports and functions of earlier executions are gone; files in /mnt/data are kept. Re-run what this code needs.]"

// maxWrittenLines bounds the files an execution's output lists for the model.
const maxWrittenLines = 20

// withWrittenFiles appends to what the model is told of an execution the files it created or
// changed under /mnt/data, with the link that cites each, and those the container could not keep.
func withWrittenFiles(model string, out containers.Outputs) string {
	files := out.Files
	if len(files) == 0 && len(out.Skipped) == 0 {
		return model
	}
	lines := make([]string, 0, min(len(files), maxWrittenLines)+2)
	for i, f := range files {
		if i == maxWrittenLines {
			lines = append(lines, fmt.Sprintf("[%d more files written under /mnt/data]", len(files)-i))
			break
		}
		lines = append(lines, fmt.Sprintf("[file written: %s (%d bytes); link it as sandbox:%s]", f.Path, f.Bytes, f.Path))
	}
	for i, p := range out.Skipped {
		if i == maxWrittenLines {
			lines = append(lines, fmt.Sprintf("[%d more files over the container's limits]", len(out.Skipped)-i))
			break
		}
		lines = append(lines, "[file over the container's limits, not available to the user: "+sandbox.DataDir+"/"+p+"]")
	}
	if model == "[no output]" {
		model = ""
	}
	return joinLines(append([]string{model}, lines...)...)
}

// runFailure is the client- and model-visible reason for a failed Run: never the internal error.
func runFailure(err error) string {
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return "the sandbox is gone (expired or deleted); its state was lost"
	case errors.Is(err, sandbox.ErrIncomplete):
		return "the kernel stopped before the execution finished (it may have run out of memory or crashed)"
	case errors.Is(err, sandbox.ErrRateLimited):
		return "the sandbox is busy; try again"
	default:
		return "the sandbox could not run the code"
	}
}

// joinLines joins the non-empty parts, each starting on a new line.
func joinLines(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		if p == "" {
			continue
		}
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
		b.WriteString(p)
	}
	return b.String()
}

func utf8Start(c byte) bool { return c&0xC0 != 0x80 }

// cutUTF8 returns the longest prefix of s of at most n bytes that does not split a character.
func cutUTF8(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8Start(s[n]) {
		n--
	}
	return s[:n]
}

// cutUTF8Tail returns the longest suffix of s of at most n bytes that does not split a character.
func cutUTF8Tail(s string, n int) string {
	if n >= len(s) {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8Start(s[i]) {
		i++
	}
	return s[i:]
}

// unparsed is the execution of a call whose arguments could not be read.
func unparsed(err error) execution {
	if ex, ok := tooLargeExecution(err); ok {
		return ex
	}
	msg := "could not parse the arguments: " + err.Error() + `. Call the function with a JSON object {"code": "<python code>"}.`
	return execution{status: statusFailed, logs: msg, model: msg}
}

// skipped is the execution of a call beyond max_tool_calls or the iteration limit.
func skipped() execution {
	msg := "Not executed: the limit of code executions for this response was reached. Answer with what you have."
	return execution{status: statusIncomplete, model: msg}
}
