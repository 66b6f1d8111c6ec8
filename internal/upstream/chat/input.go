package chat

// Responses ⇄ Chat Completions, the request side's input: Responses input items become chat
// messages (see request.go for the rest of the request).

import (
	"encoding/json"
	"strings"

	"github.com/tidwall/gjson"
)

// messageList builds the chat messages from input items.
type messageList struct {
	list  []chatMessage
	field string // Options.ReasoningField
	// open is the index of the assistant message that function calls join (the last message,
	// when it is an assistant's and only reasoning came after it), or -1.
	open int
	// reasoning is the text of reasoning items waiting for the next assistant message.
	reasoning    strings.Builder
	hasReasoning bool

	// The pairing of function calls and outputs, by call_id and checked as OpenAI checks it:
	// every output answers a call before it, and every call is answered unless nothing but calls
	// follows it. Outputs are kept apart, by call_id: messages() puts each right after the
	// assistant message of its call, in the order of the calls, as chat servers require, whatever
	// came between the call and its output.
	items     int            // input items so far
	calls     map[string]int // call_id → index of its call among calls
	callOrder []callSeen     // the calls in input order
	lastOther int            // index of the last item that is not a function_call, -1 for none
	outputs   map[string][]chatMessage
}

type callSeen struct {
	id       string
	item     int // its input item's index
	answered bool
}

func (m *messageList) add(msg chatMessage) {
	m.list = append(m.list, msg)
	if msg.Role == "assistant" {
		m.open = len(m.list) - 1
		m.attachReasoning(m.open)
	} else {
		m.endTurn()
	}
}

// endTurn closes the model's turn: later calls start a new assistant message.
func (m *messageList) endTurn() {
	m.open = -1
	m.reasoning.Reset()
	m.hasReasoning = false // reasoning not followed by the model's own message leads nowhere
}

// messages returns the chat messages: each assistant message with tool calls followed by the
// tool messages that answer them, in the order of its calls.
func (m *messageList) messages() []chatMessage {
	if len(m.outputs) == 0 {
		return m.list
	}
	out := make([]chatMessage, 0, len(m.list)+len(m.outputs))
	for _, msg := range m.list {
		out = append(out, msg)
		for _, c := range msg.ToolCalls {
			out = append(out, m.outputs[c.ID]...)
			delete(m.outputs, c.ID) // a call_id repeated in a later turn is answered once
		}
	}
	return out
}

// attachReasoning gives the waiting reasoning text to message i.
func (m *messageList) attachReasoning(i int) {
	if !m.hasReasoning {
		return
	}
	text := m.reasoning.String()
	m.reasoning.Reset()
	m.hasReasoning = false
	msg := &m.list[i]
	target := &msg.ReasoningContent
	if m.field == "reasoning" {
		target = &msg.Reasoning
	}
	if *target != nil {
		text = **target + "\n\n" + text
	}
	*target = &text
}

// inputItem holds the fields of an input item the translation reads (readFields).
type inputItem struct {
	typ, role, content, callID, name, arguments, output gjson.Result
}

func readItem(it gjson.Result) inputItem {
	var f inputItem
	readFields(it, field{"type", &f.typ}, field{"role", &f.role}, field{"content", &f.content}, field{"call_id", &f.callID},
		field{"name", &f.name}, field{"arguments", &f.arguments}, field{"output", &f.output})
	return f
}

// item translates one input item.
func (m *messageList) item(param string, it gjson.Result) error {
	if !it.IsObject() {
		return invalidType(param, "an input item object")
	}
	f := readItem(it)
	typ := f.typ.String()
	if typ == "" && f.role.Exists() {
		typ = "message"
	}
	if m.items++; typ != "function_call" {
		m.lastOther = m.items - 1
	}
	switch typ {
	case "message":
		return m.message(param, f)
	case "function_call":
		return m.functionCall(param, f)
	case "function_call_output":
		return m.functionOutput(param, f)
	case "reasoning":
		if m.field != "reasoning_content" && m.field != "reasoning" {
			return nil // this upstream takes no reasoning back (Options.ReasoningField)
		}
		// The reasoning text itself (content); a summary or encrypted content only is not the
		// model's reasoning and cannot be given back.
		f.content.ForEach(func(_, c gjson.Result) bool {
			if c.Get("type").String() == "reasoning_text" {
				if m.hasReasoning {
					m.reasoning.WriteString("\n\n")
				}
				m.reasoning.WriteString(c.Get("text").String())
				m.hasReasoning = true
			}
			return true
		})
		if m.hasReasoning && m.open >= 0 && len(m.list[m.open].ToolCalls) > 0 {
			// Between the calls of one turn: it belongs to the same assistant message.
			m.attachReasoning(m.open)
		}
		return nil
	case "item_reference":
		return unsupportedValue(param, "Item references must be resolved into items before a Chat Completions upstream is called.")
	default:
		return unsupportedValue(param+".type", "Input items of type '"+typ+"' are not supported for this model: its upstream speaks only Chat Completions.")
	}
}

