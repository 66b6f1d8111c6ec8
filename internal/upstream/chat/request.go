// Package chat translates between the Responses API and Chat Completions, for upstreams that
// speak only Chat Completions: a /v1/responses body becomes a /chat/completions body (NewRequest),
// and the answer becomes the Response (Request.Response) or the Responses events (Stream) a
// Responses upstream would have sent. upstream.ChatAPI is the seam that posts the request and
// reads the answer with it; docs/chat-completions.md holds the mapping table; keep both in step.
//
// Everything here is pure: no I/O, no shared state, no clock but Options.Now (completed_at).
package chat

// The request side: the body (request.go) and its input items as messages (input.go).

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sse"
)

var (
	// ErrUnsupported marks a Responses request field or value that a Chat Completions upstream
	// cannot serve (a built-in tool, background mode, a stored prompt, ...). It comes wrapped in a
	// 400 *apierror.Error whose Param names the field.
	ErrUnsupported = errors.New("not translatable to Chat Completions")
	// ErrInvalid marks a body that is not a valid Responses request (a wrong type, a missing
	// required field). It comes wrapped in a 400 *apierror.Error whose Param names the field.
	ErrInvalid = errors.New("invalid Responses request")
)

// Options says how Responses requests are put to one Chat Completions deployment. The zero
// value suits most servers.
type Options struct {
	// MaxCompletionTokens sends max_output_tokens as max_completion_tokens (OpenAI's current name,
	// which its reasoning models require) instead of max_tokens (the name every server knows).
	MaxCompletionTokens bool
	// ReasoningField names the assistant-message field that carries the text of input reasoning
	// items back to the model: "reasoning_content" (vLLM, SGLang, DeepSeek, llama.cpp) or
	// "reasoning" (vLLM 0.10 and later). Any other value, "" included, drops input reasoning items:
	// OpenAI's own Chat Completions API and most providers refuse unknown message fields.
	ReasoningField string
	// NewID mints the ids of output items (msg_, rs_, fc_) and the call ids an upstream left out.
	// nil means 48 random hex digits after the prefix, the shape of OpenAI's ids.
	NewID func(prefix string) string
	// MaxCodeSize is the size past which the caller refuses a call's arguments (max_code_size;
	// 0 means config.DefaultMaxCodeSize). The translation keeps at most that plus ArgsSlack of
	// one call's arguments: past it the call is cut (see Stream).
	MaxCodeSize int
	// Now is the clock of completed_at; nil means time.Now.
	Now func() time.Time
}

const (
	// ArgsSlack is how far past MaxCodeSize a call's arguments are kept, so that the caller,
	// which refuses arguments over MaxCodeSize, still sees that they are over it.
	ArgsSlack = 64 << 10
	// maxAnswerKept bounds the text, refusal, reasoning, arguments and logprobs one answer keeps:
	// about what a native Responses upstream's response.completed, one event of at most
	// DefaultMaxEventSize, can carry. Past it the answer fails.
	maxAnswerKept = sse.DefaultMaxEventSize
)

// Request is one Responses request translated for a Chat Completions upstream: the body to
// post, and what translating the answer back needs (the fields a Response repeats from its
// request). Build it with NewRequest; it is immutable, and safe for concurrent use when
// Options.NewID is (the default is).
type Request struct {
	// Body is the Chat Completions request, to be posted to /chat/completions. The caller must
	// not modify it.
	Body []byte
	// Stream reports whether the client asked for a stream; Body then asks the upstream for one,
	// with usage in its last chunk.
	Stream bool

	newID    func(prefix string) string
	logprobs bool // the client included message.output_text.logprobs
	maxArgs  int  // the bytes of one call's arguments kept: MaxCodeSize plus ArgsSlack
	now      func() time.Time
	tmpl     response       // what its Responses repeat from the request (responseEcho.newTemplate)
	frame    *responseFrame // tmpl's echo groups, encoded
}

// responseEcho holds the request's values that a Response repeats, as raw JSON ("" when the
// request left them out or sent null).
type responseEcho struct {
	model, instructions, maxOutputTokens, maxToolCalls, parallelToolCalls json.RawMessage
	promptCacheKey, reasoning, safetyIdentifier, serviceTier, store       json.RawMessage
	temperature, text, toolChoice, tools, topLogprobs, topP, truncation   json.RawMessage
	user, metadata                                                        json.RawMessage
}

