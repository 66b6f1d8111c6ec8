package streamcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

type m = map[string]any

const (
	respID = "resp_68c2e6f0aa"
	ciID   = "ci_68c2e6f7b7"
	msgID  = "msg_68c2e6fa01"
	fcID   = "fc_68c2e6fb02"
	cntrID = "cntr_68c2e6f380"
)

func ciItem(status, code string, outputs any) m {
	return m{"id": ciID, "type": "code_interpreter_call", "status": status, "code": code, "container_id": cntrID, "outputs": outputs}
}

func msgItem(status string, content []any) m {
	return m{"id": msgID, "type": "message", "status": status, "content": content, "role": "assistant"}
}

func textPart(text string) m {
	return m{"type": "output_text", "annotations": []any{}, "logprobs": []any{}, "text": text}
}

func fcItem(status, args string) m {
	return m{"id": fcID, "type": "function_call", "status": status, "arguments": args, "call_id": "call_1", "name": "lookup"}
}

func resp(status string, output []any) m {
	r := m{"id": respID, "object": "response", "status": status, "error": nil, "output": output}
	if status == "failed" {
		r["error"] = m{"code": "server_error", "message": "boom"}
	}
	return r
}

// good is a complete, valid stream: a code_interpreter_call, a message, a function call.
func good() []m {
	logs := []any{m{"type": "logs", "logs": "1\n"}}
	done := []any{ciItem("completed", "print(1)", logs), msgItem("completed", []any{textPart("Hello")}), fcItem("completed", `{"q":1}`)}
	return []m{
		{"type": "response.created", "response": resp("in_progress", []any{})},                                                 // 0
		{"type": "response.in_progress", "response": resp("in_progress", []any{})},                                             // 1
		{"type": "response.output_item.added", "output_index": 0, "item": ciItem("in_progress", "", []any{})},                  // 2
		{"type": "response.code_interpreter_call.in_progress", "output_index": 0, "item_id": ciID},                             // 3
		{"type": "response.code_interpreter_call_code.delta", "output_index": 0, "item_id": ciID, "delta": "print("},           // 4
		{"type": "response.code_interpreter_call_code.delta", "output_index": 0, "item_id": ciID, "delta": "1)"},               // 5
		{"type": "response.code_interpreter_call_code.done", "output_index": 0, "item_id": ciID, "code": "print(1)"},           // 6
		{"type": "response.code_interpreter_call.interpreting", "output_index": 0, "item_id": ciID},                            // 7
		{"type": "response.code_interpreter_call.completed", "output_index": 0, "item_id": ciID},                               // 8
		{"type": "response.output_item.done", "output_index": 0, "item": done[0]},                                              // 9
		{"type": "response.output_item.added", "output_index": 1, "item": msgItem("in_progress", []any{})},                     // 10
		{"type": "response.content_part.added", "item_id": msgID, "output_index": 1, "content_index": 0, "part": textPart("")}, // 11
		{"type": "response.output_text.delta", "item_id": msgID, "output_index": 1, "content_index": 0, "delta": "Hel", "logprobs": []any{}},
		{"type": "response.output_text.delta", "item_id": msgID, "output_index": 1, "content_index": 0, "delta": "lo", "logprobs": []any{}},
		{"type": "response.output_text.done", "item_id": msgID, "output_index": 1, "content_index": 0, "text": "Hello", "logprobs": []any{}},
		{"type": "response.content_part.done", "item_id": msgID, "output_index": 1, "content_index": 0, "part": textPart("Hello")},
		{"type": "response.output_item.done", "output_index": 1, "item": done[1]},                                     // 16
		{"type": "response.output_item.added", "output_index": 2, "item": fcItem("in_progress", "")},                  // 17
		{"type": "response.function_call_arguments.delta", "item_id": fcID, "output_index": 2, "delta": `{"q"`},       // 18
		{"type": "response.function_call_arguments.delta", "item_id": fcID, "output_index": 2, "delta": `:1}`},        // 19
		{"type": "response.function_call_arguments.done", "item_id": fcID, "output_index": 2, "arguments": `{"q":1}`}, // 20
		{"type": "response.output_item.done", "output_index": 2, "item": done[2]},                                     // 21
		{"type": "response.completed", "response": resp("completed", done)},                                           // 22
	}
}

var citation = m{"type": "container_file_citation", "container_id": cntrID, "end_index": 5, "file_id": "cfile_1", "filename": "a.csv", "start_index": 0}

