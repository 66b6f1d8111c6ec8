package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// The data work of the files round trip: a CSV goes in, a summary CSV and a chart come out.
const (
	salesCSV = "region,amount\nnorth,3\nsouth,7\nnorth,2\n"
	// summaryCSV is what the scripted model's code writes for salesCSV (csv.writer ends rows
	// with \r\n).
	summaryCSV = "region,total\r\nnorth,5\r\nsouth,7\r\n"
)

// analysisCode reads the CSV at path, writes /mnt/data/summary.csv and /mnt/data/chart.png, and
// prints each file's SHA-256, so the test can compare what it downloads with what the code wrote.
func analysisCode(path string) string {
	return `import csv, hashlib
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
totals = {}
for row in csv.DictReader(open(` + fmt.Sprintf("%q", path) + `)):
    totals[row['region']] = totals.get(row['region'], 0) + int(row['amount'])
with open('/mnt/data/summary.csv', 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['region', 'total'])
    for k in sorted(totals):
        w.writerow([k, totals[k]])
plt.bar(sorted(totals), [totals[k] for k in sorted(totals)])
plt.savefig('/mnt/data/chart.png')
for name in ('summary.csv', 'chart.png'):
    print(name, hashlib.sha256(open('/mnt/data/' + name, 'rb').read()).hexdigest())
`
}

var (
	csvInDescription = regexp.MustCompile(`/mnt/data/[^ ;]+\.csv`)
	writtenLink      = regexp.MustCompile(`link it as (sandbox:/mnt/data/[^\]]+)\]`)
)

// filesModel is the scripted model of the round trip: told by the stand-in's description where
// the user's CSV is, it runs analysisCode on it; told by the function output which files the code
// wrote, it answers linking each of them.
func filesModel(req upstreamtest.Request) upstreamtest.Turn {
	if n := len(req.History); n > 0 && itemType(req.History[n-1]) == "function_call_output" {
		out := gjson.GetBytes(req.History[n-1], "output").String()
		var links []string
		for _, m := range writtenLink.FindAllStringSubmatch(out, -1) {
			name := strings.TrimPrefix(m[1], "sandbox:/mnt/data/")
			links = append(links, "["+name+"]("+m[1]+")")
		}
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Voilà 📊 the totals: " + strings.Join(links, " and ") + ".")}, Usage: answerUsage}
	}
	desc := gjson.GetBytes(req.Tool("python"), "description").String()
	path := csvInDescription.FindString(desc)
	if path == "" {
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("I was given no CSV.")}, Usage: answerUsage}
	}
	args, _ := json.Marshal(map[string]string{"code": analysisCode(path)})
	return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", string(args))}, Usage: callUsage}
}

// filesParams asks for the analysis of the uploaded file fileID.
func filesParams(fileID string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: clientModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Sum the amounts per region and chart them.")},
		Tools: []responses.ToolUnionParam{{OfCodeInterpreter: &responses.ToolCodeInterpreterParam{Container: responses.ToolCodeInterpreterContainerUnionParam{
			OfCodeInterpreterToolAuto: &responses.ToolCodeInterpreterContainerCodeInterpreterContainerAutoParam{FileIDs: []string{fileID}},
		}}}},
		Include: []responses.ResponseIncludable{responses.ResponseIncludableCodeInterpreterCallOutputs},
	}
}