func (m *messageList) message(param string, it inputItem) error {
	role := it.role.String()
	content := it.content
	switch role {
	case "user", "system", "developer":
		msg, err := inputContent(param+".content", content, role)
		if err != nil {
			return err
		}
		if role == "developer" {
			role = "system" // see instructions: system is the role every server knows
		}
		msg.Role = role
		m.add(msg)
	case "assistant":
		msg := chatMessage{Role: "assistant"}
		switch {
		case content.Type == gjson.String:
			msg.Content = content.Str
		case content.IsArray():
			var text, refusal strings.Builder
			hasText, hasRefusal := false, false
			var err error
			content.ForEach(func(k, p gjson.Result) bool {
				pp := param + ".content[" + k.String() + "]"
				switch p.Get("type").String() {
				case "output_text", "input_text":
					text.WriteString(p.Get("text").String())
					hasText = true
				case "refusal":
					refusal.WriteString(p.Get("refusal").String())
					hasRefusal = true
				default:
					err = unsupportedValue(pp+".type", "Assistant messages may hold only output_text and refusal parts for this model.")
				}
				return err == nil
			})
			if err != nil {
				return err
			}
			if hasText {
				msg.Content = text.String()
			}
			if hasRefusal {
				msg.Refusal = refusal.String()
			}
			if !hasText && !hasRefusal {
				msg.Content = ""
			}
		default:
			return invalidType(param+".content", "a string or an array of content parts")
		}
		m.add(msg)
	case "":
		return missing(param + ".role")
	default:
		return invalidValue(param+".role", "Invalid value: '"+role+"'. Supported values are: 'user', 'assistant', 'system' and 'developer'.")
	}
	return nil
}

// inputContent translates the content of a user, system or developer message.
func inputContent(param string, content gjson.Result, role string) (chatMessage, error) {
	if content.Type == gjson.String {
		return chatMessage{Content: content.Str}, nil
	}
	if !content.IsArray() {
		return chatMessage{}, invalidType(param, "a string or an array of content parts")
	}
	parts := []chatPart{}
	onlyText := true
	var err error
	content.ForEach(func(k, p gjson.Result) bool {
		pp := param + "[" + k.String() + "]"
		if !p.IsObject() {
			err = invalidType(pp, "a content part object")
			return false
		}
		// One pass over the part: a Get per key would scan it again each time, and a file's
		// data can be megabytes.
		var typ, text, fileID, imageURL, detail, fileURL, fileData, filename gjson.Result
		readFields(p, field{"type", &typ}, field{"text", &text}, field{"file_id", &fileID}, field{"image_url", &imageURL},
			field{"detail", &detail}, field{"file_url", &fileURL}, field{"file_data", &fileData}, field{"filename", &filename})
		switch typ := typ.String(); typ {
		case "input_text", "output_text":
			if text.Type != gjson.String {
				err = invalidType(pp+".text", "a string")
				return false
			}
			parts = append(parts, chatPart{Type: "text", Text: str(text)})
		case "input_image":
			onlyText = false
			if role != "user" {
				err = invalidValue(pp+".type", "Images are only allowed in user messages.")
				return false
			}
			if present(fileID) {
				err = unsupported(pp+".file_id", "Images by file_id are not supported for this model: its upstream speaks only Chat Completions; send image_url.")
				return false
			}
			if imageURL.Type != gjson.String {
				err = missing(pp + ".image_url")
				return false
			}
			part := chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: str(imageURL)}}
			if detail.Type == gjson.String {
				part.ImageURL.Detail = raw(detail)
			}
			parts = append(parts, part)
		case "input_file":
			onlyText = false
			if role != "user" {
				err = invalidValue(pp+".type", "Files are only allowed in user messages.")
				return false
			}
			for _, f := range []struct {
				key string
				v   gjson.Result
			}{{"file_id", fileID}, {"file_url", fileURL}} {
				if present(f.v) {
					err = unsupported(pp+"."+f.key, "Files by "+f.key+" are not supported for this model: its upstream speaks only Chat Completions; send file_data.")
					return false
				}
			}
			if fileData.Type != gjson.String {
				err = missing(pp + ".file_data")
				return false
			}
			file := &chatFile{FileData: str(fileData)}
			if filename.Type == gjson.String {
				file.Filename = str(filename)
			}
			parts = append(parts, chatPart{Type: "file", File: file})
		default:
			err = unsupportedValue(pp+".type", "Content parts of type '"+typ+"' are not supported for this model: its upstream speaks only Chat Completions.")
			return false
		}
		return true
	})
	if err != nil {
		return chatMessage{}, err
	}
	if onlyText && len(parts) == 1 {
		// One text part is the plain string every server takes (some take no part arrays).
		return chatMessage{Content: parts[0].Text}, nil
	}
	return chatMessage{Content: parts}, nil
}

