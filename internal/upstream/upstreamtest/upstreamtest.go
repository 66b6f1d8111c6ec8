// Package upstreamtest is a scripted upstream that speaks OpenAI's Responses API and its Chat
// Completions API (as OpenAI, vLLM or llama.cpp serve it), for tests of the whole proxy. Tests
// script the model's turns and assert what the proxy sent.
//
// API:
//
//	func New(tb testing.TB, opts ...Option) *Server // closed by tb.Cleanup when tb != nil
//	func WithAPIKey(key string) Option               // require "Authorization: Bearer key" (else 401)
//	func WithClock(now func() time.Time) Option
//	func WithSeed(seed uint64) Option                // ids and obfuscation padding
//	func WithArgsChunk(n int) Option                 // bytes per function_call_arguments.delta (3)
//	func WithTextChunk(n int) Option                 // bytes per output_text.delta (4)
//	func WithChatFlavour(f ChatFlavour) Option       // ChatOpenAI (default), ChatVLLM, ChatLlamaCpp
//	func WithChatReasoningField(name string) Option  // "reasoning_content" (default) or "reasoning"
//	func (s *Server) URL() string                    // "http://127.0.0.1:port/v1"
//	func (s *Server) Close()
//	func (s *Server) Enqueue(turns ...Turn)          // answered in order, one per POST
//	func (s *Server) Script(fn func(Request) Turn)   // answers when the queue is empty
//	func (s *Server) Pending() int                   // turns still queued
//	func (s *Server) Requests() []Request            // every request received, in order
//	func (s *Server) Wait(ctx context.Context, n int) ([]Request, error)
//	func (s *Server) Response(id string) (json.RawMessage, bool) // a stored response
//
//	type Turn{Items []Item; Usage *Usage; Incomplete string; Error *HTTPError; Fail *Failure;
//	          Cut bool; CutAfter int; ArgsChunk, TextChunk int; ChatInterleave bool; Hold <-chan struct{};
//	          BeforeEvent func(ctx, seq int, typ string) error; Delay time.Duration; Model, ID string}
//	func Text(s string) Item; func FunctionCall(name, args string) Item; func Reasoning(summary string) Item
//	func RawItem(raw string) Item
//	func APIError(status int, code, message, param string) *HTTPError
//
//	type Request{N int; Method, Path string; Header http.Header; Body []byte;
//	             Fields map[string]json.RawMessage; Model string; Stream, Store bool;
//	             PreviousResponseID, Instructions string; Include []string; Input, Tools []json.RawMessage;
//	             ToolChoice, Reasoning json.RawMessage; Messages, History []json.RawMessage}
//	func (r Request) Includes(v string) bool
//	func (r Request) InputItems(typ string) []json.RawMessage
//	func (r Request) ToolNames() []string; func (r Request) Tool(name string) json.RawMessage
//	func (r Request) FunctionOutput(callID string) (string, bool) // what the model was told
//
// Routes: POST /v1/responses answers JSON, or SSE when the body has "stream":true, exactly as
// OpenAI streams it (event: and data: lines, sequence_number from 0, no [DONE]).
// GET /v1/responses/{id} returns a stored response. POST /v1/chat/completions answers the same
// turns as a chat completion (JSON, or chunks ending with [DONE]) in the shapes of the chosen
// ChatFlavour: text as content, function calls as tool_calls streamed by index with the
// arguments in pieces, reasoning items as reasoning_content (vLLM, llama.cpp), usage in a last
// chunk when stream_options.include_usage is set; a Fail turn streams an error chunk after
// Fail.After items. Anything else is a 404.
//
// Like OpenAI, the server rejects with an OpenAI-shaped error: a body that is not JSON, a missing
// model, an unknown previous_response_id (400 previous_response_not_found), a function_call_output
// without its function_call in the history or a function_call without its output (400), a
// reasoning item or item_reference naming an item that was never stored (404), encrypted reasoning
// content it did not mint (400), a reasoning input item not followed by the item it led to (400),
// and a tool_choice naming a tool that is not in tools (400). A chat completions request is
// refused as OpenAI refuses it: a Responses-only field (input, instructions, max_output_tokens,
// text, reasoning, previous_response_id, include, ...), no messages, an unknown role, a content
// part of a Responses type (input_text), an assistant tool call not answered by a tool message
// before the next other message, a tool message answering no call, reasoning_content or
// reasoning on a message (ChatOpenAI only), a tool that is not {"type":"function","function":
// {"name"}}, a tool_choice or parallel_tool_calls without tools, a tool_choice naming no tool,
// stream_options without stream, a malformed response_format.
// Responses are stored unless the request says "store":false. Reasoning items carry
// encrypted_content when the request includes "reasoning.encrypted_content".
//
// A rejected request takes no turn. A request with no queued turn and no script gets a 500 and
// fails the test.
// Script functions run on the server's handler goroutines, possibly concurrently.
package upstreamtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is the scripted upstream.
type Server struct {
	tb     testing.TB
	srv    *httptest.Server
	apiKey string
	now    func() time.Time
	args   int
	text   int

	flavour        ChatFlavour
	reasoningField string
	nulls          bool // WithChatNulls

	mu        sync.Mutex
	rng       *rand.Rand
	queue     []Turn
	script    func(Request) Turn
	reqs      []Request
	changed   chan struct{} // closed and replaced whenever a request is recorded
	responses map[string]*stored
	items     map[string]json.RawMessage // output items of stored responses, by id
	encrypted map[string]bool            // encrypted_content values minted
}