// annotated is good with one annotation on the message's text: announced before
// output_text.done, repeated by content_part.done, the item and the terminal response.
func annotated() []m {
	evs := good()
	part := textPart("Hello")
	part["annotations"] = []any{citation}
	msg := msgItem("completed", []any{part})
	evs[15]["part"] = part
	evs[16]["item"] = msg
	evs[22]["response"].(m)["output"].([]any)[1] = msg
	added := m{"type": "response.output_text.annotation.added", "item_id": msgID, "output_index": 1, "content_index": 0, "annotation_index": 0, "annotation": citation}
	return append(evs[:14:14], append([]m{added}, evs[14:]...)...)
}

// render writes events as SSE, numbering them unless an event already has a sequence_number.
func render(evs []m) []byte {
	var b bytes.Buffer
	for i, ev := range evs {
		if _, ok := ev["sequence_number"]; !ok {
			ev["sequence_number"] = i
		}
		data, err := json.Marshal(ev)
		if err != nil {
			panic(err)
		}
		name := ev["type"]
		if n, ok := ev["@event"]; ok {
			name = n
			delete(ev, "@event")
			data, _ = json.Marshal(ev)
		}
		fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", name, data)
	}
	return b.Bytes()
}

// failedTail replaces the terminal event with an error event and response.failed.
func failedTail(evs []m, errEvent m) []m {
	evs = evs[:len(evs)-1]
	done := []any{evs[9]["item"], evs[16]["item"], evs[21]["item"]}
	if errEvent != nil {
		evs = append(evs, errEvent)
	}
	return append(evs, m{"type": "response.failed", "response": resp("failed", done)})
}