func (m *messageList) functionCall(param string, it inputItem) error {
	callID := it.callID
	if callID.Type != gjson.String || callID.Str == "" {
		return missing(param + ".call_id")
	}
	name := it.name
	if name.Type != gjson.String || name.Str == "" {
		return missing(param + ".name")
	}
	args := it.arguments
	if args.Type != gjson.String {
		return invalidType(param+".arguments", "a string")
	}
	if m.calls == nil {
		m.calls = map[string]int{}
	}
	if _, dup := m.calls[callID.Str]; !dup {
		m.calls[callID.Str] = len(m.callOrder)
		m.callOrder = append(m.callOrder, callSeen{id: callID.Str, item: m.items - 1})
	}
	call := chatToolCall{ID: callID.Str, Type: "function", Function: chatFunction{Name: name.Str, Arguments: str(args)}}
	if m.open < 0 {
		// A turn that starts with calls: the message has no text.
		m.add(chatMessage{Role: "assistant", Content: json.RawMessage("null")})
	}
	msg := &m.list[m.open]
	msg.ToolCalls = append(msg.ToolCalls, call)
	m.attachReasoning(m.open)
	return nil
}

func (m *messageList) functionOutput(param string, it inputItem) error {
	callID := it.callID
	if callID.Type != gjson.String || callID.Str == "" {
		return missing(param + ".call_id")
	}
	k, ok := m.calls[callID.Str]
	if !ok {
		// What a chat server would refuse as an orphan tool message, in OpenAI's own words.
		return invalid("input", "No tool call found for function call output with call_id "+callID.Str+".")
	}
	m.callOrder[k].answered = true
	out := it.output
	var content any
	switch {
	case out.Type == gjson.String:
		content = out.Str
	case out.IsArray():
		// Tool messages take text only; the parts are joined, as the model reads them in a row.
		var b strings.Builder
		var err error
		out.ForEach(func(k, p gjson.Result) bool {
			switch typ := p.Get("type").String(); typ {
			case "input_text", "output_text":
				b.WriteString(p.Get("text").String())
			default:
				err = unsupportedValue(param+".output["+k.String()+"].type", "Function outputs of type '"+typ+"' are not supported for this model: "+
					"its upstream speaks only Chat Completions, whose tool messages hold text only.")
			}
			return err == nil
		})
		if err != nil {
			return err
		}
		content = b.String()
	default:
		return invalidType(param+".output", "a string or an array of content parts")
	}
	if m.outputs == nil {
		m.outputs = map[string][]chatMessage{}
	}
	m.outputs[callID.Str] = append(m.outputs[callID.Str], chatMessage{Role: "tool", Content: content, ToolCallID: callID.Str})
	m.endTurn()
	return nil
}

// checkAnswered returns OpenAI's error for the first function call that no output answers
// although more input than calls follows it: a chat server would refuse the assistant message
// whose tool call is unanswered. Calls at the very end may stay unanswered.
func (m *messageList) checkAnswered() error {
	for _, c := range m.callOrder {
		if !c.answered && c.item < m.lastOther {
			return invalid("input", "No tool output found for function call "+c.id+".")
		}
	}
	return nil
}