// stored is a response kept for previous_response_id and GET.
type stored struct {
	body    []byte            // the Response JSON
	history []json.RawMessage // what the model saw
	output  []json.RawMessage
}

// Option configures a Server.
type Option func(*Server)

// WithAPIKey makes the server answer 401 invalid_api_key unless the request carries
// "Authorization: Bearer key".
func WithAPIKey(key string) Option { return func(s *Server) { s.apiKey = key } }

// WithClock sets the clock for created_at.
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// WithSeed seeds the generator of ids and obfuscation padding (default 1), so a test's ids are
// the same on every run as long as its requests arrive in the same order.
func WithSeed(seed uint64) Option {
	return func(s *Server) { s.rng = rand.New(rand.NewPCG(seed, 0x5eed)) }
}

// WithArgsChunk sets the default size in bytes of function_call_arguments.delta events.
func WithArgsChunk(n int) Option { return func(s *Server) { s.args = n } }

// WithTextChunk sets the default size in bytes of output_text.delta events.
func WithTextChunk(n int) Option { return func(s *Server) { s.text = n } }

// New starts a Server. When tb is not nil, the server is closed by tb.Cleanup, and a request that
// no turn answers fails tb.
func New(tb testing.TB, opts ...Option) *Server {
	s := &Server{
		tb:        tb,
		now:       time.Now,
		args:      3,
		text:      4,
		changed:   make(chan struct{}),
		responses: map[string]*stored{},
		items:     map[string]json.RawMessage{},
		encrypted: map[string]bool{},
	}
	WithSeed(1)(s)
	for _, o := range opts {
		o(s)
	}
	if s.args <= 0 {
		s.args = 3
	}
	if s.text <= 0 {
		s.text = 4
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	if tb != nil {
		tb.Cleanup(s.Close)
	}
	return s
}

// URL returns the API base, ending in "/v1".
func (s *Server) URL() string { return s.srv.URL + "/v1" }

// Close shuts the server down, waiting for handlers to return. It may be called more than once.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Enqueue adds turns; each POST takes the next one.
func (s *Server) Enqueue(turns ...Turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, turns...)
}

// Script sets the function that answers a POST when the queue is empty; nil removes it.
func (s *Server) Script(fn func(Request) Turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = fn
}

