package intercept

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/store"
)

// TestFilesThroughRealContainers runs the files path on each real backend (the local sandbox,
// and e2b through its emulator), through containers.Manager: a Files API file and an inline
// input_file placed before the code runs, the files the code writes collected, cited and
// readable from the container, and the same file not placed twice when the conversation goes on.
func TestFilesThroughRealContainers(t *testing.T) {
	for _, backend := range []struct {
		name string
		opt  harnessOpt
	}{{"local", withLocal()}, {"e2b", withE2B()}} {
		t.Run(backend.name, func(t *testing.T) {
			h := newHarness(t, backend.opt)
			ctx := context.Background()
			up, err := h.state.BeginFile(ctx, "k", store.FileLimits{})
			if err != nil {
				t.Fatal(err)
			}
			defer up.Abort()
			if _, err := up.Write(ctx, strings.NewReader("north,3\nsouth,7\n")); err != nil {
				t.Fatal(err)
			}
			f, err := up.Commit(ctx, store.File{Filename: "sales.csv", Purpose: "user_data"})
			if err != nil {
				t.Fatal(err)
			}

			code := "data = open('/mnt/data/sales.csv').read()\n" +
				"open('/mnt/data/out.csv', 'w').write(data.upper())\n" +
				"open('/mnt/data/img.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n')\n" +
				"print(open('/mnt/data/notes.txt').read())"
			h.up.Enqueue(calls(code), text("Here: [out](sandbox:/mnt/data/out.csv)"))
			inline := base64.StdEncoding.EncodeToString([]byte("inline notes"))
			tool := `"tools":[{"type":"code_interpreter","container":{"type":"auto","file_ids":["` + f.ID + `"]}}]`
			b := `{"model":"gpt-test",` + tool + `,"include":["code_interpreter_call.outputs"],"input":[{"role":"user","content":[` +
				`{"type":"input_text","text":"go"},{"type":"input_file","filename":"notes.txt","file_data":"` + inline + `"}]}]}`
			status, resp := h.post(b, "k")
			if status != 200 {
				t.Fatalf("status %d: %s", status, resp)
			}
			if logs := gjson.GetBytes(resp, "output.0.outputs.0.logs").String(); logs != "inline notes\n" {
				t.Fatalf("the code printed %q; outputs %s", logs, gjson.GetBytes(resp, "output.0.outputs").Raw)
			}
			if out := lastFunctionOutput(h.up.Requests()[1]); !strings.Contains(out, "link it as sandbox:/mnt/data/out.csv") || !strings.Contains(out, "/mnt/data/img.png") {
				t.Errorf("the model was told %q", out)
			}
			cid := gjson.GetBytes(resp, "output.0.container_id").String()
			cites := citationsOf(resp)
			if len(cites) != 2 || cites[0].Get("filename").String() != "out.csv" || cites[1].Get("start_index").Int() != 0 {
				t.Fatalf("citations %v", cites)
			}
			for i, want := range []string{"NORTH,3\nSOUTH,7\n", "\x89PNG\r\n\x1a\n"} {
				var buf bytes.Buffer
				if _, _, err := h.sess.ReadFile(ctx, "k", cid, cites[i].Get("file_id").String(), &buf, 1<<20); err != nil || buf.String() != want {
					t.Errorf("citation %d reads %q (%v), want %q", i, buf.String(), err, want)
				}
				if cites[i].Get("container_id").String() != cid {
					t.Errorf("citation %d names container %s, want %s", i, cites[i].Get("container_id"), cid)
				}
			}

			// The conversation goes on with the same tool: its file is not placed again.
			h.up.Enqueue(text("Still [out](sandbox:/mnt/data/out.csv)."))
			status, resp = h.post(`{"model":"gpt-test",`+tool+`,"input":"again","previous_response_id":"`+gjson.GetBytes(resp, "id").String()+`"}`, "k")
			if status != 200 {
				t.Fatalf("second turn: %d %s", status, resp)
			}
			l, err := h.sess.Files(ctx, "k", cid, store.ContainerFileQuery{})
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for _, cf := range l.Items {
				paths = append(paths, cf.Path)
			}
			if len(paths) != 4 {
				t.Errorf("the container holds %v; want sales.csv, notes.txt, out.csv and img.png once each", paths)
			}
			if !strings.Contains(standInDescription(h.up.Requests()[2]), "/mnt/data/sales.csv (16 bytes)") {
				t.Errorf("second turn's description %q", standInDescription(h.up.Requests()[2]))
			}
			if c := citationsOf(resp); len(c) != 1 || c[0].Get("filename").String() != "out.csv" {
				t.Errorf("second turn's citations %v", c)
			}
		})
	}
}
