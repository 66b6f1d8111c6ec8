package intercept

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

func eventTypes(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Name
	}
	return out
}

func TestSingleCallStream(t *testing.T) { forEachAPI(t, testSingleCallStream) }

func testSingleCallStream(t *testing.T, api upstreamAPI) {
	h := newHarness(t, onAPI(api), withLocal())
	h.up.Enqueue(
		upstreamtest.Turn{Items: []upstreamtest.Item{call("print('a\u00e9\"')\n1+1")}},
		upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Two.")}},
	)
	status, raw := h.post(body(`"stream":true,"include":["code_interpreter_call.outputs"]`), "k1")
	if status != 200 {
		t.Fatalf("status = %d; body %s", status, raw)
	}
	checkStream(t, raw)
	evs := parseSSE(t, raw)
	for i, ev := range evs {
		if ev.Name != gjson.GetBytes(ev.Data, "type").String() {
			t.Errorf("event %d: event line %q, type %q", i, ev.Name, gjson.GetBytes(ev.Data, "type").String())
		}
		if n := gjson.GetBytes(ev.Data, "sequence_number").Int(); n != int64(i) {
			t.Errorf("event %d (%s): sequence_number %d", i, ev.Name, n)
		}
	}
	got := strings.Join(eventTypes(evs), "\n")
	var code strings.Builder
	for _, ev := range evs {
		if ev.Name == "response.code_interpreter_call_code.delta" {
			code.WriteString(gjson.GetBytes(ev.Data, "delta").String())
		}
	}
	if want := "print('a\u00e9\"')\n1+1"; code.String() != want {
		t.Errorf("code deltas = %q; want %q", code.String(), want)
	}
	for _, want := range []string{
		"response.created\nresponse.in_progress\nresponse.output_item.added\nresponse.code_interpreter_call.in_progress\nresponse.code_interpreter_call_code.delta",
		"response.code_interpreter_call_code.done\nresponse.code_interpreter_call.interpreting\nresponse.code_interpreter_call.completed\nresponse.output_item.done\nresponse.output_item.added",
		"response.output_text.done\nresponse.content_part.done\nresponse.output_item.done\nresponse.completed",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("stream lacks\n%s\n--- got:\n%s", want, got)
		}
	}
	if strings.Count(got, "response.created") != 1 || strings.Count(got, "response.in_progress") != 1 {
		t.Errorf("created/in_progress not once:\n%s", got)
	}
	resp := finalResponse(t, evs)
	if got := strings.Join(types(resp), ","); got != "code_interpreter_call,message" {
		t.Fatalf("output = %s", got)
	}
	if logs := gjson.GetBytes(resp, "output.0.outputs.0.logs").String(); logs != "a\u00e9\"\n2" {
		t.Errorf("logs = %q", logs)
	}
	created := gjson.GetBytes(evs[0].Data, "response.id").String()
	if created != gjson.GetBytes(resp, "id").String() {
		t.Errorf("created id %s, completed id %s", created, gjson.GetBytes(resp, "id").String())
	}
	// The message is item 1 across iterations.
	for _, ev := range evs {
		if ev.Name == "response.output_text.delta" && gjson.GetBytes(ev.Data, "output_index").Int() != 1 {
			t.Errorf("text delta output_index = %d; want 1", gjson.GetBytes(ev.Data, "output_index").Int())
		}
	}
}
