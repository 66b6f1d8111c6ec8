package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
	"github.com/ciproxy/ciproxy/internal/sse"
	"github.com/ciproxy/ciproxy/internal/upstream/chat"
)

// ResponsesAPI is an upstream that answers OpenAI Responses API requests: the seam between the
// intercept engine, which speaks only Responses, and whatever API a deployment speaks. The engine
// sends one Responses request body per loop iteration and reads the answer as Responses streaming
// events, whether the upstream streamed or answered with one JSON object; each implementation
// translates both ways for its own API, so a new upstream API is one new implementation and the
// engine does not change.
//
// *Target is the implementation for upstreams that speak the Responses API themselves (OpenAI,
// vLLM, Ollama, ...): the body goes to POST {api_base}/responses unchanged but for "model", and
// the answer is read as it came (see Target.Responses). An implementation for an upstream that
// only speaks Chat Completions converts the body into a chat request (input items into messages,
// function tools into chat tools, tool_choice, include) and the chat answer back into the events
// a Responses server would have sent for it: response.created, then for each output item
// response.output_item.added, its deltas (output_text.delta, function_call_arguments.delta, ...)
// and response.output_item.done, then one terminal event (response.completed,
// response.incomplete or response.failed) whose response carries the whole output and the usage.
// docs/wire-openai.md describes those events.
//
// Implementations are safe for concurrent use; each ResponseEvents serves one answer.
type ResponsesAPI interface {
	// Responses sends one Responses request. body is a JSON object (never modified); its "stream"
	// says whether the client asked for a stream, and an implementation may stream from its
	// upstream either way. h holds the headers to send (never modified); the implementation sets
	// the deployment's credentials. ctx bounds the whole answer, reading included.
	//
	// A non-2xx answer is a *StatusError holding the upstream's status, headers and body as they
	// came, so the client can be given them unchanged. Any other error means no answer was read:
	// an *apierror.Error when it can be shown to the client as it is, otherwise the cause.
	Responses(ctx context.Context, body []byte, h http.Header) (ResponseEvents, error)
}

// ResponseEvents is one upstream answer as Responses streaming events. It is not safe for
// concurrent use.
type ResponseEvents interface {
	// Next returns the next event's JSON object, with its "type" key, as the Responses API streams
	// it; the caller owns the bytes. A non-streaming answer arrives as a single terminal event
	// (response.completed, response.incomplete or response.failed, as its status says) carrying
	// the whole Response. io.EOF ends the answer; an answer that is not a Responses answer is an
	// error wrapping ErrMalformed; any other error means the answer could not be read to its end.
	Next() ([]byte, error)
	// Close releases the answer; it may be called before Next returned io.EOF.
	Close() error
}

// ErrMalformed marks an upstream answer that is not a Responses API answer.
var ErrMalformed = errors.New("upstream: not a Responses API answer")

// StatusError is an upstream's non-2xx answer. The client gets it as it came (Write).
type StatusError struct {
	Status int
	Header http.Header
	Body   []byte
}

func (e *StatusError) Error() string { return "upstream answered " + strconv.Itoa(e.Status) }

// Write sends the upstream's answer to the client before anything else was written: its status
// and body, its content type, and the headers that tell a client when to retry.
func (e *StatusError) Write(w http.ResponseWriter) {
	h := w.Header()
	ct := e.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/json"
	}
	h.Set("Content-Type", ct)
	for _, k := range []string{"Retry-After", "Retry-After-Ms", "X-Should-Retry", "X-Request-Id"} {
		if v := e.Header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(e.Body)))
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.Body)
}

// maxAnswerBody bounds a non-streaming answer read into memory; maxErrorBody an error answer's
// body (OpenAI's are a few hundred bytes; one larger says nothing a client needs).
const (
	maxAnswerBody = 64 << 20
	maxErrorBody  = 1 << 20
)

// readErrorBody reads an upstream's error answer of the given status, at most maxErrorBody: a
// larger one is replaced by an OpenAI-shaped error saying so, since a cut body would reach the
// client as broken JSON.
func readErrorBody(r io.Reader, status int) []byte {
	b, _ := io.ReadAll(io.LimitReader(r, maxErrorBody+1))
	if len(b) <= maxErrorBody {
		return ValidUTF8(b) // relayed as it came otherwise
	}
	return fmt.Appendf(nil, `{"error":{"message":"The upstream answered %d with an error body over %d bytes, which this proxy does not relay.","type":"`+apierror.TypeUpstream+`","param":null,"code":null}}`, status, maxErrorBody)
}

// ValidUTF8 returns b with each run of bytes that is not UTF-8 replaced by U+FFFD (see
// chat.ValidUTF8): what an upstream sends is made valid where it enters, whichever API it speaks.
func ValidUTF8(b []byte) []byte { return chat.ValidUTF8(b) }

