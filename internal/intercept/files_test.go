package intercept

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/inputfiles"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// setFiles gives the engine (with fake containers) the Files API files of callers:
// caller → file id → (name, content).
func (h *harness) setFiles(files map[string]map[string][2]string) {
	ff := storetest.NewMemFiles()
	for owner, byID := range files {
		for id, nc := range byID {
			ff.Add(owner, id, nc[0], nc[1], int64(len(nc[1])))
			h.fake.stored[id] = nc[1]
		}
	}
	h.eng.files = ff
}

func filesHarness(t *testing.T, opts ...harnessOpt) *harness {
	h := newHarness(t, opts...)
	h.setFiles(map[string]map[string][2]string{
		"k": {"file-sales": {"sales.csv", "region,amount\nnorth,3\n"}, "file-other": {"sales.csv", "x\n"}, "file-notes": {"notes.txt", "hello"},
			"file-png": {"photo.png", pngData}, "file-empty": {"empty.png", ""}},
		"other": {"file-theirs": {"secret.csv", "no"}, "file-theirpng": {"theirs.png", pngData}},
	})
	return h
}

// pngData is enough of a PNG for its type to be recognised.
const pngData = "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01"

// pngURL is pngData as the data URL an upstream is given.
var pngURL = "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte(pngData))

func toolWithFiles(ids string) string {
	return `{"model":"gpt-test","input":"analyse","tools":[{"type":"code_interpreter","container":{"type":"auto","file_ids":[` + ids + `]}}]`
}

// upstreamText returns the whole body of the upstream request, for checks that an id never
// reached it.
func upstreamText(r upstreamtest.Request) string { return string(r.Body) }

// standInDescription returns the stand-in function's description, as a Responses or a Chat
// Completions request carries it.
func standInDescription(r upstreamtest.Request) string {
	t := gjson.ParseBytes(r.Tool("python"))
	if d := t.Get("description"); d.Exists() {
		return d.String()
	}
	return t.Get("function.description").String()
}

