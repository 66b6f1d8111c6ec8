package chat

// The Chat Completions request body, in OpenAI's documented key order. Values from the
// Responses request are json.RawMessage, as they came, except the strings that can be large
// (texts, image URLs, file data, arguments): those are decoded strings, since encoding/json
// validates and compacts a json.RawMessage byte by byte at about a fifth of the rate it escapes
// a string. nil leaves a field out.

import (
	"encoding/json"
)

type chatBody struct {
	Model                json.RawMessage `json:"model"`
	Messages             []chatMessage   `json:"messages"`
	Tools                []chatTool      `json:"tools,omitempty"`
	ToolChoice           any             `json:"tool_choice,omitempty"` // json.RawMessage, a mode string, or *chatTool
	ParallelToolCalls    json.RawMessage `json:"parallel_tool_calls,omitempty"`
	ResponseFormat       *responseFormat `json:"response_format,omitempty"`
	ReasoningEffort      json.RawMessage `json:"reasoning_effort,omitempty"`
	Verbosity            json.RawMessage `json:"verbosity,omitempty"`
	MaxTokens            json.RawMessage `json:"max_tokens,omitempty"`
	MaxCompletionTokens  json.RawMessage `json:"max_completion_tokens,omitempty"`
	Temperature          json.RawMessage `json:"temperature,omitempty"`
	TopP                 json.RawMessage `json:"top_p,omitempty"`
	Logprobs             bool            `json:"logprobs,omitempty"`
	TopLogprobs          json.RawMessage `json:"top_logprobs,omitempty"`
	Stream               bool            `json:"stream,omitempty"`
	StreamOptions        *streamOptions  `json:"stream_options,omitempty"` // with Stream: usage in the last chunk
	User                 json.RawMessage `json:"user,omitempty"`
	SafetyIdentifier     json.RawMessage `json:"safety_identifier,omitempty"`
	PromptCacheKey       json.RawMessage `json:"prompt_cache_key,omitempty"`
	PromptCacheRetention json.RawMessage `json:"prompt_cache_retention,omitempty"`
	ServiceTier          json.RawMessage `json:"service_tier,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type responseFormat struct {
	Type       string      `json:"type"`
	JSONSchema *jsonSchema `json:"json_schema,omitempty"`
}

type jsonSchema struct {
	Name        json.RawMessage `json:"name"`
	Description json.RawMessage `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema"`
	Strict      json.RawMessage `json:"strict,omitempty"`
}

// chatMessage is one message.
type chatMessage struct {
	Role string `json:"role"`
	// Content is the request's own JSON (a string or null), a string, or []chatPart; nil leaves
	// it out.
	Content          any            `json:"content,omitempty"`
	Refusal          any            `json:"refusal,omitempty"` // a string
	ReasoningContent *string        `json:"reasoning_content,omitempty"`
	Reasoning        *string        `json:"reasoning,omitempty"`
	ToolCalls        []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string         `json:"tool_call_id,omitempty"`
}

type chatPart struct {
	Type     string        `json:"type"`
	Text     *string       `json:"text,omitempty"`
	ImageURL *chatImageURL `json:"image_url,omitempty"`
	File     *chatFile     `json:"file,omitempty"`
}

type chatImageURL struct {
	URL    *string         `json:"url"`
	Detail json.RawMessage `json:"detail,omitempty"`
}

type chatFile struct {
	Filename *string `json:"filename,omitempty"`
	FileData *string `json:"file_data"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"` // function
	Function chatFunction `json:"function"`
}

// chatTool is a function tool, and the tool_choice that forces one (by its name alone).
type chatTool struct {
	Type     string       `json:"type"` // function
	Function chatFunction `json:"function"`
}

// chatFunction is a tool's function (name, description, parameters, strict) or a call's (name,
// arguments).
type chatFunction struct {
	Name        string          `json:"name"`
	Description json.RawMessage `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      json.RawMessage `json:"strict,omitempty"`
	Arguments   *string         `json:"arguments,omitempty"`
}

// marshal encodes the chat body, then the fields passed through, as they came (json.Valid
// checked them in field).
func (t *chatTranslation) marshal() ([]byte, error) {
	if t.out.Stream {
		t.out.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	e := newEncoder()
	e.buf = make([]byte, 0, t.size())
	if err := e.encode(&t.out); err != nil {
		return nil, err
	}
	if len(t.extra) == 0 {
		return e.buf, nil
	}
	e.buf = e.buf[:len(e.buf)-1] // the closing brace; messages is always there, so a comma follows
	for _, x := range t.extra {
		e.buf = append(e.buf, ',')
		if err := e.encode(x.key); err != nil {
			return nil, err
		}
		e.buf = append(e.buf, ':')
		e.buf = append(e.buf, x.raw...)
	}
	return append(e.buf, '}'), nil
}

// size guesses the encoded body's length: about what it was given.
func (t *chatTranslation) size() int {
	n := 256 + len(t.input.Raw) + len(t.instructions.Raw) + len(t.tools.Raw)
	for _, e := range t.extra {
		n += len(e.key) + len(e.raw) + 4
	}
	return n
}
