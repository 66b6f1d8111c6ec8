package upstream

// The Responses seam over a Chat Completions upstream: each Responses request is translated
// (package chat), posted to /chat/completions, and its answer translated back into the
// events a Responses upstream streams.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
	"github.com/ciproxy/ciproxy/internal/sse"
	"github.com/ciproxy/ciproxy/internal/upstream/chat"
)

// ChatAPI is the Responses seam (ResponsesAPI) for deployments that speak only Chat Completions.
// It keeps nothing between calls: the request it is given must be resolved already (no
// previous_response_id, no item_reference, no code_interpreter tool), since a chat upstream
// keeps no responses either. It is safe for concurrent use.
type ChatAPI struct {
	t    *Target
	opts chat.Options
}

// NewChatAPI returns the seam that sends Responses requests to t's deployments as chat
// completions built with opts (see ChatOptionsFor).
func NewChatAPI(t *Target, opts chat.Options) *ChatAPI { return &ChatAPI{t: t, opts: opts} }

var _ ResponsesAPI = (*ChatAPI)(nil)

// Responses implements [ResponsesAPI.Responses]: body is translated by chat.NewRequest (a field
// that cannot be translated is its 400 *apierror.Error, and nothing is sent) and posted to
// /chat/completions with Post's failover. A streamed answer is translated chunk by chunk as the
// events are read (chat.Stream); a JSON answer is read whole here and arrives as one terminal
// event, so an error object sent with a 2xx status is returned here as the *apierror.Error it
// maps to, and so is a body that breaks off (502 upstream_error "ended early") or cannot be
// read (502 upstream_error, wrapping ErrMalformed or chat.ErrShape). A non-2xx answer is a *StatusError with the upstream's status and retry headers, and
// its body as it came when it is OpenAI's error shape, else mapped into it (chat.UpstreamError).
func (c *ChatAPI) Responses(ctx context.Context, body []byte, h http.Header) (ResponseEvents, error) {
	r, err := chat.NewRequest(body, c.opts)
	if err != nil {
		return nil, err
	}
	resp, _, err := c.t.Post(ctx, "/chat/completions", r.Body, h)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, failedAnswer(ctx, resp, func(b []byte) error { return chatStatusError(resp.StatusCode, resp.Header, b) })
	}
	id := r.NewID("resp_")
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		return &chatStreamAnswer{rd: sse.NewReader(resp.Body), body: resp.Body, s: r.NewStream(id, 0)}, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody+1))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reading the upstream's answer: %w", ctx.Err())
		}
		var ae *apierror.Error
		if errors.As(err, &ae) {
			return nil, ae // the body's own account: it stalled (stream_idle_timeout)
		}
		// The upstream was reached and answered 2xx: its body broke off, as a stream can.
		return nil, apierror.BadGateway("The upstream's response ended early.", apierror.CodeUpstreamError, fmt.Errorf("reading the upstream's answer: %w", err))
	}
	if len(b) > maxAnswerBody {
		return nil, malformedAnswer(fmt.Errorf("%w: answer over %d bytes", ErrMalformed, maxAnswerBody))
	}
	if !jsondepth.Within(b, jsondepth.Max-2) { // the Response nests it one level down, its event two
		return nil, malformedAnswer(fmt.Errorf("%w: JSON nested deeper than %d levels", ErrMalformed, jsondepth.Max))
	}
	out, err := r.Response(b, id, 0)
	if err != nil {
		return nil, err
	}
	return &terminalAnswer{data: TerminalEvent(out)}, nil
}

// malformedAnswer is a 2xx JSON answer that cannot be read, as the client is told of it: what
// the engine says of a native upstream's unreadable answer.
func malformedAnswer(err error) error {
	return apierror.BadGateway("The upstream's response could not be read.", apierror.CodeUpstreamError, err)
}

// terminalAnswer is an answer read in full: its one terminal event.
type terminalAnswer struct{ data []byte }

func (a *terminalAnswer) Next() ([]byte, error) {
	if a.data == nil {
		return nil, io.EOF
	}
	d := a.data
	a.data = nil
	return d, nil
}

func (a *terminalAnswer) Close() error { return nil }

// chatStreamAnswer is a streamed chat completion, translated as it is read.
type chatStreamAnswer struct {
	rd   *sse.Reader
	body io.Closer
	s    *chat.Stream
	evs  []sse.Event // translated events not yet returned
	err  error       // returned once evs are drained
}

