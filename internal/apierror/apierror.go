// Package apierror is the OpenAI-shaped error: {"error":{"message","type","param","code"}} with an
// HTTP status. The public fields go to the client; Err is for the log only.
package apierror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// Error is an error a client may see.
type Error struct {
	Status  int    // HTTP status
	Message string // shown to the client
	Type    string // invalid_request_error, authentication_error, server_error, ...
	Param   string // "" is sent as null
	Code    string // "" is sent as null
	Header  http.Header
	Err     error // the cause, for logs; never shown
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Body is the wire shape {"error":{...}}.
type Body struct {
	Error Detail `json:"error"`
}

// Detail is the inner object; Param and Code are null when empty.
type Detail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// Detail returns the client-visible part of e.
func (e *Error) Detail() Detail {
	return Detail{Message: e.Message, Type: e.Type, Param: nullable(e.Param), Code: nullable(e.Code)}
}

// JSON returns the wire body.
func (e *Error) JSON() []byte {
	b, _ := json.Marshal(Body{Error: e.Detail()})
	return b
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Write sends e as the response. It must only be called before anything else was written.
func Write(w http.ResponseWriter, e *Error) {
	h := w.Header()
	for k, vs := range e.Header {
		h[k] = vs
	}
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(e.JSON(), '\n'))
}

// From returns err as a client-safe *Error: an *Error anywhere in the chain is returned as is;
// anything else becomes a generic 500 that hides the cause.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Status: http.StatusInternalServerError, Message: "The server had an error while processing your request.", Type: "server_error", Err: err}
}

// Ended returns the *Error ctx was cancelled with (context.WithCancelCause), or nil. A server
// that ends the requests in flight (shutting down) cancels them with the error their clients
// are still there to be told; a client that left cancels with no such cause.
func Ended(ctx context.Context) *Error {
	var e *Error
	if ctx.Err() != nil && errors.As(context.Cause(ctx), &e) {
		return e
	}
	return nil
}

// Constructors for the common cases.

func BadRequest(msg, param, code string) *Error {
	return &Error{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error", Param: param, Code: code}
}

// InvalidType is the 400 OpenAI answers for a field of the wrong JSON type: want names the type
// expected ("a boolean", "an array of strings"), got is the value sent.
func InvalidType(param, want string, got gjson.Result) *Error {
	return BadRequest(fmt.Sprintf("Invalid type for '%s': expected %s, but got %s instead.", param, want, JSONType(got)), param, "invalid_type")
}

// JSONType names the JSON type of v as OpenAI's messages do: "a string", "an integer", "a
// decimal", "a boolean", "an array", "an object" or "null".
func JSONType(v gjson.Result) string {
	switch {
	case v.Type == gjson.String:
		return "a string"
	case v.Type == gjson.Number && v.Num == float64(int64(v.Num)) && !strings.ContainsAny(v.Raw, ".eE"):
		return "an integer"
	case v.Type == gjson.Number:
		return "a decimal"
	case v.Type == gjson.True, v.Type == gjson.False:
		return "a boolean"
	case v.IsArray():
		return "an array"
	case v.IsObject():
		return "an object"
	}
	return "null"
}

func NotFound(msg, param string) *Error {
	return &Error{Status: http.StatusNotFound, Message: msg, Type: "invalid_request_error", Param: param}
}

func Unauthorized(msg string) *Error {
	return &Error{Status: http.StatusUnauthorized, Message: msg, Type: "invalid_request_error", Code: "invalid_api_key"}
}

func BadGateway(msg, code string, cause error) *Error {
	return &Error{Status: http.StatusBadGateway, Message: msg, Type: "server_error", Code: code, Err: cause}
}

// RateLimited is a 429 as OpenAI sends one for a request-count limit: type "requests", code
// "rate_limit_exceeded", the message saying which limit; retryAfter, when above 0, is sent as
// Retry-After (whole seconds, rounded up), which the SDKs honour.
func RateLimited(msg string, retryAfter time.Duration) *Error {
	e := &Error{Status: http.StatusTooManyRequests, Message: msg, Type: "requests", Code: "rate_limit_exceeded"}
	if retryAfter > 0 {
		secs := (retryAfter + time.Second - 1) / time.Second
		e.Header = http.Header{"Retry-After": {strconv.FormatInt(int64(secs), 10)}}
	}
	return e
}
