package intercept

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

func TestFindLinks(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []string // the linked text, then the path: "raw|path"
	}{
		{"markdown link", "Get [it](sandbox:/mnt/data/out.csv).", []string{"sandbox:/mnt/data/out.csv|/mnt/data/out.csv"}},
		{"bare, trailing period", "Saved to sandbox:/mnt/data/out.csv.", []string{"sandbox:/mnt/data/out.csv|/mnt/data/out.csv"}},
		{"spaces inside parentheses", "[a](sandbox:/mnt/data/my report.csv)", []string{"sandbox:/mnt/data/my report.csv|/mnt/data/my report.csv"}},
		{"percent escapes", "[a](sandbox:/mnt/data/my%20report.csv)", []string{"sandbox:/mnt/data/my%20report.csv|/mnt/data/my report.csv"}},
		{"nested directory", "[a](sandbox:/mnt/data/out/x.png)", []string{"sandbox:/mnt/data/out/x.png|/mnt/data/out/x.png"}},
		{"two links", "[a](sandbox:/mnt/data/a.csv) and `sandbox:/mnt/data/b.png`", []string{"sandbox:/mnt/data/a.csv|/mnt/data/a.csv", "sandbox:/mnt/data/b.png|/mnt/data/b.png"}},
		{"traversal out of /mnt/data", "[a](sandbox:/mnt/data/../../etc/passwd)", nil},
		{"the directory itself", "see sandbox:/mnt/data/", nil},
		{"no link", "see /mnt/data/a.csv", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, l := range findLinks(tt.text) {
				got = append(got, tt.text[l.start:l.end]+"|"+l.path)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("findLinks(%q) = %q, want %q", tt.text, got, tt.want)
			}
		})
	}
}

// writesOutAndChart is the fake code's effect: a CSV and a PNG under /mnt/data.
func writesOutAndChart(string) map[string]string {
	return map[string]string{"out.csv": "a,b\n1,2\n", "chart.png": "\x89PNG..."}
}

func citationsOf(resp []byte) []gjson.Result {
	var out []gjson.Result
	gjson.GetBytes(resp, "output").ForEach(func(_, it gjson.Result) bool {
		if it.Get("type").String() == "message" {
			out = append(out, it.Get("content.0.annotations").Array()...)
		}
		return true
	})
	return out
}

func TestWrittenFilesAreCited(t *testing.T) { forEachAPI(t, testWrittenFilesAreCited) }

func testWrittenFilesAreCited(t *testing.T, api upstreamAPI) {
	answer := "Voilà 📊: the table is [out.csv](sandbox:/mnt/data/out.csv)."
	var got [2][]byte
	for i, stream := range []bool{false, true} {
		h := newHarness(t, onAPI(api))
		h.fake.setWrites(writesOutAndChart)
		u := &upstreamtest.Usage{InputTokens: 10, OutputTokens: 5}
		h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{call("save()")}, Usage: u},
			upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text(answer)}, Usage: u})
		extra := `"include":["code_interpreter_call.outputs"]`
		if stream {
			extra += `,"stream":true`
		}
		status, raw := h.post(body(extra), "k")
		if status != 200 {
			t.Fatalf("status %d: %s", status, raw)
		}
		resp := raw
		if stream {
			rep := checkStream(t, raw)
			resp = rep.Response
			// The annotations are announced after the last text delta, before output_text.done.
			var order []string
			for _, ev := range rep.Events {
				switch typ := gjson.GetBytes(ev.Data, "type").String(); typ {
				case "response.output_text.delta", "response.output_text.annotation.added", "response.output_text.done":
					if len(order) == 0 || order[len(order)-1] != typ {
						order = append(order, typ)
					}
				}
			}
			if want := "response.output_text.delta response.output_text.annotation.added response.output_text.done"; strings.Join(order, " ") != want {
				t.Errorf("event order %v, want %s", order, want)
			}
		}
		got[i] = resp

		// The model was told the paths to link.
		out := lastFunctionOutput(h.up.Requests()[1])
		if !strings.Contains(out, "[file written: /mnt/data/out.csv (8 bytes); link it as sandbox:/mnt/data/out.csv]") ||
			!strings.Contains(out, "/mnt/data/chart.png") {
			t.Errorf("the model saw %q", out)
		}

		cites := citationsOf(resp)
		if len(cites) != 2 {
			t.Fatalf("%d citations, want 2: %s", len(cites), gjson.GetBytes(resp, "output").Raw)
		}
		cid := gjson.GetBytes(resp, "output.0.container_id").String()
		link := strings.Index(answer, "sandbox:")
		start := utf8.RuneCountInString(answer[:link])
		want := `{"type":"container_file_citation","container_id":"` + cid + `","end_index":` + itoa(start+len("sandbox:/mnt/data/out.csv")) +
			`,"file_id":"` + cites[0].Get("file_id").String() + `","filename":"out.csv","start_index":` + itoa(start) + `}`
		if cites[0].Raw != want {
			t.Errorf("link citation\n%s, want\n%s", cites[0].Raw, want)
		}
		if r := []rune(answer); string(r[cites[0].Get("start_index").Int():cites[0].Get("end_index").Int()]) != "sandbox:/mnt/data/out.csv" {
			t.Errorf("the span does not cover the link (counted in characters)")
		}
		img := cites[1]
		if img.Get("start_index").Int() != 0 || img.Get("end_index").Int() != 0 || img.Get("filename").String() != img.Get("file_id").String()+".png" ||
			!strings.HasPrefix(img.Get("file_id").String(), "cfile_") || img.Get("container_id").String() != cid {
			t.Errorf("image citation %s", img.Raw)
		}
	}
	if a, b := normalized(t, got[0]), normalized(t, got[1]); !reflect.DeepEqual(a, b) {
		t.Errorf("JSON and streamed responses differ:\n%s\n%s", got[0], got[1])
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestLinkedImageIsCitedOnce(t *testing.T) {
	h := newHarness(t)
	h.fake.setWrites(writesOutAndChart)
	h.up.Enqueue(calls("save()"), text("See ![chart](sandbox:/mnt/data/chart.png) and sandbox:/mnt/data/nope.csv"))
	_, resp := h.post(body(""), "k")
	cites := citationsOf(resp)
	if len(cites) != 1 || cites[0].Get("filename").String() != "chart.png" || cites[0].Get("start_index").Int() == 0 {
		t.Errorf("citations %v; want only the linked chart (not an unknown path, not the image at 0..0 again)", cites)
	}
}

func TestImageCitedByTheNextMessageOnly(t *testing.T) {
	h := newHarness(t)
	h.fake.setWrites(func(code string) map[string]string {
		if code == "plot()" {
			return map[string]string{"plot.png": "png"}
		}
		return nil
	})
	h.up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Plotting."), call("plot()")}},
		upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Here it is."), call("more()")}},
		text("Done."))
	_, resp := h.post(body(""), "k")
	var counts []int
	gjson.GetBytes(resp, "output").ForEach(func(_, it gjson.Result) bool {
		if it.Get("type").String() == "message" {
			counts = append(counts, len(it.Get("content.0.annotations").Array()))
		}
		return true
	})
	if !reflect.DeepEqual(counts, []int{0, 1, 0}) {
		t.Errorf("annotations per message %v, want [0 1 0]: %s", counts, resp)
	}
}

