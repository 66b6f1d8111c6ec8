package inputfiles

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

// inlineAll is Inline's body with its streams read into it, as an upstream receives it.
func inlineAll(ctx context.Context, files Store, owner string, body []byte) ([]byte, error) {
	in, err := Inline(ctx, files, owner, body)
	if err != nil {
		return nil, err
	}
	out := in.Body
	for _, s := range in.Streams {
		rc, err := s.Open(ctx)
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
		if int64(len(b)) != s.Size || bytes.Count(out, []byte(s.Mark)) != 1 {
			return nil, fmt.Errorf("stream %s: %d bytes, %d announced; %d marks", s.Mark, len(b), s.Size, bytes.Count(out, []byte(s.Mark)))
		}
		out = bytes.Replace(out, []byte(s.Mark), b, 1)
	}
	return out, nil
}

func TestInline(t *testing.T) {
	const pdf = "%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n"
	files := storetest.NewMemFiles()
	files.Add("k", "file-png", "photo.png", pngData, int64(len(pngData)))
	files.Add("k", "file-pdf", "report.pdf", pdf, int64(len(pdf)))
	files.Add("k", "file-json", "rows.json", `{"a":1}`, 7)
	files.Add("k", "file-notimage", "a.png", "hello", 5)
	files.Add("k", "file-huge", "big.pdf", pdf, MaxFileBytes+1)
	files.Add("other", "file-theirs", "secret.pdf", pdf, int64(len(pdf)))
	png, pdfURL := dataURL("image/png", pngData), dataURL("application/pdf", pdf)

	msg := func(parts string) string {
		return `{"model":"m", "input":[{"role":"user","content":[ {"type":"input_text","text":"hi"}, ` + parts + ` ]}], "stream":true}`
	}
	tests := []struct {
		name string
		body string
		want string // "": the body as sent
		code string // the API error's code, or "-" for an error that is not one
		par  string
	}{
		{name: "no file_id", body: msg(`{"type":"input_image","image_url":"https://x/y.png"}`)},
		{name: "string input", body: `{"model":"m","input":"what is file_id file-png?"}`},
		{name: "image", body: msg(`{"type":"input_image","detail":"low","file_id":"file-png"}`),
			want: msg(`{"type":"input_image","detail":"low","image_url":"` + png + `"}`)},
		{name: "an escaped key", body: msg(`{"type":"input_image","file\u005fid":"file-png"}`),
			want: msg(`{"type":"input_image","image_url":"` + png + `"}`)},
		{name: "an escaped text, no id", body: msg(`{"type":"input_text","text":"caf\u00e9"}`)},
		{name: "file, the stored name", body: msg(`{"type":"input_file","file_id":"file-pdf"}`),
			want: msg(`{"type":"input_file","filename":"report.pdf","file_data":"` + pdfURL + `"}`)},
		{name: "file, the client's name", body: msg(`{"type":"input_file","file_id":"file-pdf","filename":"q1.pdf"}`),
			want: msg(`{"type":"input_file","filename":"q1.pdf","file_data":"` + pdfURL + `"}`)},
		{name: "file typed by its name", body: msg(`{"type":"input_file","file_id":"file-json"}`),
			want: msg(`{"type":"input_file","filename":"rows.json","file_data":"` + dataURL("application/json", `{"a":1}`) + `"}`)},
		{name: "unknown id untouched", body: msg(`{"type":"input_file","file_id":"file-upstreams"}`)},
		{name: "another owner's id untouched", body: msg(`{"type":"input_file","file_id":"file-theirs"},{"type":"input_image","file_id":"file-theirs"}`)},
		{name: "not a file- id", body: msg(`{"type":"input_file","file_id":"assistant-abc"}`)},
		{name: "other part types", body: msg(`{"type":"input_text","text":"x","file_id":"file-png"}`)},
		{name: "non-string id", body: msg(`{"type":"input_image","file_id":7}`)},
		{name: "a function call's arguments", body: `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{\"file_id\":\"file-png\"}"}]}`},
		{name: "function output", body: `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","file_id":"file-png"},{"type":"input_file","file_id":"file-pdf"}]}]}`,
			want: `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"` + png + `"},{"type":"input_file","filename":"report.pdf","file_data":"` + pdfURL + `"}]}]}`},
		{name: "a typed message, several", body: `{"input":[{"type":"message","role":"user","content":[{"type":"input_image","file_id":"file-png"}]},{"type":"message","role":"user","content":[{"type":"input_image","file_id":"file-nope"},{"type":"input_image","file_id":"file-png"}]}]}`,
			want: `{"input":[{"type":"message","role":"user","content":[{"type":"input_image","image_url":"` + png + `"}]},{"type":"message","role":"user","content":[{"type":"input_image","file_id":"file-nope"},{"type":"input_image","image_url":"` + png + `"}]}]}`},
		{name: "not an image", body: msg(`{"type":"input_image","file_id":"file-notimage"}`), code: "unsupported_image_media_type", par: "input[0].content[1].file_id"},
		{name: "file too large", body: msg(`{"type":"input_file","file_id":"file-png"},{"type":"input_file","file_id":"file-huge"}`), code: "file_too_large", par: "input[0].content[2].file_id"},
		{name: "too many images", body: msg(strings.Repeat(`{"type":"input_image","file_id":"file-nope"},`, MaxInputImages+1) + strings.Repeat(`{"type":"input_image","file_id":"file-png"},`, MaxInputImages) + `{"type":"input_image","file_id":"file-png"}`), code: "", par: "input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := inlineAll(context.Background(), files, "k", []byte(tt.body))
			if tt.par != "" {
				var ae *apierror.Error
				if !errors.As(err, &ae) || ae.Status != 400 || ae.Code != tt.code || ae.Param != tt.par {
					t.Fatalf("Inline = %.100s, %v; want a 400 %q naming %s", out, err, tt.code, tt.par)
				}
				return
			}
			want := tt.want
			if want == "" {
				want = tt.body
			}
			if err != nil || string(out) != want {
				t.Fatalf("Inline = %v\n%s\nwant\n%s", err, out, want)
			}
		})
	}
}

