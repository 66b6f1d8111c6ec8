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

// Types: an error's type, as OpenAI names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeRequests       = "requests"       // a 429 for a limit on the number of requests
	TypeUpstream       = "upstream_error" // the body sent for an upstream error body too large to relay
)

// Codes: an error's code, OpenAI's where it has one for the case.
const (
	CodeInvalidAPIKey             = "invalid_api_key"
	CodeInvalidType               = "invalid_type"
	CodeInvalidValue              = "invalid_value"
	CodeMissingRequiredParameter  = "missing_required_parameter"
	CodeUnsupportedValue          = "unsupported_value"
	CodeUnsupportedParameter      = "unsupported_parameter"
	CodeEmptyArray                = "empty_array"
	CodeEmptyString               = "empty_string"
	CodeUnknownParameter          = "unknown_parameter"
	CodeArrayAboveMaxLength       = "array_above_max_length"
	CodeStringAboveMaxLength      = "string_above_max_length"
	CodeIntegerBelowMinValue      = "integer_below_min_value"
	CodeIntegerAboveMaxValue      = "integer_above_max_value"
	CodeRequestTooLarge           = "request_too_large" // the body is over the configured size
	CodeRateLimitExceeded         = "rate_limit_exceeded"
	CodeModelNotFound             = "model_not_found"
	CodeUnsupportedModel          = "unsupported_model" // a Chat Completions model asked for on /v1/responses
	CodePreviousResponseNotFound  = "previous_response_not_found"
	CodeInvalidFilename           = "invalid_filename"
	CodeFileTooLarge              = "file_too_large"
	CodeImageFileTooLarge         = "image_file_too_large"
	CodeEmptyImageFile            = "empty_image_file"
	CodeUnsupportedImageMediaType = "unsupported_image_media_type"
	CodeStorageLimitExceeded      = "storage_limit_exceeded" // a container's or a key's bytes
	CodeTooManyFiles              = "too_many_files"         // a container's file count
	CodeNameTaken                 = "name_taken"             // a container path that already holds a file
	CodeFileBusy                  = "file_busy"              // a container file another request is writing
	CodeContainerExpired          = "container_expired"
	CodeInvalidForwarding         = "invalid_forwarding"  // a forwarded request whose signature does not verify
	CodeReplicaUnavailable        = "replica_unavailable" // the replica that holds the container cannot be reached
	CodeServerOverloaded          = "server_overloaded"   // the proxy's memory for inlined files is in use
	CodeServer                    = "server_error"        // a failed Response's code when the upstream gave none
	CodeStoreUnavailable          = "store_unavailable"
	CodeSandboxUnavailable        = "sandbox_unavailable"
	CodeUpstreamError             = "upstream_error"       // the upstream answered, but not as it should
	CodeUpstreamUnavailable       = "upstream_unavailable" // the upstream call of a tool loop failed to start
	CodeUpstreamUnreachable       = "upstream_unreachable" // every deployment of the model failed to connect
	CodeUpstreamTimeout           = "upstream_timeout"
	CodeUpstreamNotConfigured     = "upstream_not_configured"  // no deployment, or its key's variable is unset
	CodeDeploymentNotSupported    = "deployment_not_supported" // the configuration names a deployment the proxy cannot call
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
	return &Error{Status: http.StatusInternalServerError, Message: "The server had an error while processing your request.", Type: TypeServer, Err: err}
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
	return &Error{Status: http.StatusBadRequest, Message: msg, Type: TypeInvalidRequest, Param: param, Code: code}
}

// InvalidType is the 400 OpenAI answers for a field of the wrong JSON type: want names the type
// expected ("a boolean", "an array of strings"), got is the value sent.
func InvalidType(param, want string, got gjson.Result) *Error {
	return BadRequest(fmt.Sprintf("Invalid type for '%s': expected %s, but got %s instead.", param, want, JSONType(got)), param, CodeInvalidType)
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
	return &Error{Status: http.StatusNotFound, Message: msg, Type: TypeInvalidRequest, Param: param}
}

func Unauthorized(msg string) *Error {
	return &Error{Status: http.StatusUnauthorized, Message: msg, Type: TypeInvalidRequest, Code: CodeInvalidAPIKey}
}

func BadGateway(msg, code string, cause error) *Error {
	return &Error{Status: http.StatusBadGateway, Message: msg, Type: TypeServer, Code: code, Err: cause}
}

// RateLimited is a 429 as OpenAI sends one for a request-count limit: type "requests", code
// "rate_limit_exceeded", the message saying which limit; retryAfter, when above 0, is sent as
// Retry-After (whole seconds, rounded up), which the SDKs honour.
func RateLimited(msg string, retryAfter time.Duration) *Error {
	e := &Error{Status: http.StatusTooManyRequests, Message: msg, Type: TypeRequests, Code: CodeRateLimitExceeded}
	if retryAfter > 0 {
		secs := (retryAfter + time.Second - 1) / time.Second
		e.Header = http.Header{"Retry-After": {strconv.FormatInt(int64(secs), 10)}}
	}
	return e
}