func TestLinkToAFileOfAnEarlierTurn(t *testing.T) { forEachAPI(t, testLinkToAFileOfAnEarlierTurn) }

func testLinkToAFileOfAnEarlierTurn(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api))
	h.fake.setWrites(func(code string) map[string]string {
		if code == "save()" {
			return map[string]string{"report.csv": "r\n"}
		}
		return nil
	})
	h.up.Enqueue(calls("save()"), text("Saved."))
	_, first := h.post(body(""), "k")
	id := gjson.GetBytes(first, "id").String()
	h.up.Enqueue(text("Here: [report](sandbox:/mnt/data/report.csv)"))
	status, resp := h.post(body(`"previous_response_id":"`+id+`"`), "k")
	if status != 200 {
		t.Fatalf("status %d: %s", status, resp)
	}
	cites := citationsOf(resp)
	if len(cites) != 1 || cites[0].Get("filename").String() != "report.csv" || cites[0].Get("container_id").String() == "" {
		t.Fatalf("citations %v: %s", cites, resp)
	}
	if h.fake.Created() != 1 {
		t.Errorf("%d containers; want the first reused", h.fake.Created())
	}
}

func TestNoCitationsWithoutFiles(t *testing.T) {
	h := newHarness(t)
	h.up.Enqueue(text("Nothing at [x](sandbox:/mnt/data/x.csv)"))
	status, resp := h.post(body(`"stream":true`), "k")
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	rep := checkStream(t, resp)
	if cites := citationsOf(rep.Response); len(cites) != 0 {
		t.Errorf("citations %v", cites)
	}
	if h.fake.Created() != 1 {
		t.Errorf("%d containers created", h.fake.Created())
	}
}

func FuzzFindLinks(f *testing.F) {
	for _, s := range []string{"[a](sandbox:/mnt/data/a.csv)", "sandbox:/mnt/data/", "x sandbox:/mnt/data/%zz.", "](sandbox:/mnt/data/é 📊.png"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		prev := 0
		for _, l := range findLinks(text) {
			if l.start < prev || l.end > len(text) || l.start >= l.end || !strings.HasPrefix(text[l.start:], sandboxLink) {
				t.Fatalf("link %+v out of order or bounds in %q", l, text)
			}
			if !strings.HasPrefix(l.path, "/mnt/data/") || strings.Contains(l.path, "/../") {
				t.Fatalf("path %q escapes /mnt/data", l.path)
			}
			if utf8.ValidString(text) && runeIndex(text, l.end) > utf8.RuneCountInString(text) {
				t.Fatal("rune index past the end")
			}
			prev = l.end
		}
	})
}

// BenchmarkCite measures citing one finished text of 2 KB with two links, in a container of
// 1000 known files: what the translator adds to a message's output_text.done.
func BenchmarkCite(b *testing.B) {
	tr := newTranslator(&parsedRequest{code: true}, "resp_x", 0, nil)
	files := make([]store.ContainerFile, 1000)
	for i := range files {
		files[i] = store.ContainerFile{ID: "cfile_" + strconv.Itoa(i), ContainerID: "cntr_x", Path: "/mnt/data/f" + strconv.Itoa(i) + ".csv"}
	}
	tr.addFiles(files, false)
	text := strings.Repeat("Here is the analysis you asked for, with totals per region. ", 32) +
		"[totals](sandbox:/mnt/data/f7.csv) and [details](sandbox:/mnt/data/f999.csv)."
	b.ReportAllocs()
	for b.Loop() {
		if len(tr.cite(text)) != 2 {
			b.Fatal("want 2 citations")
		}
	}
}