// Pending returns the number of queued turns not yet taken.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// Requests returns copies of every request received so far, in order of arrival.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = r.clone()
	}
	return out
}

// Wait returns the requests once at least n have arrived, or ctx's error.
func (s *Server) Wait(ctx context.Context, n int) ([]Request, error) {
	for {
		s.mu.Lock()
		got, ch := len(s.reqs), s.changed
		s.mu.Unlock()
		if got >= n {
			return s.Requests(), nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("upstreamtest: %d of %d requests: %w", got, n, ctx.Err())
		}
	}
}

// Response returns the stored response with this id.
func (s *Server) Response(id string) (json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.responses[id]
	if !ok {
		return nil, false
	}
	return json.RawMessage(st.body), true
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	req := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone()}
	body, err := readAll(r)
	if err != nil {
		return
	}
	req.Body = body
	isJSON := req.parse()
	herr := s.check(&req, isJSON)
	req.N = s.record(req)
	if herr != nil {
		// A rejected request takes no turn, as it never reaches OpenAI's model.
		writeError(w, herr)
		return
	}
	if r.Method == http.MethodGet {
		b, _ := s.Response(strings.TrimPrefix(req.Path, "/v1/responses/"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
		return
	}
	turn, ok := s.next(req)
	if !ok {
		writeError(w, APIError(http.StatusInternalServerError, "", "upstreamtest: no turn scripted for this request", ""))
		return
	}
	if req.Path == "/v1/chat/completions" {
		s.serveChat(w, r, req, turn)
		return
	}
	s.serveResponses(w, r, req, turn)
}

// check returns the error OpenAI would answer req with, or nil. For a POST it also fills
// req.History.
func (s *Server) check(req *Request, isJSON bool) *HTTPError {
	if s.apiKey != "" && req.Header.Get("Authorization") != "Bearer "+s.apiKey {
		return APIError(http.StatusUnauthorized, "invalid_api_key",
			"Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.", "")
	}
	switch {
	case req.Method == http.MethodGet && strings.HasPrefix(req.Path, "/v1/responses/"):
		id := strings.TrimPrefix(req.Path, "/v1/responses/")
		if _, ok := s.Response(id); !ok {
			return APIError(http.StatusNotFound, "", fmt.Sprintf("Response with id '%s' not found.", id), "")
		}
		return nil
	case req.Method == http.MethodPost && (req.Path == "/v1/responses" || req.Path == "/v1/chat/completions"):
		if !isJSON {
			return APIError(http.StatusBadRequest, "", "We could not parse the JSON body of your request. "+
				"(HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON "+
				"payload, but what was sent was not valid JSON.)", "")
		}
		if req.Model == "" {
			return APIError(http.StatusBadRequest, "missing_required_parameter", "Missing required parameter: 'model'.", "model")
		}
		if req.Path == "/v1/responses" {
			return s.resolve(req)
		}
		return s.checkChat(req)
	}
	return APIError(http.StatusNotFound, "", fmt.Sprintf("Invalid URL (%s %s)", req.Method, req.Path), "")
}

// record stores req and returns its position.
func (s *Server) record(req Request) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	req.N = len(s.reqs)
	s.reqs = append(s.reqs, req.clone())
	close(s.changed)
	s.changed = make(chan struct{})
	return req.N
}

// next takes the turn that answers req.
func (s *Server) next(req Request) (Turn, bool) {
	s.mu.Lock()
	if len(s.queue) > 0 {
		t := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()
		return t, true
	}
	fn := s.script
	s.mu.Unlock()
	if fn != nil {
		return fn(req.clone()), true
	}
	if s.tb != nil {
		s.tb.Errorf("upstreamtest: no turn scripted for request %d (%s %s)", req.N, req.Method, req.Path)
	}
	return Turn{}, false
}