func TestCheckValid(t *testing.T) {
	tests := []struct {
		name string
		raw  func() []byte
	}{
		{"complete stream", func() []byte { return render(good()) }},
		{"an annotation", func() []byte { return render(annotated()) }},
		{"CRLF line ends and comments", func() []byte {
			raw := bytes.ReplaceAll(render(good()), []byte("\n"), []byte("\r\n"))
			return append([]byte(": keepalive\r\n\r\n"), raw...)
		}},
		{"failed after nested error event", func() []byte {
			return render(failedTail(good(), m{"type": "error", "error": m{"type": "server_error", "code": "server_error", "message": "boom", "param": nil}}))
		}},
		{"failed mid item", func() []byte {
			evs := good()[:13]
			evs = append(evs, m{"type": "error", "error": m{"message": "boom"}},
				m{"type": "response.failed", "response": resp("failed", []any{evs[9]["item"]})})
			return render(evs)
		}},
		{"incomplete", func() []byte {
			evs := good()
			r := evs[22]["response"].(m)
			r["status"] = "incomplete"
			evs[22]["type"] = "response.incomplete"
			return render(evs)
		}},
		{"no code deltas, null outputs", func() []byte {
			evs := good()
			evs = append(evs[:4], evs[6:]...) // drop the deltas
			evs[4]["code"] = ""
			evs[7]["item"] = ciItem("completed", "", nil)
			evs[len(evs)-1]["response"].(m)["output"].([]any)[0] = ciItem("completed", "", nil)
			return render(evs)
		}},
		{"created then failed at once", func() []byte {
			return render([]m{
				{"type": "response.created", "response": resp("in_progress", []any{})},
				{"type": "response.in_progress", "response": resp("in_progress", []any{})},
				{"type": "error", "error": m{"message": "rate limited"}},
				{"type": "response.failed", "response": resp("failed", []any{})},
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Check(tt.raw())
			if err != nil {
				t.Fatalf("Check() = %v; want nil", err)
			}
			if rep.ResponseID != respID || rep.Terminal == "" || len(rep.Response) == 0 {
				t.Errorf("Report = %+v", rep)
			}
		})
	}
	rep, _ := Check(render(good()))
	if len(rep.Items) != 3 || len(rep.Events) != 23 || rep.Terminal != "response.completed" {
		t.Errorf("Report: %d items, %d events, terminal %s", len(rep.Items), len(rep.Events), rep.Terminal)
	}
}

func TestCheckInvalid(t *testing.T) {
	set := func(i int, k string, v any) func([]m) []m {
		return func(evs []m) []m { evs[i][k] = v; return evs }
	}
	item := func(i int, k string, v any) func([]m) []m {
		return func(evs []m) []m {
			it := evs[i]["item"].(m)
			cp := m{}
			for a, b := range it {
				cp[a] = b
			}
			cp[k] = v
			evs[i]["item"] = cp
			return evs
		}
	}
	drop := func(i int) func([]m) []m {
		return func(evs []m) []m { return append(evs[:i:i], evs[i+1:]...) }
	}
	swap := func(i, j int) func([]m) []m {
		return func(evs []m) []m { evs[i], evs[j] = evs[j], evs[i]; return evs }
	}
	tests := []struct {
		name   string
		mutate func([]m) []m
		want   string
	}{
		{"sequence gap", set(12, "sequence_number", 13), "event 12 (response.output_text.delta): sequence_number 13, want 12"},
		{"no sequence number", func(evs []m) []m { evs[3]["sequence_number"] = nil; return evs }, "event 3 (response.code_interpreter_call.in_progress): no sequence_number"},
		{"event line differs", set(5, "@event", "response.output_text.delta"), `event 5 (response.code_interpreter_call_code.delta): event: line "response.output_text.delta"`},
		{"created not first", swap(0, 1), "event 0 (response.in_progress): first event, want response.created"},
		{"in_progress missing", drop(1), "event 1 (response.output_item.added): second event, want response.in_progress"},
		{"created twice", func(evs []m) []m {
			again := m{"type": "response.created", "response": resp("in_progress", []any{})}
			return append(evs[:3:3], append([]m{again}, evs[3:]...)...)
		}, "event 3 (response.created): response.created again"},
		{"terminal not last", func(evs []m) []m { return append(evs, m{"type": "response.output_text.delta"}) }, "event 22 (response.completed): terminal event before the end"},
		{"no terminal", func(evs []m) []m { return evs[:22] }, "stream ends with event 21 (response.output_item.done); want a terminal event"},
		{"id differs", func(evs []m) []m { evs[22]["response"].(m)["id"] = "resp_other"; return evs }, `event 22 (response.completed): response id "resp_other", want "resp_68c2e6f0aa"`},
		{"status differs", func(evs []m) []m { evs[22]["response"].(m)["status"] = "failed"; return evs }, `response status "failed", want "completed"`},
		{"failed without error event", func(evs []m) []m { return failedTail(evs, nil) }, "event 22 (response.failed): not preceded by an error event"},
		{"flat error event", func(evs []m) []m {
			return failedTail(evs, m{"type": "error", "code": "server_error", "message": "boom", "param": nil})
		}, `event 22 (error): want the nested form`},
		{"error event not before failed", func(evs []m) []m {
			return append(evs[:10:10], append([]m{{"type": "error", "error": m{"message": "x"}}}, evs[10:]...)...)
		}, "event 10 (error): not followed by response.failed"},
		{"output index gap", set(10, "output_index", 2), "event 10 (response.output_item.added): output_index 2, want 1"},
		{"delta before added", set(12, "output_index", 2), "event 12 (response.output_text.delta): output_index 2 before its output_item.added"},
		{"event after item done", set(12, "output_index", 0), "event 12 (response.output_text.delta): output_index 0 after its output_item.done"},
		{"item_id differs", set(13, "item_id", "msg_x"), `event 13 (response.output_text.delta): item_id "msg_x", want "msg_68c2e6fa01"`},
		{"ci added with code", item(2, "code", "x"), `event 2 (response.output_item.added): item code "x", want ""`},
		{"ci added completed", item(2, "status", "completed"), `item status "completed", want in_progress`},
		{"ci added with null outputs", item(2, "outputs", nil), "item outputs null, want []"},
		{"ci id prefix", func(evs []m) []m { return item(2, "id", "call_1")(evs) }, `code_interpreter_call id "call_1", want a ci_ prefix`},
		{"ci container prefix", item(2, "container_id", "sbx_1"), `item container_id "sbx_1", want a cntr_ prefix`},
		{"ci in_progress missing", drop(3), "event 3 (response.code_interpreter_call_code.delta): after output_item.added, want code_interpreter_call.in_progress"},
		{"ci interpreting before code done", swap(6, 7), "event 6 (response.code_interpreter_call.interpreting): after code_interpreter_call_code.delta, want code_interpreter_call_code.done"},
		{"ci completed missing", drop(8), "event 8 (response.output_item.done): output_item.done after code_interpreter_call.interpreting, want it after code_interpreter_call.completed"},
		{"ci code done differs", set(6, "code", "print(2)"), `event 6 (response.code_interpreter_call_code.done): code "print(2)", want "print(1)" (the deltas joined)`},
		{"ci item done code differs", item(9, "code", "print(2)"), `event 9 (response.output_item.done): item code "print(2)", want "print(1)"`},
		{"ci item done container differs", item(9, "container_id", "cntr_other"), `item container_id "cntr_other", want "cntr_68c2e6f380"`},
		{"ci outputs malformed", item(9, "outputs", []any{m{"type": "logs"}}), "item outputs: entry 0 is not {type:logs,logs} or {type:image,url}"},
		{"text done differs", set(14, "text", "Help"), `event 14 (response.output_text.done): text "Help", want "Hello" (the deltas joined)`},
		{"content part done differs", set(15, "part", textPart("Hell")), `event 15 (response.content_part.done): part output_text "Hell", want output_text "Hello"`},
		{"message item text differs", item(16, "content", []any{textPart("Bye")}), `event 16 (response.output_item.done): item content[0] output_text "Bye", want output_text "Hello"`},
		{"content index gap", set(11, "content_index", 1), "event 11 (response.content_part.added): content_index 1, want 0"},
		{"arguments differ", set(20, "arguments", `{"q":2}`), `event 20 (response.function_call_arguments.done): arguments "{\"q\":2}", want "{\"q\":1}" (the deltas joined)`},
		{"function item done before arguments done", drop(20), "event 20 (response.output_item.done): output_item.done before function_call_arguments.done"},
		{"terminal output differs", func(evs []m) []m {
			evs[22]["response"].(m)["output"].([]any)[1] = msgItem("completed", []any{textPart("Other")})
			return evs
		}, "event 22 (response.completed): response.output[1] = "},
		{"terminal output short", func(evs []m) []m {
			r := evs[22]["response"].(m)
			r["output"] = r["output"].([]any)[:2]
			return evs
		}, "event 22 (response.completed): response.output has 2 items, want 3"},
		{"completed with an open item", drop(21), "event 21 (response.completed): item 2 (function_call fc_68c2e6fb02) has no output_item.done"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Check(render(tt.mutate(good())))
			if err == nil {
				t.Fatalf("Check() = nil; want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Check() = %q; want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    []Event
		wantErr string
	}{
		{"one event", "event: a\ndata: {}\n\n", []Event{{Name: "a", Data: []byte("{}")}}, ""},
		{"multi-line data and no space", "event:a\ndata: {\ndata:}\n\n", []Event{{Name: "a", Data: []byte("{\n}")}}, ""},
		{"comments and id lines", ": hi\n\nid: 1\nevent: a\ndata: x\n\n", []Event{{Name: "a", Data: []byte("x")}}, ""},
		{"DONE", "event: a\ndata: {}\n\ndata: [DONE]\n\n", nil, "data: [DONE]"},
		{"no blank line at the end", "event: a\ndata: {}\n", nil, "no blank line after it"},
		{"no newline at the end", "event: a\ndata: {}", nil, "no newline"},
		{"event without data", "event: a\n\n", nil, "has no data: line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.raw))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse() error = %v; want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Parse() = %d events; want %d", len(got), len(tt.want))
			}
			for i := range got {
				if got[i].Name != tt.want[i].Name || !bytes.Equal(got[i].Data, tt.want[i].Data) {
					t.Errorf("event %d = %q %q; want %q %q", i, got[i].Name, got[i].Data, tt.want[i].Name, tt.want[i].Data)
				}
			}
		})
	}
}

func TestValidateEmpty(t *testing.T) {
	if _, err := Validate(nil); err == nil {
		t.Error("Validate(nil) = nil; want an error")
	}
}

func TestMust(t *testing.T) {
	if rep := Must(t, render(good())); rep.ResponseID != respID {
		t.Errorf("Must() = %+v", rep)
	}
}

func TestCheckAnnotations(t *testing.T) {
	withAnns := func(anns ...any) m {
		p := textPart("Hello")
		p["annotations"] = anns
		return p
	}
	tests := []struct {
		name   string
		mutate func([]m) []m
		want   string
	}{
		{"index not from 0", func(evs []m) []m { evs[14]["annotation_index"] = 1; return evs }, "event 14 (response.output_text.annotation.added): annotation_index 1, want 0"},
		{"no annotation", func(evs []m) []m { delete(evs[14], "annotation"); return evs }, "no annotation object with a type"},
		{"after the text's done", func(evs []m) []m { evs[14], evs[15] = evs[15], evs[14]; return evs }, "event 15 (response.output_text.annotation.added): annotation outside an open output_text part"},
		{"part done without it", func(evs []m) []m { evs[16]["part"] = withAnns(); return evs }, "event 16 (response.content_part.done): part annotations [], want those announced"},
		{"item without it", func(evs []m) []m { evs[17]["item"] = msgItem("completed", []any{withAnns()}); return evs }, "event 17 (response.output_item.done): item content[0] annotations [], want those announced"},
		{"part done with one more", func(evs []m) []m { evs[16]["part"] = withAnns(citation, citation); return evs }, "part annotations"},
		{"not announced", func(evs []m) []m { return append(evs[:14:14], evs[15:]...) }, "event 15 (response.content_part.done): part annotations"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Check(render(tt.mutate(annotated())))
			if err == nil {
				t.Fatalf("Check() = nil; want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Check() = %q; want it to contain %q", err, tt.want)
			}
		})
	}
}