// Next returns the next translated event. An error chunk from the upstream ends the events as a
// Responses upstream ends a failed stream (the error event, then response.failed: chat.Stream.Fail);
// a stream cut before its finish_reason is an error, and so is a chunk that cannot be read
// (wrapping ErrMalformed), as for a native upstream whose stream breaks.
func (a *chatStreamAnswer) Next() ([]byte, error) {
	for {
		if len(a.evs) > 0 {
			d := a.evs[0].Data
			a.evs = a.evs[1:]
			return d, nil
		}
		if a.err != nil {
			return nil, a.err
		}
		if a.s.Done() {
			return nil, io.EOF
		}
		var evs []sse.Event
		ev, err := a.rd.Next()
		switch {
		case err == io.EOF:
			evs, err = a.s.End()
		case err != nil:
			return nil, err
		case !jsondepth.Within(ev.Data, jsondepth.Max):
			// Read no further: gjson's validator recurses once per level (see package jsondepth).
			a.err = fmt.Errorf("%w: a chunk nests deeper than %d levels", ErrMalformed, jsondepth.Max)
			continue
		default:
			evs, err = a.s.Next(ev.Data)
		}
		switch {
		case err == nil:
		case errors.Is(err, chat.ErrStreamCut):
			a.err = err
		case errors.Is(err, chat.ErrStream): // the upstream's own error chunk
			evs = append(evs, a.s.Fail(err)...)
		default:
			a.err = fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		a.evs = evs
	}
}

func (a *chatStreamAnswer) Close() error { return a.body.Close() }

// chatStatusError is a chat upstream's non-2xx answer as the client gets it: its status (one
// outside 400-599 is 502) and headers, and its body as it came when it is OpenAI's error object
// already, else the OpenAI-shaped error chat.UpstreamError reads from it.
func chatStatusError(status int, header http.Header, body []byte) *StatusError {
	e := chat.UpstreamError(status, header, body)
	if openAIErrorBody(body, e.Type) {
		return &StatusError{Status: e.Status, Header: header, Body: body}
	}
	h := header.Clone()
	if h == nil {
		h = make(http.Header)
	}
	h.Set("Content-Type", "application/json")
	return &StatusError{Status: e.Status, Header: h, Body: e.JSON()}
}

// openAIErrorBody reports whether body is exactly OpenAI's {"error":{"message","type","param",
// "code"}}, with the type a client can rely on (typ, the one chat.UpstreamError settled on).
func openAIErrorBody(body []byte, typ string) bool {
	body = bytes.TrimSpace(body)
	if !jsondepth.Within(body, jsondepth.Max) || !gjson.ValidBytes(body) {
		return false
	}
	root := gjson.ParseBytes(body)
	keys := 0
	root.ForEach(func(_, _ gjson.Result) bool { keys++; return true })
	e := root.Get("error")
	if !root.IsObject() || keys != 1 || !e.IsObject() {
		return false
	}
	nullableString := func(v gjson.Result) bool { return v.Type == gjson.String || v.Type == gjson.Null }
	return e.Get("message").Type == gjson.String && e.Get("type").Type == gjson.String && e.Get("type").Str == typ &&
		e.Get("param").Exists() && nullableString(e.Get("param")) && e.Get("code").Exists() && nullableString(e.Get("code"))
}

// ChatOptionsFor returns how Responses requests are put to a Chat Completions deployment, from
// its provider (see docs/chat-completions.md, "Per deployment"):
//
//   - openai at OpenAI's own api_base, and azure: max_output_tokens as max_completion_tokens
//     (OpenAI's reasoning models refuse max_tokens), reasoning never sent back (OpenAI's chat API
//     refuses unknown message fields, and returns no reasoning text anyway);
//   - deepseek, hosted_vllm, and openai or no provider at another api_base (the usual way to
//     reach llama.cpp, SGLang, vLLM, TGI through LiteLLM's config): reasoning text back as
//     reasoning_content, which these servers read (DeepSeek requires it after a tool call);
//   - openrouter, ollama, ollama_chat: reasoning text back as reasoning, the field they use;
//   - every other provider: max_tokens, and no reasoning sent back (Mistral, Gemini, Anthropic's
//     compatibility layer and others refuse or ignore unknown message fields).
func ChatOptionsFor(d config.Deployment) chat.Options {
	switch d.Provider {
	case "azure":
		return chat.Options{MaxCompletionTokens: true}
	case "openai", "":
		if d.Provider == "openai" && d.APIBase == config.KnownAPIBase("openai") {
			return chat.Options{MaxCompletionTokens: true}
		}
		return chat.Options{ReasoningField: "reasoning_content"}
	case "deepseek", "hosted_vllm":
		return chat.Options{ReasoningField: "reasoning_content"}
	case "openrouter", "ollama", "ollama_chat":
		return chat.Options{ReasoningField: "reasoning"}
	}
	return chat.Options{}
}

// SameRequest returns the deployments of deps (in the order to try) that can be sent the
// /v1/responses request built for deps[0]: those speaking the same API, and for Chat
// Completions taking the same chat.Options, so failover never posts a body to a deployment that
// would read it differently.
func SameRequest(deps []config.Deployment) []config.Deployment {
	if len(deps) == 0 {
		return deps
	}
	first, opts := deps[0], ChatOptionsFor(deps[0])
	out := make([]config.Deployment, 0, len(deps))
	for _, d := range deps {
		if d.API != first.API {
			continue
		}
		if o := ChatOptionsFor(d); d.API == config.APIChatCompletions && (o.ReasoningField != opts.ReasoningField || o.MaxCompletionTokens != opts.MaxCompletionTokens) {
			continue
		}
		out = append(out, d)
	}
	return out
}