// TestFilesRoundTripOpenAIGo is the data workflow with openai-go on each backend, JSON and
// streaming: upload a CSV with the Files API, have the code read it and write a CSV and a PNG,
// get an answer citing both with container_file_citation, download both with the Containers
// API, and compare the bytes with what the code wrote.
func TestFilesRoundTripOpenAIGo(t *testing.T) {
	t.Parallel()
	for _, tool := range sandboxTools {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.New(t)
			up.Script(filesModel)
			emu, _ := newEmulator(t)
			osb, osbEnv := newOpenSandbox(t, tool)
			p := startProxy(t, setup{Upstream: up.URL(), Tool: tool, E2B: emu, E2BKey: emu.APIKey(), OSB: osb, Daytona: newDaytona(t, tool), AgentSandbox: newAgentSandbox(t, tool), WorkDir: workDir(t)}.yaml(), osbEnv...)
			client := sdk(p, "sk-files")

			fileID := uploadUserData(t, client, "sales.csv", "text/csv", []byte(salesCSV))

			var created *responses.Response
			t.Run("json", func(t *testing.T) {
				r, err := client.Responses.New(ctx(t, 120*time.Second), filesParams(fileID))
				if err != nil {
					t.Fatalf("Responses.New: %v", err)
				}
				checkFilesAnswer(t, client, r)
				created = r
			})
			t.Run("stream", func(t *testing.T) {
				stream := client.Responses.NewStreaming(ctx(t, 120*time.Second), filesParams(fileID))
				var final *responses.Response
				var announced []responses.ResponseOutputTextAnnotationAddedEvent
				sawDone := false
				for stream.Next() {
					switch e := stream.Current().AsAny().(type) {
					case responses.ResponseOutputTextAnnotationAddedEvent:
						if sawDone {
							t.Error("an annotation after output_text.done")
						}
						announced = append(announced, e)
					case responses.ResponseTextDoneEvent:
						sawDone = true
					case responses.ResponseCompletedEvent:
						final = &e.Response
					}
				}
				if err := stream.Err(); err != nil {
					t.Fatalf("stream: %v", err)
				}
				if final == nil {
					t.Fatal("no response.completed")
				}
				cites := checkFilesAnswer(t, client, final)
				if len(announced) != len(cites) {
					t.Fatalf("%d annotation.added events, want %d", len(announced), len(cites))
				}
				for i, e := range announced {
					c := e.Annotation.AsContainerFileCitation()
					if e.AnnotationIndex != int64(i) || c.FileID != cites[i].FileID || c.StartIndex != cites[i].StartIndex || c.EndIndex != cites[i].EndIndex {
						t.Errorf("annotation.added %d: %s, want index %d and %s", i, e.RawJSON(), i, cites[i].RawJSON())
					}
				}
				if created != nil {
					// The same answer, but another container with its own file ids: blank those too.
					a, b := normalizedFiles(t, created.RawJSON()), normalizedFiles(t, final.RawJSON())
					if !reflect.DeepEqual(a, b) {
						t.Errorf("the streamed response differs from the JSON one:\njson:   %s\nstream: %s", mustJSON(a), mustJSON(b))
					}
				}
			})
		})
	}
}

var cfileID = regexp.MustCompile(`cfile_[A-Za-z0-9]+`)

func normalizedFiles(t *testing.T, raw string) any {
	return normalized(t, cfileID.ReplaceAllString(raw, "cfile_X"))
}

// checkFilesAnswer asserts the answer of the round trip: the code's outputs, one citation per
// file linked, and the bytes of each file as the Containers API serves them. It returns the
// citations.
func checkFilesAnswer(t *testing.T, client openai.Client, r *responses.Response) []responses.ResponseOutputTextAnnotationContainerFileCitation {
	t.Helper()
	call := ciCall(t, r)
	if call.Status != responses.ResponseCodeInterpreterToolCallStatusCompleted {
		t.Fatalf("call status %q; outputs %s", call.Status, mustJSON(call.Outputs))
	}
	sums := map[string]string{}
	images := 0
	var figure []byte // the displayed figure, from its output image
	for _, o := range call.Outputs {
		switch o.Type {
		case "logs":
			for _, line := range strings.Split(strings.TrimSpace(o.AsLogs().Logs), "\n") {
				if name, sum, ok := strings.Cut(line, " "); ok {
					sums[name] = sum
				}
			}
		case "image":
			images++ // the figure is still shown as an output image
			b64, _ := strings.CutPrefix(o.AsImage().URL, "data:image/png;base64,")
			figure, _ = base64.StdEncoding.DecodeString(b64)
		}
	}
	if len(sums) != 2 || images != 1 {
		t.Fatalf("outputs %s; want two checksums and one image", mustJSON(call.Outputs))
	}

	var msg *responses.ResponseOutputMessageContentUnion
	for _, it := range r.Output {
		if m := it.AsMessage(); it.Type == "message" && len(m.Content) > 0 {
			msg = &m.Content[0]
		}
	}
	if msg == nil {
		t.Fatalf("no message: %s", r.RawJSON())
	}
	var cites []responses.ResponseOutputTextAnnotationContainerFileCitation
	for _, a := range msg.Annotations {
		if a.Type != "container_file_citation" {
			t.Errorf("annotation %s", a.RawJSON())
			continue
		}
		cites = append(cites, a.AsContainerFileCitation())
	}
	// The CSV and the PNG the code saved, and the figure it displayed: a container file named by
	// its id, as OpenAI's are.
	if len(cites) != 3 {
		t.Fatalf("%d citations, want 3 (the CSV, the PNG and the displayed figure): %s", len(cites), msg.Text)
	}
	runes := []rune(msg.Text)
	for _, c := range cites {
		if c.ContainerID != call.ContainerID || !strings.HasPrefix(c.FileID, "cfile_") {
			t.Errorf("citation %s: want container %s and a cfile_ id", c.RawJSON(), call.ContainerID)
		}
		if c.StartIndex < 0 || c.EndIndex > int64(len(runes)) || string(runes[c.StartIndex:c.EndIndex]) != "sandbox:/mnt/data/"+c.Filename {
			t.Errorf("citation %s does not span its link in %q", c.RawJSON(), msg.Text)
		}
		want, ok := sums[c.Filename]
		if c.Filename == c.FileID+".png" {
			sum := sha256.Sum256(figure)
			want, ok = hex.EncodeToString(sum[:]), len(figure) > 0
		}
		if !ok {
			t.Errorf("citation of %q, which the code did not write", c.Filename)
			continue
		}
		resp, err := client.Containers.Files.Content.Get(ctx(t, 30*time.Second), c.ContainerID, c.FileID)
		if err != nil {
			t.Fatalf("Containers.Files.Content.Get(%s): %v", c.FileID, err)
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("downloading %s: %d %v", c.Filename, resp.StatusCode, err)
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != want {
			t.Errorf("%s: downloaded %d bytes whose SHA-256 is not the one the code printed", c.Filename, len(b))
		}
		switch c.Filename {
		case "summary.csv":
			if string(b) != summaryCSV {
				t.Errorf("summary.csv = %q, want %q", b, summaryCSV)
			}
		case "chart.png":
			if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("chart.png does not start with the PNG signature: %q", b[:min(8, len(b))])
			}
		}
	}
	return cites
}