func writeError(w http.ResponseWriter, e *HTTPError) {
	for k, vs := range e.Header {
		w.Header()[k] = vs
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write([]byte(e.Body))
}

// resolve builds req.History and checks the request against the stored state as OpenAI does.
func (s *Server) resolve(req *Request) *HTTPError {
	s.mu.Lock()
	defer s.mu.Unlock()
	var hist []json.RawMessage
	if req.PreviousResponseID != "" {
		prev, ok := s.responses[req.PreviousResponseID]
		if !ok {
			return APIError(http.StatusBadRequest, "previous_response_not_found",
				fmt.Sprintf("Previous response with id '%s' not found.", req.PreviousResponseID), "previous_response_id")
		}
		hist = append(append(hist, prev.history...), prev.output...)
	}
	for k, it := range req.Input {
		switch itemType(it) {
		case "item_reference":
			id := itemField(it, "id")
			stored, ok := s.items[id]
			if !ok {
				return itemNotFound(id)
			}
			it = stored
		case "reasoning":
			id := itemField(it, "id")
			if enc := itemField(it, "encrypted_content"); enc != "" {
				if !s.encrypted[enc] {
					return APIError(http.StatusBadRequest, "invalid_encrypted_content",
						fmt.Sprintf("The encrypted content for item %s could not be verified.", id), "")
				}
			} else if _, ok := s.items[id]; !ok {
				return itemNotFound(id)
			}
			// A reasoning item must come with the item it led to (a call or a message).
			if k+1 == len(req.Input) || itemField(req.Input[k+1], "role") == "user" {
				return APIError(http.StatusBadRequest, "", fmt.Sprintf(
					"Item '%s' of type 'reasoning' was provided without its required following item.", id), "input")
			}
		}
		hist = append(hist, it)
	}
	req.History = hist

	// Every function call needs its output, and every output its call, as OpenAI requires.
	calls := map[string]bool{}
	outputs := map[string]bool{}
	for _, it := range hist {
		switch itemType(it) {
		case "function_call":
			calls[itemField(it, "call_id")] = true
		case "function_call_output":
			id := itemField(it, "call_id")
			if !calls[id] {
				return APIError(http.StatusBadRequest, "",
					fmt.Sprintf("No tool call found for function call output with call_id %s.", id), "input")
			}
			outputs[id] = true
		}
	}
	for _, it := range hist {
		if itemType(it) == "function_call" {
			if id := itemField(it, "call_id"); !outputs[id] {
				return APIError(http.StatusBadRequest, "", fmt.Sprintf("No tool output found for function call %s.", id), "input")
			}
		}
	}

	// A tool_choice must name a tool that is in tools.
	if len(req.ToolChoice) > 0 && req.ToolChoice[0] == '{' {
		var tc struct{ Type, Name string }
		_ = json.Unmarshal(req.ToolChoice, &tc)
		name := tc.Type
		if tc.Type == "function" || tc.Type == "custom" {
			name = tc.Name
		}
		if tc.Type != "allowed_tools" && tc.Type != "mcp" && req.Tool(name) == nil {
			return APIError(http.StatusBadRequest, "",
				fmt.Sprintf("Tool choice '%s' not found in 'tools' parameter.", name), "tool_choice")
		}
	}
	return nil
}

func itemNotFound(id string) *HTTPError {
	return APIError(http.StatusNotFound, "", fmt.Sprintf("Item with id '%s' not found. Items are not persisted when "+
		"`store` is set to false. Try again with `store` set to true, or remove this item from your input.", id), "input")
}

// id returns prefix + 48 hex digits, like OpenAI's ids.
func (s *Server) id(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%s%016x%016x%016x", prefix, s.rng.Uint64(), s.rng.Uint64(), s.rng.Uint64())
}

const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// token returns n random letters and digits.
func (s *Server) token(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[s.rng.IntN(len(letters))]
	}
	return string(b)
}

// obfuscation returns padding like OpenAI's, 1 to 15 letters.
func (s *Server) obfuscation() string {
	s.mu.Lock()
	n := 1 + s.rng.IntN(15)
	s.mu.Unlock()
	return s.token(n)
}