// chatOwned are Chat Completions fields that are not Responses fields: the translation writes
// them itself, so a client may not send them to /v1/responses.
var chatOwned = map[string]bool{
	"messages": true, "functions": true, "function_call": true, "n": true, "max_tokens": true,
	"max_completion_tokens": true, "response_format": true, "logprobs": true, "reasoning_effort": true,
	"verbosity": true, "modalities": true, "audio": true, "prediction": true, "web_search_options": true,
}

// hostedToolChoice are the types of tool_choice that force a built-in tool ({"type":"web_search"}):
// OpenAI's ToolChoiceTypes, and the later tools chosen the same way.
var hostedToolChoice = map[string]bool{
	"code_interpreter": true, "file_search": true, "web_search": true, "web_search_preview": true,
	"web_search_preview_2025_03_11": true, "image_generation": true, "computer": true, "computer_use": true,
	"computer_use_preview": true, "apply_patch": true, "shell": true,
}

// NewRequest translates a Responses request body into a Chat Completions request; see
// docs/chat-completions.md for the mapping. body is neither modified nor retained.
//
// The request must already be resolved: previous_response_id, item_reference items and
// code_interpreter tools are the caller's to replace (with input items, and a function tool); any
// that remain are refused. A field that cannot be translated is a 400 *apierror.Error wrapping
// ErrUnsupported, a malformed one a 400 wrapping ErrInvalid; either names the field in
// Param. Fields the Responses API does not define pass into the chat body unchanged, so server
// options such as top_k or chat_template_kwargs reach servers that take them.
func NewRequest(body []byte, opts Options) (*Request, error) {
	if !gjson.ValidBytes(body) {
		return nil, invalid("", "We could not parse the JSON body of your request.")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, invalid("", "The request body must be a JSON object.")
	}
	t := &chatTranslation{opts: opts, out: chatBody{}}
	t.msgs.field = opts.ReasoningField
	t.msgs.open, t.msgs.lastOther = -1, -1
	var err error
	root.ForEach(func(k, v gjson.Result) bool {
		err = t.field(k.Str, v)
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	if len(t.out.Model) == 0 {
		return nil, missing("model")
	}
	if err := t.finish(); err != nil {
		return nil, err
	}
	b, err := t.marshal()
	if err != nil {
		return nil, invalid("", "The request body could not be translated: "+err.Error())
	}
	newID := opts.NewID
	if newID == nil {
		newID = newRandomID
	}
	tmpl, err := t.echo.newTemplate()
	if err != nil {
		// A value the Response repeats (metadata, reasoning) nested past what clients decode.
		return nil, invalid("", "The request body could not be translated: "+err.Error())
	}
	frame, err := newResponseFrame(newEncoder(), &tmpl)
	if err != nil {
		return nil, invalid("", "The request body could not be translated: "+err.Error())
	}
	maxArgs := opts.MaxCodeSize
	if maxArgs <= 0 {
		maxArgs = config.DefaultMaxCodeSize
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Request{Body: b, Stream: t.out.Stream, newID: newID, logprobs: t.logprobs, maxArgs: maxArgs + ArgsSlack, now: now, tmpl: tmpl, frame: frame}, nil
}

// NewID mints an id with the given prefix (resp_ for the Response itself) as Options.NewID says.
func (r *Request) NewID(prefix string) string { return r.newID(prefix) }

// chatTranslation is the state of one NewRequest call.
type chatTranslation struct {
	opts Options
	out  chatBody
	echo responseEcho
	msgs messageList

	instructions gjson.Result
	input        gjson.Result
	tools        gjson.Result
	toolChoice   gjson.Result
	parallel     gjson.Result
	topLogprobs  gjson.Result
	logprobs     bool
	extra        []extraField
}

type extraField struct {
	key string
	raw json.RawMessage
}

func present(v gjson.Result) bool { return v.Exists() && v.Type != gjson.Null }

// raw returns v's JSON text, or nil when v is absent or null.
func raw(v gjson.Result) json.RawMessage {
	if !present(v) {
		return nil
	}
	return json.RawMessage(v.Raw)
}

// str returns v's string, or nil when v is absent or null (see chatBody for why not raw).
func str(v gjson.Result) *string {
	if !present(v) {
		return nil
	}
	s := v.String()
	return &s
}

// textOrRaw is v as a message's content: its string when it is one, else its JSON text.
func textOrRaw(v gjson.Result) any {
	if v.Type == gjson.String {
		return v.Str
	}
	return raw(v)
}

// field handles one top-level field of the Responses request.
func (t *chatTranslation) field(key string, v gjson.Result) error {
	if !present(v) {
		return nil // null means "not set" for every field
	}
	switch key {
	case "model":
		if v.Type != gjson.String {
			return invalidType(key, "a string")
		}
		t.out.Model = raw(v)
		t.echo.model = raw(v)
	case "input":
		if v.Type != gjson.String && !v.IsArray() {
			return invalidType(key, "a string or an array of input items")
		}
		t.input = v
	case "instructions":
		if v.Type != gjson.String {
			return invalidType(key, "a string")
		}
		t.instructions = v
		t.echo.instructions = raw(v)
	case "tools":
		if !v.IsArray() {
			return invalidType(key, "an array")
		}
		t.tools = v
		t.echo.tools = raw(v)
	case "tool_choice":
		t.toolChoice = v
		t.echo.toolChoice = raw(v)
	case "parallel_tool_calls":
		if !isBool(v) {
			return invalidType(key, "a boolean")
		}
		t.parallel = v
		t.echo.parallelToolCalls = raw(v)
	case "max_output_tokens":
		if !isInt(v) {
			return invalidType(key, "an integer")
		}
		if t.opts.MaxCompletionTokens {
			t.out.MaxCompletionTokens = raw(v)
		} else {
			t.out.MaxTokens = raw(v)
		}
		t.echo.maxOutputTokens = raw(v)
	case "max_tool_calls":
		// Counts built-in tool calls only; a chat upstream has none. Echoed, not sent.
		if !isInt(v) {
			return invalidType(key, "an integer")
		}
		t.echo.maxToolCalls = raw(v)
	case "temperature", "top_p":
		if v.Type != gjson.Number {
			return invalidType(key, "a number")
		}
		if key == "temperature" {
			t.out.Temperature, t.echo.temperature = raw(v), raw(v)
		} else {
			t.out.TopP, t.echo.topP = raw(v), raw(v)
		}
	case "top_logprobs":
		if !isInt(v) {
			return invalidType(key, "an integer")
		}
		t.topLogprobs = v
		t.echo.topLogprobs = raw(v)
	case "text":
		return t.text(v)
	case "reasoning":
		if !v.IsObject() {
			return invalidType(key, "an object")
		}
		t.echo.reasoning = raw(v)
		if e := v.Get("effort"); present(e) {
			if e.Type != gjson.String {
				return invalidType("reasoning.effort", "a string")
			}
			t.out.ReasoningEffort = raw(e)
		}
		// reasoning.summary: chat servers return their reasoning text itself, never a summary.
	case "stream":
		if !isBool(v) {
			return invalidType(key, "a boolean")
		}
		if v.Bool() {
			t.out.Stream = true
		}
	case "stream_options":
		// include_obfuscation pads Responses events; chat servers do not know it.
		if !v.IsObject() {
			return invalidType(key, "an object")
		}
	case "include":
		if !v.IsArray() {
			return invalidType(key, "an array")
		}
		v.ForEach(func(_, s gjson.Result) bool {
			if s.String() == "message.output_text.logprobs" {
				t.logprobs = true
			}
			return true
		})
	case "store":
		// The proxy keeps the response; the chat field of that name is OpenAI's own storage.
		if !isBool(v) {
			return invalidType(key, "a boolean")
		}
		t.echo.store = raw(v)
	case "metadata":
		// Kept with the response (echoed); OpenAI's chat API takes it only with store.
		if !v.IsObject() {
			return invalidType(key, "an object")
		}
		t.echo.metadata = raw(v)
	case "truncation":
		// "disabled" is what every chat server does; "auto" cannot be honoured upstream, and an
		// overflowing context fails with the upstream's own error instead.
		if v.Type != gjson.String {
			return invalidType(key, "a string")
		}
		t.echo.truncation = raw(v)
	case "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier":
		if v.Type != gjson.String {
			return invalidType(key, "a string")
		}
		switch key {
		case "user":
			t.out.User, t.echo.user = raw(v), raw(v)
		case "safety_identifier":
			t.out.SafetyIdentifier, t.echo.safetyIdentifier = raw(v), raw(v)
		case "prompt_cache_key":
			t.out.PromptCacheKey, t.echo.promptCacheKey = raw(v), raw(v)
		case "prompt_cache_retention":
			t.out.PromptCacheRetention = raw(v)
		case "service_tier":
			t.out.ServiceTier, t.echo.serviceTier = raw(v), raw(v)
		}
	case "background":
		if v.Type == gjson.False {
			return nil
		}
		return unsupported(key, "Background mode is not supported for this model: its upstream speaks only Chat Completions.")
	case "previous_response_id":
		return unsupported(key, "previous_response_id must be resolved into input items before a Chat Completions upstream is called.")
	case "conversation", "prompt", "context_management", "moderation", "prompt_cache_options":
		return unsupported(key, "Unsupported parameter: '"+key+"' is not supported for this model: its upstream speaks only Chat Completions.")
	default:
		if chatOwned[key] {
			return unsupported(key, "Unknown parameter: '"+key+"'. It is a Chat Completions parameter, not a Responses one.")
		}
		if !json.Valid([]byte(v.Raw)) {
			// Valid for gjson but nested past what encoding/json (and most servers) accept.
			return invalid(key, "Invalid value for '"+key+"': nested too deeply.")
		}
		for i, e := range t.extra {
			if e.key == key {
				t.extra[i].raw = raw(v)
				return nil
			}
		}
		t.extra = append(t.extra, extraField{key, raw(v)})
	}
	return nil
}

// field names a key whose value readFields stores in v.
type field struct {
	key string
	v   *gjson.Result
}

// readFields reads the values of object o's keys in one pass, each as o.Get(key) gives it (the
// first of duplicate keys): one Get per key would scan o again each time.
func readFields(o gjson.Result, fields ...field) {
	o.ForEach(func(k, v gjson.Result) bool {
		for _, f := range fields {
			if k.Str == f.key && !f.v.Exists() {
				*f.v = v
			}
		}
		return true
	})
}

func isBool(v gjson.Result) bool { return v.Type == gjson.True || v.Type == gjson.False }

func isInt(v gjson.Result) bool {
	if v.Type != gjson.Number {
		return false
	}
	_, err := strconv.ParseInt(v.Raw, 10, 64)
	return err == nil
}

// finish translates what needs several fields at once: messages, tools and tool_choice.
func (t *chatTranslation) finish() error {
	if present(t.instructions) {
		// system, not developer: every chat server knows system, and OpenAI treats it as
		// developer for the models that have the distinction.
		t.msgs.add(chatMessage{Role: "system", Content: textOrRaw(t.instructions)})
	}
	switch {
	case t.input.Type == gjson.String:
		t.msgs.add(chatMessage{Role: "user", Content: t.input.Str})
	case t.input.IsArray():
		var err error
		t.input.ForEach(func(k, it gjson.Result) bool {
			err = t.msgs.item("input["+k.String()+"]", it)
			return err == nil
		})
		if err != nil {
			return err
		}
		if t.msgs.items == 0 {
			return emptyArray("input")
		}
		if err := t.msgs.checkAnswered(); err != nil {
			return err
		}
	default:
		// OpenAI's answer to a request without input (and without previous_response_id, which
		// the caller has resolved into input items), instructions or not.
		return missing("input")
	}
	t.out.Messages = t.msgs.messages()
	if t.out.Messages == nil {
		t.out.Messages = []chatMessage{}
	}
	if err := t.toolList(); err != nil {
		return err
	}
	if t.logprobs {
		t.out.Logprobs = true
		if present(t.topLogprobs) && t.topLogprobs.Int() > 0 {
			t.out.TopLogprobs = raw(t.topLogprobs)
		}
	}
	return nil
}