func TestInlineLeavesAnUntouchedBodyUncopied(t *testing.T) {
	files := storetest.NewMemFiles()
	for _, body := range []string{
		`{"model":"m","input":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-nope"}]}]}`,
	} {
		in := []byte(body)
		got, err := Inline(context.Background(), files, "k", in)
		if err != nil || len(got.Streams) != 0 || &got.Body[0] != &in[0] || len(got.Body) != len(in) {
			t.Errorf("Inline(%s) = %+v, %v; want the same slice", body, got, err)
		}
		out, err := inlineAll(context.Background(), files, "k", in)
		if err != nil || &out[0] != &in[0] || len(out) != len(in) {
			t.Errorf("Inline(%s) = %s, %v; want the same slice", body, out, err)
		}
	}
}

func TestInlineCountsOnlyTheProxysImages(t *testing.T) {
	files := storetest.NewMemFiles()
	files.Add("k", "file-png", "photo.png", pngData, int64(len(pngData)))
	body := `{"input":[{"role":"user","content":[` + strings.Repeat(`{"type":"input_image","file_id":"file-nope"},`, MaxInputImages+1) +
		strings.Repeat(`{"type":"input_image","file_id":"file-png"},`, MaxInputImages-1) + `{"type":"input_image","file_id":"file-png"}]}]}`
	out, err := inlineAll(context.Background(), files, "k", []byte(body))
	if err != nil || strings.Count(string(out), `"image_url"`) != MaxInputImages || strings.Count(string(out), "file-nope") != MaxInputImages+1 {
		t.Fatalf("Inline = %v; want %d images inlined and the others left", err, MaxInputImages)
	}
}

func TestInlineFilesTogether(t *testing.T) {
	// Two files that each fit, and do not together.
	data := "%PDF-1.4\n" + strings.Repeat("x", MaxInputFileBytes/2)
	files := storetest.NewMemFiles()
	files.Add("k", "file-a", "a.pdf", data, int64(len(data)))
	body := `{"input":[{"role":"user","content":[{"type":"input_file","file_id":"file-a"}]},{"type":"function_call_output","call_id":"c","output":[{"type":"input_file","file_id":"file-a"}]}]}`
	_, err := inlineAll(context.Background(), files, "k", []byte(body))
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Code != "file_too_large" || ae.Param != "input[1].output[0].file_id" || !strings.Contains(ae.Message, "together") {
		t.Fatalf("Inline = %v; want file_too_large naming the second file", err)
	}
	out, err := inlineAll(context.Background(), files, "k", []byte(body[:strings.Index(body, `,{"type":"function_call_output"`)]+"]}"))
	if err != nil || gjson.GetBytes(out, "input.0.content.0.file_data").String() != dataURL("application/pdf", data) {
		t.Fatalf("one file: %v", err)
	}
}

func TestInlineStoreFailure(t *testing.T) {
	files := storetest.NewMemFiles()
	files.Fail = errors.New("disk on fire")
	body := `{"input":[{"role":"user","content":[{"type":"input_file","file_id":"file-a"}]}]}`
	_, err := inlineAll(context.Background(), files, "k", []byte(body))
	var ae *apierror.Error
	if err == nil || errors.As(err, &ae) || !errors.Is(err, files.Fail) {
		t.Fatalf("Inline = %v; want the store's error", err)
	}
	// No lookup at all for a body that names no file of the proxy's shape.
	for _, body := range []string{`{"input":"hi"}`, `{"input":[{"role":"user","content":[{"type":"input_file","file_id":"file_x"}]}]}`} {
		if _, err := inlineAll(context.Background(), files, "k", []byte(body)); err != nil {
			t.Errorf("Inline(%s) = %v; want no lookup", body, err)
		}
	}
	if _, err := inlineAll(context.Background(), nil, "k", []byte(body)); err != nil {
		t.Errorf("without a store: %v", err)
	}
}