var _ ResponsesAPI = (*Target)(nil)

// Responses implements [ResponsesAPI.Responses] for an upstream that speaks the Responses API:
// the body is posted to /responses (Post's failover and header rules apply) and the answer read
// by ReadAnswer.
func (t *Target) Responses(ctx context.Context, body []byte, h http.Header) (ResponseEvents, error) {
	resp, _, err := t.Post(ctx, "/responses", body, h)
	if err != nil {
		return nil, err
	}
	return ReadAnswer(ctx, resp)
}

// ReadAnswer returns the events of resp, an upstream's HTTP answer to a Responses request (ctx is
// the request's): a text/event-stream body is read event by event (data: [DONE] is skipped); any
// other 2xx body is read whole as one Response object (valid JSON of at most 64 MiB), which must
// hold an output list. A 4xx or 5xx answer is read (see readErrorBody), closed and returned as a
// *StatusError. Any other status (a redirect, which is never followed, or a stray 1xx) is
// ErrMalformed: relayed, it would be a bodyless answer no client can read. The caller closes the
// events.
func ReadAnswer(ctx context.Context, resp *http.Response) (ResponseEvents, error) {
	if resp.StatusCode/100 != 2 {
		return nil, failedAnswer(ctx, resp, func(b []byte) error {
			return &StatusError{Status: resp.StatusCode, Header: resp.Header, Body: b}
		})
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		return &sseAnswer{rd: sse.NewReader(resp.Body), body: resp.Body}, nil
	}
	return &jsonAnswer{body: resp.Body}, nil
}

// failedAnswer closes a non-2xx answer and returns its error: a redirect is malformed, an
// error status is what asError makes of its body (read within bounds), unless ctx ended first.
func failedAnswer(ctx context.Context, resp *http.Response, asError func(body []byte) error) error {
	defer resp.Body.Close()
	if resp.StatusCode < 400 {
		return fmt.Errorf("%w: the upstream answered %d (redirects are not followed)", ErrMalformed, resp.StatusCode)
	}
	b := readErrorBody(resp.Body, resp.StatusCode)
	if ctx.Err() != nil {
		return fmt.Errorf("reading the upstream's error: %w", ctx.Err())
	}
	return asError(b)
}

// sseAnswer is a streamed Responses answer.
type sseAnswer struct {
	rd   *sse.Reader
	body io.Closer
}

func (a *sseAnswer) Next() ([]byte, error) {
	for {
		ev, err := a.rd.Next()
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(ev.Data, []byte("[DONE]")) {
			return ev.Data, nil
		}
	}
}

func (a *sseAnswer) Close() error { return a.body.Close() }

// jsonAnswer is a non-streaming Responses answer, delivered as its terminal event.
type jsonAnswer struct {
	body io.ReadCloser
	read bool
}

func (a *jsonAnswer) Next() ([]byte, error) {
	if a.read {
		return nil, io.EOF
	}
	a.read = true
	b, err := io.ReadAll(io.LimitReader(a.body, maxAnswerBody+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxAnswerBody {
		// Cut at the cap, its start may still parse as a complete answer.
		return nil, fmt.Errorf("%w: answer over %d bytes", ErrMalformed, maxAnswerBody)
	}
	if !jsondepth.Within(b, jsondepth.Max-1) { // its terminal event adds one level
		return nil, fmt.Errorf("%w: JSON nested deeper than %d levels", ErrMalformed, jsondepth.Max)
	}
	// gjson reads a cut or trailing-garbage document leniently; the answer must be whole.
	if !gjson.ValidBytes(b) {
		return nil, fmt.Errorf("%w: not valid JSON", ErrMalformed)
	}
	root := gjson.ParseBytes(b)
	if !root.IsObject() || !root.Get("output").IsArray() {
		return nil, fmt.Errorf("%w: no output in the response", ErrMalformed)
	}
	return TerminalEvent(b), nil
}

func (a *jsonAnswer) Close() error { return a.body.Close() }

// TerminalEvent returns the terminal Responses event that carries resp, a whole Response object:
// response.incomplete or response.failed when its status says so, response.completed otherwise.
// An implementation of ResponsesAPI whose upstream answered in one piece ends with it.
func TerminalEvent(resp []byte) []byte {
	typ := "response.completed"
	switch gjson.GetBytes(resp, "status").String() {
	case "incomplete":
		typ = "response.incomplete"
	case "failed":
		typ = "response.failed"
	}
	// Assembled around resp rather than marshalled: encoding/json would re-escape its bytes.
	b := make([]byte, 0, len(resp)+len(typ)+24)
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","response":`...)
	b = append(b, resp...)
	return append(b, '}')
}