var (
	// outputCSV is where the function output's note puts the CSV; imageNote where the user's note
	// puts the image.
	outputCSV = regexp.MustCompile(`File in this function output, available to the python tool at (/mnt/data/[^ ]+\.csv) \(`)
	imageNote = regexp.MustCompile(`The image above is also available to the python tool at (/mnt/data/[^ ]+\.png) \(`)
)

// inputsModel is the scripted model of TestInputPartsOpenAIGo: told where the function output's
// CSV and the user's image are, it runs code printing the CSV and the image's SHA-256; given that
// code's output, it answers.
func inputsModel(req upstreamtest.Request) upstreamtest.Turn {
	if n := len(req.History); n > 0 && itemType(req.History[n-1]) == "function_call_output" && gjson.GetBytes(req.History[n-1], "call_id").String() != "call_lookup" {
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Read both.")}, Usage: answerUsage}
	}
	csvPath, img := outputCSV.FindSubmatch(req.Body), imageNote.FindSubmatch(req.Body)
	if csvPath == nil || img == nil {
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("I was not told where the files are.")}, Usage: answerUsage}
	}
	code := fmt.Sprintf("import hashlib\nprint(open(%q).read(), end='')\nprint(hashlib.sha256(open(%q, 'rb').read()).hexdigest())\n", csvPath[1], img[1])
	args, _ := json.Marshal(map[string]string{"code": code})
	return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", string(args))}, Usage: callUsage}
}