// userText returns the text of the user messages the model saw, joined.
func userText(r upstreamtest.Request) string {
	var b strings.Builder
	for _, it := range r.History {
		m := gjson.ParseBytes(it)
		if m.Get("role").String() != "user" {
			continue
		}
		if c := m.Get("content"); c.Type == gjson.String {
			b.WriteString(c.String())
		} else {
			c.ForEach(func(_, p gjson.Result) bool {
				b.WriteString(p.Get("text").String())
				return true
			})
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// lastFunctionOutput returns the last function_call_output the model saw.
func lastFunctionOutput(r upstreamtest.Request) string {
	for i := len(r.History) - 1; i >= 0; i-- {
		if it := gjson.ParseBytes(r.History[i]); it.Get("type").String() == "function_call_output" {
			return it.Get("output").String()
		}
	}
	return ""
}

func TestFileIDsArePlacedBeforeTheFirstCode(t *testing.T) {
	forEachAPI(t, testFileIDsArePlacedBeforeTheFirstCode)
}

func testFileIDsArePlacedBeforeTheFirstCode(t *testing.T, api upstreamAPI) {
	h := filesHarness(t, onAPI(api))
	var sawAtRun string
	h.fake.setRun(func(_ context.Context, code string) (sandbox.Result, error) {
		// The file is in /mnt/data when the first code runs.
		sawAtRun, _ = h.fake.fileData(h.fake.onlyBox(), "sales.csv")
		return sandbox.Result{Stdout: "ok"}, nil
	})
	h.up.Enqueue(calls("open('/mnt/data/sales.csv').read()"), text("done"))
	status, resp := h.post(toolWithFiles(`"file-sales","file-notes","file-sales"`)+`}`, "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	if sawAtRun != "region,amount\nnorth,3\n" {
		t.Errorf("the code saw %q in /mnt/data/sales.csv", sawAtRun)
	}
	if n := h.fake.placements(); n != 2 {
		t.Errorf("%d files placed, want 2 (a repeated id once)", n)
	}
	reqs := h.up.Requests()
	desc := standInDescription(reqs[0])
	for _, want := range []string{"/mnt/data/sales.csv (22 bytes)", "/mnt/data/notes.txt (5 bytes)"} {
		if !strings.Contains(desc, want) {
			t.Errorf("the stand-in's description does not tell the model of %s: %q", want, desc)
		}
	}
	for _, r := range reqs {
		if s := upstreamText(r); strings.Contains(s, "file-sales") || strings.Contains(s, "file_ids") {
			t.Errorf("a file id reached the upstream: %s", s)
		}
	}
	// The client's tools are echoed as sent.
	if got := gjson.GetBytes(resp, "tools.0.container.file_ids.0").String(); got != "file-sales" {
		t.Errorf("tools echoed %s", gjson.GetBytes(resp, "tools").Raw)
	}
}

func TestFileNameClashIsDisambiguated(t *testing.T) {
	h := filesHarness(t)
	h.up.Enqueue(text("ok"))
	if status, resp := h.post(toolWithFiles(`"file-sales","file-other"`)+`}`, "k"); status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	desc := standInDescription(h.up.Requests()[0])
	if !strings.Contains(desc, "/mnt/data/sales.csv (22 bytes)") || !strings.Contains(desc, "/mnt/data/sales (1).csv (2 bytes)") {
		t.Errorf("description %q; want both files under distinct names", desc)
	}
}

func TestBadFileIDs(t *testing.T) {
	many := strings.Repeat(`"file-sales",`, MaxFileIDs) + `"file-sales"`
	tests := []struct {
		name        string
		body        string
		caller      string
		status      int
		param, code string
	}{
		{"unknown id", toolWithFiles(`"file-nope"`) + `}`, "k", 404, "tools[0].container.file_ids", ""},
		{"another caller's", toolWithFiles(`"file-theirs"`) + `}`, "k", 404, "tools[0].container.file_ids", ""},
		{"too many", toolWithFiles(many) + `}`, "k", 400, "tools[0].container.file_ids", "array_above_max_length"},
		{"not an array", `{"model":"gpt-test","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto","file_ids":"file-sales"}}]}`, "k", 400, "tools[0].container.file_ids", "invalid_type"},
		{"not a string", toolWithFiles(`7`) + `}`, "k", 400, "tools[0].container.file_ids[0]", "invalid_type"},
		{"unknown input file", `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"input":[{"role":"user","content":[{"type":"input_text","text":"x"},{"type":"input_file","file_id":"file-nope"}]}]}`, "k", 404, "input[0].content[1].file_id", ""},
		{"inline without a filename", `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"input":[{"role":"user","content":[{"type":"input_file","file_data":"aGk="}]}]}`, "k", 400, "input[0].content[0].filename", "missing_required_parameter"},
		{"inline not base64", `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"input":[{"role":"user","content":[{"type":"input_file","filename":"a.txt","file_data":"data:text/plain;base64,**"}]}]}`, "k", 400, "input[0].content[0].file_data", "invalid_value"},
		{"inline bad filename", `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"input":[{"role":"user","content":[{"type":"input_file","filename":"..","file_data":"aGk="}]}]}`, "k", 400, "input[0].content[0].filename", "invalid_filename"},
		{"unknown image", withCode(`{"role":"user","content":[{"type":"input_text","text":"x"},{"type":"input_image","file_id":"file-nope"}]}`), "k", 404, "input[0].content[1].file_id", ""},
		{"another caller's image", withCode(`{"role":"user","content":[{"type":"input_image","file_id":"file-theirpng","detail":"auto"}]}`), "k", 404, "input[0].content[0].file_id", ""},
		{"unknown file in a function output", withCode(callAndOutput(`{"type":"input_text","text":"x"},{"type":"input_file","file_id":"file-nope"}`)), "k", 404, "input[2].output[1].file_id", ""},
		{"another caller's image in a function output", withCode(callAndOutput(`{"type":"input_image","file_id":"file-theirpng"}`)), "k", 404, "input[2].output[0].file_id", ""},
		{"inline file in a function output without a filename", withCode(callAndOutput(`{"type":"input_file","file_data":"aGk="}`)), "k", 400, "input[2].output[0].filename", "missing_required_parameter"},
		{"an image that is not one", withCode(`{"role":"user","content":[{"type":"input_image","file_id":"file-sales"}]}`), "k", 400, "input[0].content[0].file_id", "unsupported_image_media_type"},
		{"an empty image", withCode(`{"role":"user","content":[{"type":"input_image","file_id":"file-empty"}]}`), "k", 400, "input[0].content[0].file_id", "empty_image_file"},
		{"too many images for the container", withCode(`{"role":"user","content":[` + strings.Repeat(`{"type":"input_image","file_id":"file-png"},`, maxPlacedFiles) + `{"type":"input_image","file_id":"file-png"}]}`), "k", 400, "input", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := filesHarness(t)
			status, resp := h.post(tt.body, tt.caller)
			if status != tt.status {
				t.Fatalf("status %d, want %d: %s", status, tt.status, resp)
			}
			if p := gjson.GetBytes(resp, "error.param").String(); p != tt.param {
				t.Errorf("param %q, want %q: %s", p, tt.param, resp)
			}
			if c := gjson.GetBytes(resp, "error.code").String(); c != tt.code {
				t.Errorf("code %q, want %q", c, tt.code)
			}
			if tt.status == 404 && !strings.Contains(gjson.GetBytes(resp, "error.message").String(), "No such File object") {
				t.Errorf("message %s", gjson.GetBytes(resp, "error.message").Raw)
			}
			if n := len(h.up.Requests()); n != 0 {
				t.Errorf("%d upstream calls; want none", n)
			}
			if n := h.fake.Created(); n != 0 {
				t.Errorf("%d containers created; want none", n)
			}
			if len(h.fake.Codes()) != 0 {
				t.Error("code ran")
			}
		})
	}
}

func TestInputFilesArePlacedAndNamedUpstream(t *testing.T) {
	forEachAPI(t, testInputFilesArePlacedAndNamedUpstream)
}

func testInputFilesArePlacedAndNamedUpstream(t *testing.T, api upstreamAPI) {
	h := filesHarness(t, onAPI(api))
	h.up.Enqueue(calls("1"), text("ok"))
	inline := base64.StdEncoding.EncodeToString([]byte("a,b\n1,2\n"))
	byURL := `,{"type":"input_file","file_url":"https://example.com/a.pdf"}`
	if api.chat {
		byURL = "" // Chat Completions has no files by URL (a 400)
	}
	b := `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto"}}],"input":[
		{"role":"user","content":[{"type":"input_text","text":"compare"},{"type":"input_file","file_id":"file-notes"},
		 {"type":"input_file","filename":"dir/inline.csv","file_data":"data:text/csv;base64,` + inline + `"}` + byURL + `]}]}`
	status, resp := h.post(b, "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	cid := h.fake.onlyBox()
	if got, _ := h.fake.fileData(cid, "notes.txt"); got != "hello" {
		t.Errorf("notes.txt in the container = %q", got)
	}
	if got, _ := h.fake.fileData(cid, "inline.csv"); got != "a,b\n1,2\n" {
		t.Errorf("inline.csv in the container = %q", got)
	}
	for i, r := range h.up.Requests() {
		text := userText(r)
		if !strings.Contains(text, "compare") || !strings.Contains(text, "at /mnt/data/notes.txt (5 bytes)") || !strings.Contains(text, "at /mnt/data/inline.csv (8 bytes)") {
			t.Errorf("request %d: the model read %q", i, text)
		}
		if !api.chat {
			if content := gjson.GetBytes(r.Input[0], "content"); content.Get("1.type").String() != "input_text" || content.Get("3.file_url").String() != "https://example.com/a.pdf" {
				t.Errorf("request %d: parts upstream %s; want text parts for the files, a file_url part as sent", i, content.Raw)
			}
		}
		if s := upstreamText(r); strings.Contains(s, "file-notes") || strings.Contains(s, inline) {
			t.Errorf("request %d: a file id or the inline data reached the upstream", i)
		}
	}
}

// withCode is a request with the code_interpreter tool, a client function "lookup", and items.
func withCode(items string) string {
	return `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto"}},` +
		`{"type":"function","name":"lookup","parameters":{"type":"object","properties":{}}}],"input":[` + items + `]}`
}

// callAndOutput is a user message, a call of the client's function lookup, and its output made
// of parts.
func callAndOutput(parts string) string {
	return `{"role":"user","content":"look it up"},{"type":"function_call","call_id":"call_1","name":"lookup","arguments":"{}"},` +
		`{"type":"function_call_output","call_id":"call_1","output":[` + parts + `]}`
}

// chatUserParts returns the content parts of the first user message of a Chat Completions request.
func chatUserParts(r upstreamtest.Request) gjson.Result {
	for _, m := range r.Messages {
		if gjson.GetBytes(m, "role").String() == "user" {
			return gjson.GetBytes(m, "content")
		}
	}
	return gjson.Result{}
}

func TestImagesByFileIDGoUpstreamAsDataURLs(t *testing.T) {
	forEachAPI(t, testImagesByFileIDGoUpstreamAsDataURLs)
}

func testImagesByFileIDGoUpstreamAsDataURLs(t *testing.T, api upstreamAPI) {
	h := filesHarness(t, onAPI(api))
	h.up.Enqueue(calls("1"), text("ok"))
	status, resp := h.post(withCode(`{"role":"user","content":[{"type":"input_text","text":"look"},`+
		`{"type":"input_image","file_id":"file-png","detail":"low"},{"type":"input_file","file_id":"file-notes"}]}`), "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	// The image is placed too, beside the file.
	cid := h.fake.onlyBox()
	if got, _ := h.fake.fileData(cid, "photo.png"); got != pngData {
		t.Errorf("photo.png in the container = %q", got)
	}
	if got, _ := h.fake.fileData(cid, "notes.txt"); got != "hello" {
		t.Errorf("notes.txt in the container = %q", got)
	}
	imageNote := fmt.Sprintf("[The image above is also available to the python tool at /mnt/data/photo.png (%d bytes).]", len(pngData))
	fileNote := "[File attached by the user, available to the python tool at /mnt/data/notes.txt (5 bytes).]"
	reqs := h.up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d upstream requests, want 2", len(reqs))
	}
	for i, r := range reqs {
		// Every call carries the image's bytes, the note after it, and the file's note, in order.
		var want []string
		var got []string
		if api.chat {
			want = []string{"text:look", "image_url:" + pngURL + ":low", "text:" + imageNote, "text:" + fileNote}
			chatUserParts(r).ForEach(func(_, p gjson.Result) bool {
				switch p.Get("type").String() {
				case "text":
					got = append(got, "text:"+p.Get("text").String())
				case "image_url":
					got = append(got, "image_url:"+p.Get("image_url.url").String()+":"+p.Get("image_url.detail").String())
				default:
					got = append(got, p.Raw)
				}
				return true
			})
		} else {
			want = []string{"input_text:look", "input_image:" + pngURL + ":low:false", "input_text:" + imageNote, "input_text:" + fileNote}
			gjson.GetBytes(r.Input[0], "content").ForEach(func(_, p gjson.Result) bool {
				switch p.Get("type").String() {
				case "input_text":
					got = append(got, "input_text:"+p.Get("text").String())
				case "input_image":
					got = append(got, fmt.Sprintf("input_image:%s:%s:%v", p.Get("image_url").String(), p.Get("detail").String(), p.Get("file_id").Exists()))
				default:
					got = append(got, p.Raw)
				}
				return true
			})
		}
		if !slices.Equal(got, want) {
			t.Errorf("request %d: the user's parts upstream are\n%q\nwant\n%q", i, got, want)
		}
		if s := upstreamText(r); strings.Contains(s, "file-png") || strings.Contains(s, "file-notes") {
			t.Errorf("request %d: a file id reached the upstream", i)
		}
	}
}

func TestFunctionOutputFilesArePlaced(t *testing.T) {
	forEachAPI(t, testFunctionOutputFilesArePlaced)
}

func testFunctionOutputFilesArePlaced(t *testing.T, api upstreamAPI) {
	h := filesHarness(t, onAPI(api))
	h.up.Enqueue(calls("1"), text("ok"))
	inline := base64.StdEncoding.EncodeToString([]byte("a,b\n"))
	status, resp := h.post(withCode(callAndOutput(`{"type":"input_text","text":"found:"},{"type":"input_file","file_id":"file-sales"},`+
		`{"type":"input_file","filename":"extra.csv","file_data":"data:text/csv;base64,`+inline+`"}`)), "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	cid := h.fake.onlyBox()
	for name, want := range map[string]string{"sales.csv": "region,amount\nnorth,3\n", "extra.csv": "a,b\n"} {
		if got, _ := h.fake.fileData(cid, name); got != want {
			t.Errorf("%s in the container = %q, want %q", name, got, want)
		}
	}
	r := h.up.Requests()[0]
	out, ok := r.FunctionOutput("call_1")
	if !ok {
		t.Fatal("the function output did not reach the upstream")
	}
	wantParts := []string{"found:",
		"[File in this function output, available to the python tool at /mnt/data/sales.csv (22 bytes).]",
		"[File in this function output, available to the python tool at /mnt/data/extra.csv (4 bytes).]"}
	if api.chat {
		// A tool message is text: the parts joined.
		if want := strings.Join(wantParts, ""); out != want {
			t.Errorf("the tool message is %q, want %q", out, want)
		}
	} else {
		var got []string
		gjson.Parse(out).ForEach(func(_, p gjson.Result) bool {
			got = append(got, p.Get("type").String()+":"+p.Get("text").String())
			return true
		})
		want := []string{"input_text:" + wantParts[0], "input_text:" + wantParts[1], "input_text:" + wantParts[2]}
		if !slices.Equal(got, want) {
			t.Errorf("the function output upstream is %q, want %q", got, want)
		}
	}
	if s := upstreamText(r); strings.Contains(s, "file-sales") || strings.Contains(s, inline) {
		t.Error("a file id or the inline data reached the upstream")
	}
}

func TestAnImageInAFunctionOutput(t *testing.T) {
	forEachAPI(t, func(t *testing.T, api upstreamAPI) {
		h := filesHarness(t, onAPI(api))
		h.up.Enqueue(text("ok"))
		status, resp := h.post(withCode(callAndOutput(`{"type":"input_image","file_id":"file-png"}`)), "k")
		if api.chat {
			// Chat Completions tool messages hold text only: the translator's refusal, not a file's.
			if status != 400 || gjson.GetBytes(resp, "error.param").String() != "input[2].output[0].type" {
				t.Fatalf("status %d: %s", status, resp)
			}
			return
		}
		if status != 200 {
			t.Fatalf("status %d: %s", status, resp)
		}
		out, _ := h.up.Requests()[0].FunctionOutput("call_1")
		parts := gjson.Parse(out)
		if parts.Get("0.image_url").String() != pngURL || parts.Get("0.file_id").Exists() || !strings.Contains(parts.Get("1.text").String(), "at /mnt/data/photo.png") {
			t.Errorf("the function output upstream is %s", out)
		}
	})
}

func TestImagesByFileIDWithoutCodeInterpreter(t *testing.T) {
	// A stateless upstream's every request is the engine's: an image by file_id works there too,
	// and no container is made for it.
	for _, api := range []upstreamAPI{vllmAPI, llamaCppAPI} {
		t.Run(api.name, func(t *testing.T) {
			h := filesHarness(t, onAPI(api))
			h.up.Enqueue(text("a pixel"))
			in := `{"model":"gpt-test","input":[{"role":"user","content":[{"type":"input_text","text":"what is it?"},{"type":"input_image","file_id":"file-png"}]}]}`
			status, resp := h.post(in, "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			parts := chatUserParts(h.up.Requests()[0])
			if parts.Get("1.type").String() != "image_url" || parts.Get("1.image_url.url").String() != pngURL || parts.Get("#").Int() != 2 {
				t.Errorf("the user's parts upstream are %s", parts.Raw)
			}
			if n := h.fake.Created(); n != 0 {
				t.Errorf("%d containers created; want none", n)
			}
			status, resp = h.post(strings.Replace(in, "file-png", "file-theirpng", 1), "k")
			if status != 404 || gjson.GetBytes(resp, "error.param").String() != "input[0].content[1].file_id" {
				t.Errorf("another caller's image: %d %s", status, resp)
			}
			many := `{"model":"gpt-test","input":[{"role":"user","content":[` + strings.Repeat(`{"type":"input_image","file_id":"file-png"},`, inputfiles.MaxInputImages) + `{"type":"input_image","file_id":"file-png"}]}]}`
			if status, resp = h.post(many, "k"); status != 400 || gjson.GetBytes(resp, "error.param").String() != "input" {
				t.Errorf("too many images: %d %s", status, resp)
			}
			if n := len(h.up.Requests()); n != 1 {
				t.Errorf("%d upstream requests; want the first only", n)
			}
		})
	}
}

func TestInputFilesByFileIDWithoutCodeInterpreter(t *testing.T) {
	// Without code_interpreter a file goes to no container: a stateless upstream gets its bytes
	// as file_data (a Chat Completions file part), under its stored name unless the client named it.
	h := filesHarness(t, onAPI(vllmAPI))
	h.up.Enqueue(text("read"), text("read"))
	in := `{"model":"gpt-test","input":[{"role":"user","content":[{"type":"input_text","text":"read it"},{"type":"input_file","file_id":"file-notes"}]}]}`
	named := strings.Replace(in, `"file_id":"file-notes"`, `"file_id":"file-notes","filename":"mine.txt"`, 1)
	want := "data:text/plain;base64," + base64.StdEncoding.EncodeToString([]byte("hello"))
	for i, tt := range []struct{ body, name string }{{in, "notes.txt"}, {named, "mine.txt"}} {
		if status, resp := h.post(tt.body, "k"); status != 200 {
			t.Fatalf("status %d: %s", status, resp)
		}
		req := h.up.Requests()[i]
		parts := chatUserParts(req)
		if parts.Get("1.type").String() != "file" || parts.Get("1.file.file_data").String() != want || parts.Get("1.file.filename").String() != tt.name ||
			strings.Contains(upstreamText(req), "file-notes") {
			t.Errorf("the user's parts upstream are %s", parts.Raw)
		}
	}
	if n := h.fake.Created(); n != 0 {
		t.Errorf("%d containers created; want none", n)
	}
	status, resp := h.post(strings.Replace(in, "file-notes", "file-theirs", 1), "k")
	if status != 404 || gjson.GetBytes(resp, "error.param").String() != "input[0].content[1].file_id" {
		t.Errorf("another caller's file: %d %s", status, resp)
	}
	if n := len(h.up.Requests()); n != 2 {
		t.Errorf("%d upstream requests; want 2", n)
	}
}

func TestStatelessReplayOfAnInputFileReusesItsPlacement(t *testing.T) {
	h := filesHarness(t)
	h.up.Enqueue(calls("1"), text("first"))
	msg := `{"role":"user","content":[{"type":"input_file","file_id":"file-notes"}]}`
	tool := `"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]`
	status, resp := h.post(`{"model":"gpt-test","store":false,`+tool+`,"input":[`+msg+`]}`, "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	// The client sends everything back, as a stateless client does, with one more message.
	var items []string
	items = append(items, msg)
	gjson.GetBytes(resp, "output").ForEach(func(_, it gjson.Result) bool {
		items = append(items, it.Raw)
		return true
	})
	items = append(items, `{"role":"user","content":"again"}`)
	h.up.Enqueue(calls("2"), text("second"))
	status, resp = h.post(`{"model":"gpt-test","store":false,`+tool+`,"input":[`+strings.Join(items, ",")+`]}`, "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	if n := h.fake.Created(); n != 1 {
		t.Errorf("%d containers created; want the context's one reused", n)
	}
	if n := h.fake.placements(); n != 1 {
		t.Errorf("the file was written %d times; want once", n)
	}
	last := h.up.Requests()[len(h.up.Requests())-1]
	if got := gjson.GetBytes(last.Input[0], "content.0.text").String(); !strings.Contains(got, "/mnt/data/notes.txt") {
		t.Errorf("the replayed note names %q", got)
	}
}

func TestPlacementErrors(t *testing.T) {
	t.Run("too large", func(t *testing.T) {
		h := filesHarness(t)
		h.fake.maxFile = 3
		status, resp := h.post(toolWithFiles(`"file-sales"`)+`}`, "k")
		if status != 400 || gjson.GetBytes(resp, "error.code").String() != "file_too_large" {
			t.Fatalf("status %d: %s", status, resp)
		}
		if len(h.up.Requests()) != 0 || len(h.fake.Codes()) != 0 {
			t.Error("the request went on")
		}
	})
	t.Run("too large, named by its parameter", func(t *testing.T) {
		h := filesHarness(t)
		h.fake.maxFile = 10
		b := `{"model":"gpt-test","tools":[{"type":"code_interpreter","container":{"type":"auto","file_ids":["file-notes"]}}],` +
			`"input":[{"role":"user","content":[{"type":"input_file","file_id":"file-sales"}]}]}`
		status, resp := h.post(b, "k")
		if status != 400 || gjson.GetBytes(resp, "error.param").String() != "input[0].content[0].file_id" {
			t.Fatalf("status %d: %s", status, resp)
		}
	})
	t.Run("no sandbox", func(t *testing.T) {
		h := newHarness(t, noSandbox())
		h.setFiles(map[string]map[string][2]string{"k": {"file-sales": {"sales.csv", "x"}}})
		status, resp := h.post(toolWithFiles(`"file-sales"`)+`}`, "k")
		if status != http.StatusBadGateway || gjson.GetBytes(resp, "error.code").String() != "sandbox_unavailable" {
			t.Fatalf("status %d: %s", status, resp)
		}
	})
}

func TestAutoReusesTheContextsContainer(t *testing.T) {
	tool := `"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]`
	ciItem := func(id, cid string) string {
		return `{"type":"code_interpreter_call","id":"` + id + `","status":"completed","code":"x = 1","container_id":"` + cid + `","outputs":null}`
	}
	tests := []struct {
		name  string
		input func(h *harness, first []byte) string // the second request's input items
		reuse bool
	}{
		{"a call item sent back", func(_ *harness, first []byte) string {
			return gjson.GetBytes(first, "output.0").Raw
		}, true},
		{"a reference to a call", func(_ *harness, first []byte) string {
			return `{"type":"item_reference","id":"` + gjson.GetBytes(first, "output.0.id").String() + `"}`
		}, true},
		{"the latest of two", func(h *harness, first []byte) string {
			return ciItem("ci_old", "cntr_gone") + "," + gjson.GetBytes(first, "output.0").Raw
		}, true},
		{"a live one before a dead one", func(_ *harness, first []byte) string {
			return gjson.GetBytes(first, "output.0").Raw + "," + ciItem("ci_old", "cntr_gone")
		}, true},
		{"another caller's container", func(h *harness, _ []byte) string {
			c, _ := h.fake.Create(context.Background(), "local", "other", sandbox.CreateOptions{}, 0)
			return ciItem("ci_x", c.ID())
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.up.Enqueue(calls("x = 1"), text("set"))
			status, first := h.post(`{"model":"gpt-test","input":"go",`+tool+`}`, "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, first)
			}
			cid := gjson.GetBytes(first, "output.0.container_id").String()
			in := tt.input(h, first)
			before := h.fake.Created()
			h.up.Enqueue(calls("x"), text("again"))
			status, resp := h.post(`{"model":"gpt-test","store":false,`+tool+`,"input":[`+in+`,{"role":"user","content":"more"}]}`, "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			got := gjson.GetBytes(resp, "output.0.container_id").String()
			if tt.reuse && (got != cid || h.fake.Created() != before) {
				t.Errorf("container %s (created %d more), want %s reused", got, h.fake.Created()-before, cid)
			}
			if !tt.reuse && (got == cid || h.fake.Created() != before+1) {
				t.Errorf("container %s; want a new one", got)
			}
		})
	}
}
