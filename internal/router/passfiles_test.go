package router

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

// A request without code_interpreter to a Responses upstream passes through, its parts that
// name the caller's Files API files carrying the files instead: streamed or not, with or
// without an interceptor. Ids the proxy does not hold, another key's included, go as sent.
func TestPassThroughInlinesTheCallersFiles(t *testing.T) {
	for _, withEngine := range []bool{false, true} {
		name := "no interceptor"
		if withEngine {
			name = "interceptor declines"
		}
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				if gjson.GetBytes(b, "stream").Bool() {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = w.Write([]byte("event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n"))
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"id":"resp_up","object":"response","status":"completed","output":[]}`))
			})
			st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			p := newProxy(t, testConfig(up.URL+"/v1"), func(o *Options) {
				o.Files = st
				if withEngine {
					o.Interceptor = intercept.New(intercept.Options{Files: st, Store: st})
				}
			})
			fp := &filesProxy{proxy: p, store: st}
			ctx := context.Background()
			png := "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01"
			pdf := "%PDF-1.4\n1 0 obj <<>> endobj\n"
			upload := func(key, name, data string) string {
				c := client(fp, key)
				f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(data), name, "application/octet-stream"), Purpose: openai.FilePurposeUserData})
				if err != nil {
					t.Fatal(err)
				}
				return f.ID
			}
			img, doc, theirs := upload("sk-alice", "photo.png", png), upload("sk-alice", "report.pdf", pdf), upload("sk-bob", "secret.pdf", pdf)
			notImage := upload("sk-alice", "fake.png", "just text")

			body := func(stream bool, parts string) string {
				s := "false"
				if stream {
					s = "true"
				}
				return `{"model":"gpt-test","stream":` + s + `,"input":[{"role":"user","content":[{"type":"input_text","text":"look"},` + parts + `]},` +
					`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":[{"type":"input_file","file_id":"` + doc + `"}]}]}`
			}
			parts := `{"type":"input_image","file_id":"` + img + `","detail":"high"},{"type":"input_file","file_id":"` + doc + `"},` +
				`{"type":"input_file","file_id":"file-issuedbytheupstream"},{"type":"input_file","file_id":"` + theirs + `"}`
			for i, stream := range []bool{false, true} {
				status, hdr, resp := p.do(t, "POST", "/v1/responses", body(stream, parts), "Authorization", "Bearer sk-alice")
				if status != 200 || (stream && !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream")) {
					t.Fatalf("stream=%v: %d %s", stream, status, resp)
				}
				got := up.requests()[i].Body
				user := gjson.GetBytes(got, "input.0.content")
				pdfURL := "data:application/pdf;base64," + base64.StdEncoding.EncodeToString([]byte(pdf))
				checks := []struct {
					path, want string
				}{
					{"1.image_url", "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte(png))},
					{"1.detail", "high"},
					{"2.file_data", pdfURL},
					{"2.filename", "report.pdf"},
					{"3.file_id", "file-issuedbytheupstream"},
					{"4.file_id", theirs}, // bob's: alice may not read it
				}
				for _, c := range checks {
					if v := user.Get(c.path).String(); v != c.want {
						t.Errorf("stream=%v: upstream's %s = %.60q; want %.60q", stream, c.path, v, c.want)
					}
				}
				if gjson.GetBytes(got, "input.2.output.0.file_data").String() != pdfURL || strings.Contains(string(got), img) || strings.Contains(string(got), doc) {
					t.Errorf("stream=%v: the upstream got %s", stream, got)
				}
				if v := gjson.GetBytes(got, "stream").Bool(); v != stream {
					t.Errorf("stream sent as %v", v)
				}
			}

			// A file the upstream could not take is the client's error, and nothing goes upstream.
			status, _, resp := p.do(t, "POST", "/v1/responses", body(false, `{"type":"input_image","file_id":"`+notImage+`"}`), "Authorization", "Bearer sk-alice")
			if _, _, param, code := decodeError(t, resp); status != 400 || code != "unsupported_image_media_type" || param != "input[0].content[1].file_id" {
				t.Errorf("not an image: %d %s", status, resp)
			}
			// Bob's own id is his to use.
			if status, _, resp := p.do(t, "POST", "/v1/responses", body(false, `{"type":"input_file","file_id":"`+theirs+`"}`), "Authorization", "Bearer sk-bob"); status != 200 {
				t.Fatalf("bob: %d %s", status, resp)
			}
			reqs := up.requests()
			if len(reqs) != 3 || gjson.GetBytes(reqs[2].Body, "input.0.content.1.filename").String() != "secret.pdf" {
				t.Errorf("%d upstream requests; the last %.200s", len(reqs), reqs[len(reqs)-1].Body)
			}
		})
	}
}