// onePixelPNG is a real PNG image of one pixel.
func onePixelPNG(t *testing.T) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 1, 1))
	img.Set(0, 0, color.RGBA{R: 200, A: 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestInputPartsOpenAIGo sends, with openai-go, an input_image by file_id in the user's message
// and a function_call_output whose output carries an input_file, each a Files API file, on the
// local backend to a Responses and to a Chat Completions upstream: the upstream is given the
// image's bytes and text in place of the file, never a file id, and the code reads both files
// where the notes put them.
func TestInputPartsOpenAIGo(t *testing.T) {
	t.Parallel()
	for _, chat := range []bool{false, true} {
		name := "responses"
		if chat {
			name = "chat"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.New(t)
			up.Script(inputsModel)
			p := startProxy(t, setup{Upstream: up.URL(), Tool: "local", WorkDir: workDir(t), ChatOnly: chat}.yaml())
			client := sdk(p, "sk-inputs")
			pixel := onePixelPNG(t)
			imgID, csvID := uploadUserData(t, client, "pixel.png", "image/png", pixel), uploadUserData(t, client, "sales.csv", "text/csv", []byte(salesCSV))

			params := responses.ResponseNewParams{
				Model: clientModel,
				Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
					responses.ResponseInputItemParamOfMessage(responses.ResponseInputMessageContentListParam{
						{OfInputText: &responses.ResponseInputTextParam{Text: "Compare the table with the picture."}},
						{OfInputImage: &responses.ResponseInputImageParam{FileID: openai.String(imgID), Detail: responses.ResponseInputImageDetailLow}},
					}, responses.EasyInputMessageRoleUser),
					responses.ResponseInputItemParamOfFunctionCall(`{"table":"sales"}`, "call_lookup", "lookup"),
					{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
						CallID: openai.String("call_lookup"),
						Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfResponseFunctionCallOutputItemArray: responses.ResponseFunctionCallOutputItemListParam{
							{OfInputText: &responses.ResponseInputTextContentParam{Text: "The table:"}},
							{OfInputFile: &responses.ResponseInputFileContentParam{FileID: openai.String(csvID)}},
						}},
					}},
				}},
				Tools: []responses.ToolUnionParam{
					{OfCodeInterpreter: &responses.ToolCodeInterpreterParam{Container: responses.ToolCodeInterpreterContainerUnionParam{
						OfCodeInterpreterToolAuto: &responses.ToolCodeInterpreterContainerCodeInterpreterContainerAutoParam{},
					}}},
					responses.ToolParamOfFunction("lookup", map[string]any{"type": "object", "properties": map[string]any{"table": map[string]any{"type": "string"}}}, false),
				},
				Include: []responses.ResponseIncludable{responses.ResponseIncludableCodeInterpreterCallOutputs},
			}
			r, err := client.Responses.New(ctx(t, 120*time.Second), params)
			if err != nil {
				t.Fatalf("Responses.New: %v", err)
			}

			// The code read the CSV and the image where the notes said they are.
			call := ciCall(t, r)
			sum := sha256.Sum256(pixel)
			if want := salesCSV + hex.EncodeToString(sum[:]) + "\n"; len(call.Outputs) != 1 || call.Outputs[0].AsLogs().Logs != want {
				t.Fatalf("the code printed %s, want %q", mustJSON(call.Outputs), want)
			}
			if r.OutputText() != "Read both." {
				t.Errorf("answer %q", r.OutputText())
			}
			files, err := client.Containers.Files.List(ctx(t, 30*time.Second), call.ContainerID, openai.ContainerFileListParams{})
			if err != nil {
				t.Fatalf("Containers.Files.List: %v", err)
			}
			var paths []string
			for _, f := range files.Data {
				paths = append(paths, f.Path+":"+string(f.Source))
			}
			if want := []string{"/mnt/data/pixel.png:user", "/mnt/data/sales.csv:user"}; !reflect.DeepEqual(sorted(paths), want) {
				t.Errorf("the container holds %v, want %v", paths, want)
			}

			// What the upstream was given: the image's bytes, the file's note, and no file id.
			reqs := up.Requests()
			if len(reqs) != 2 {
				t.Fatalf("%d upstream requests, want 2", len(reqs))
			}
			wantURL := "data:image/png;base64," + base64.StdEncoding.EncodeToString(pixel)
			for i, req := range reqs {
				if s := string(req.Body); strings.Contains(s, imgID) || strings.Contains(s, csvID) || strings.Contains(s, "file_id") {
					t.Errorf("request %d: a file id reached the upstream: %s", i, s)
				}
				var image gjson.Result
				if chat {
					image = gjson.GetBytes(req.Messages[0], `content.#(type=="image_url").image_url`)
					if image.Get("url").String() != wantURL || image.Get("detail").String() != "low" {
						t.Errorf("request %d: the user's message is %s", i, req.Messages[0])
					}
				} else {
					image = gjson.GetBytes(req.Input[0], `content.#(type=="input_image")`)
					if image.Get("image_url").String() != wantURL || image.Get("detail").String() != "low" {
						t.Errorf("request %d: the user's message is %s", i, req.Input[0])
					}
				}
				out, ok := req.FunctionOutput("call_lookup")
				if want := fmt.Sprintf("[File in this function output, available to the python tool at /mnt/data/sales.csv (%d bytes).]", len(salesCSV)); !ok || !strings.Contains(out, want) || !strings.Contains(out, "The table:") {
					t.Errorf("request %d: the function output is %q, want it to hold %q", i, out, want)
				}
			}

			// For another key the files do not exist: a 404 naming the first, and nothing goes on.
			other := sdk(p, "sk-someone-else")
			_, err = other.Responses.New(ctx(t, 30*time.Second), params)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Param != "input[0].content[1].file_id" {
				t.Errorf("another key's request: %v", err)
			}
			if n := len(up.Requests()); n != 2 {
				t.Errorf("%d upstream requests after another key's; want none more", n-2)
			}
		})
	}
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	slices.Sort(s)
	return s
}
