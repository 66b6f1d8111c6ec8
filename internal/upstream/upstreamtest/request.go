package upstreamtest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
)

// Request is one request the server received, as the proxy sent it.
type Request struct {
	// N is the request's position among all requests to the server, from 0.
	N      int
	Method string
	Path   string // e.g. "/v1/responses"
	Header http.Header
	Body   []byte // the raw body

	// Fields holds the top-level fields of a JSON object body; nil when the body is not one.
	Fields map[string]json.RawMessage

	// The fields the scripted model acts on, parsed from Fields.
	Model              string
	Stream             bool
	Store              bool // true unless the body says "store":false
	PreviousResponseID string
	Instructions       string
	Include            []string
	// Input holds the input items; a string input becomes one item {"role":"user","content":...}.
	Input      []json.RawMessage
	Tools      []json.RawMessage
	ToolChoice json.RawMessage // nil when absent
	Reasoning  json.RawMessage // nil when absent
	// Messages holds a chat completions request's messages.
	Messages []json.RawMessage

	// History is what the model sees, as Responses items: for /v1/responses the items of the
	// previous_response_id chain (each response's inputs then its output), followed by Input,
	// with item references resolved; for /v1/chat/completions the messages as items (a message
	// item per system, developer, user or assistant text, a reasoning item per assistant
	// reasoning, a function_call per tool call, a function_call_output per tool message), so one
	// script serves both APIs.
	History []json.RawMessage
}

// Includes reports whether the request's include list holds v.
func (r Request) Includes(v string) bool { return slices.Contains(r.Include, v) }

// InputItems returns the input items of type typ. Items without a type that have a role count
// as "message".
func (r Request) InputItems(typ string) []json.RawMessage {
	var out []json.RawMessage
	for _, it := range r.Input {
		if itemType(it) == typ {
			out = append(out, it)
		}
	}
	return out
}

// FunctionOutput returns the output sent for the function call callID, found in History: the
// string itself, or the JSON text of an array output. It reports false when there is none.
func (r Request) FunctionOutput(callID string) (string, bool) {
	for _, it := range r.History {
		if itemType(it) != "function_call_output" || itemField(it, "call_id") != callID {
			continue
		}
		var v struct {
			Output json.RawMessage `json:"output"`
		}
		_ = json.Unmarshal(it, &v)
		var s string
		if json.Unmarshal(v.Output, &s) == nil {
			return s, true
		}
		return string(v.Output), true
	}
	return "", false
}

// ToolNames returns, for each tool, its name for function tools (Responses' {"name"} or Chat
// Completions' {"function":{"name"}}) and its type otherwise.
func (r Request) ToolNames() []string {
	var out []string
	for _, t := range r.Tools {
		var v struct {
			Type, Name string
			Function   struct{ Name string }
		}
		_ = json.Unmarshal(t, &v)
		if v.Type == "function" {
			if v.Name == "" {
				v.Name = v.Function.Name
			}
			out = append(out, v.Name)
		} else {
			out = append(out, v.Type)
		}
	}
	return out
}

// Tool returns the tool named name (a function's name, or another tool's type), or nil.
func (r Request) Tool(name string) json.RawMessage {
	for i, n := range r.ToolNames() {
		if n == name {
			return r.Tools[i]
		}
	}
	return nil
}

func itemType(it json.RawMessage) string {
	var v struct {
		Type string `json:"type"`
		Role string `json:"role"`
	}
	_ = json.Unmarshal(it, &v)
	if v.Type == "" && v.Role != "" {
		return "message"
	}
	return v.Type
}

func itemField(it json.RawMessage, key string) string {
	var v map[string]json.RawMessage
	if json.Unmarshal(it, &v) != nil {
		return ""
	}
	var s string
	_ = json.Unmarshal(v[key], &s)
	return s
}

// parseRequest fills the parsed fields from the body. It reports false when the body is not a
// JSON object.
func (r *Request) parse() bool {
	if err := json.Unmarshal(r.Body, &r.Fields); err != nil || r.Fields == nil {
		r.Fields = nil
		return false
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(r.Fields[k], &s)
		return s
	}
	r.Model = str("model")
	r.PreviousResponseID = str("previous_response_id")
	r.Instructions = str("instructions")
	_ = json.Unmarshal(r.Fields["stream"], &r.Stream)
	r.Store = true
	_ = json.Unmarshal(r.Fields["store"], &r.Store)
	_ = json.Unmarshal(r.Fields["include"], &r.Include)
	_ = json.Unmarshal(r.Fields["tools"], &r.Tools)
	_ = json.Unmarshal(r.Fields["messages"], &r.Messages)
	if raw, ok := r.Fields["tool_choice"]; ok {
		r.ToolChoice = raw
	}
	if raw, ok := r.Fields["reasoning"]; ok {
		r.Reasoning = raw
	}
	if raw, ok := r.Fields["input"]; ok {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			item, _ := json.Marshal(obj{{"role", "user"}, {"content", s}})
			r.Input = []json.RawMessage{item}
		} else {
			_ = json.Unmarshal(raw, &r.Input)
		}
	}
	return true
}

// clone returns a copy that shares nothing mutable with r.
func (r Request) clone() Request {
	c := r
	c.Header = r.Header.Clone()
	c.Body = bytes.Clone(r.Body)
	return c
}
