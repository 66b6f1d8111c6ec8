package e2e

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestPassThroughFilesOpenAIGo sends, with openai-go and without code_interpreter (so the request
// passes through to the Responses upstream), an input_image and an input_file by the proxy's
// file ids, in the user's message and in a function output, JSON and streamed: the upstream is
// given the image as a data URL and the file as file_data, never the proxy's id, while an id
// the proxy does not hold and another key's id go as sent.
func TestPassThroughFilesOpenAIGo(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(t)
	up.Script(func(upstreamtest.Request) upstreamtest.Turn {
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Seen.")}, Usage: answerUsage}
	})
	p := startProxy(t, setup{Upstream: up.URL(), Tool: "local", WorkDir: workDir(t)}.yaml())
	alice, bob := sdk(p, "sk-alice"), sdk(p, "sk-bob")
	pixel := onePixelPNG(t)
	pdf := []byte("%PDF-1.4\n1 0 obj\n<< /Type /Catalog >>\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n")
	imgID, pdfID := uploadUserData(t, alice, "pixel.png", "image/png", pixel), uploadUserData(t, alice, "report.pdf", "application/pdf", pdf)
	bobsID := uploadUserData(t, bob, "bob.pdf", "application/pdf", pdf)
	const unknownID = "file-IssuedByTheUpstream42"

	params := responses.ResponseNewParams{
		Model: clientModel,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage(responses.ResponseInputMessageContentListParam{
				{OfInputText: &responses.ResponseInputTextParam{Text: "Read these."}},
				{OfInputImage: &responses.ResponseInputImageParam{FileID: openai.String(imgID), Detail: responses.ResponseInputImageDetailLow}},
				{OfInputFile: &responses.ResponseInputFileParam{FileID: openai.String(pdfID)}},
				{OfInputFile: &responses.ResponseInputFileParam{FileID: openai.String(unknownID)}},
				{OfInputFile: &responses.ResponseInputFileParam{FileID: openai.String(bobsID)}},
			}, responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfFunctionCall(`{}`, "call_fetch", "fetch"),
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
				CallID: openai.String("call_fetch"),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfResponseFunctionCallOutputItemArray: responses.ResponseFunctionCallOutputItemListParam{
					{OfInputFile: &responses.ResponseInputFileContentParam{FileID: openai.String(pdfID)}},
					{OfInputImage: &responses.ResponseInputImageContentParam{FileID: openai.String(imgID)}},
				}},
			}},
		}},
	}
	r, err := alice.Responses.New(ctx(t, 60*time.Second), params)
	if err != nil {
		t.Fatalf("Responses.New: %v", err)
	}
	if r.OutputText() != "Seen." {
		t.Errorf("answer %q", r.OutputText())
	}
	stream := alice.Responses.NewStreaming(ctx(t, 60*time.Second), params)
	var final *responses.Response
	for stream.Next() {
		if e, ok := stream.Current().AsAny().(responses.ResponseCompletedEvent); ok {
			final = &e.Response
		}
	}
	if err := stream.Err(); err != nil || final == nil || final.OutputText() != "Seen." {
		t.Fatalf("stream: %v, final %v", err, final)
	}

	reqs := up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d upstream requests, want 2", len(reqs))
	}
	imgURL := "data:image/png;base64," + base64.StdEncoding.EncodeToString(pixel)
	pdfURL := "data:application/pdf;base64," + base64.StdEncoding.EncodeToString(pdf)
	for i, req := range reqs {
		if req.Path != "/v1/responses" || req.Stream != (i == 1) || len(req.Tools) != 0 {
			t.Errorf("request %d: %s stream=%v tools %d", i, req.Path, req.Stream, len(req.Tools))
		}
		if s := string(req.Body); strings.Contains(s, imgID) || strings.Contains(s, pdfID) {
			t.Errorf("request %d: one of alice's ids reached the upstream: %s", i, s)
		}
		user := gjson.ParseBytes(req.Input[0]).Get("content")
		checks := []struct{ path, want string }{
			{"1.type", "input_image"}, {"1.image_url", imgURL}, {"1.detail", "low"},
			{"2.type", "input_file"}, {"2.file_data", pdfURL}, {"2.filename", "report.pdf"},
			{"3.file_id", unknownID},
			{"4.file_id", bobsID}, // bob's: not alice's to read
		}
		for _, c := range checks {
			if v := user.Get(c.path).String(); v != c.want {
				t.Errorf("request %d: the user's part %s = %.60q, want %.60q", i, c.path, v, c.want)
			}
		}
		if user.Get("4.file_data").Exists() || user.Get("3.file_data").Exists() {
			t.Errorf("request %d: an id the caller holds no file for was resolved: %s", i, user.Raw)
		}
		out := gjson.ParseBytes(req.Input[2])
		if out.Get("output.0.file_data").String() != pdfURL || out.Get("output.0.filename").String() != "report.pdf" || out.Get("output.1.image_url").String() != imgURL {
			t.Errorf("request %d: the function output is %s", i, req.Input[2])
		}
	}
}
