package chat

// Responses ⇄ Chat Completions, errors: what chat servers answer when they refuse, in their own
// shapes, mapped into OpenAI's {"error":{"message","type","param","code"}}; and the 400s of the
// request translation.

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
)

// maxErrorMessage bounds an error message taken from an upstream's plain-text or unknown body.
const maxErrorMessage = 1024

// UpstreamError returns a non-2xx answer of a Chat Completions upstream (its status, headers and
// body) as the OpenAI-shaped error the client gets. The status is kept (one outside 400-599
// becomes 502), and so are the headers that tell a client when to retry (Retry-After,
// Retry-After-Ms, X-Should-Retry). The message, type, param and code are read from the
// provider's shape:
//
//	OpenAI, Together, Anthropic:  {"error":{"message","type","param","code"}}
//	llama.cpp, vLLM 0.10+:        {"error":{"code":400,"message","type"}}   (a numeric code is the status)
//	vLLM before 0.10, Mistral:    {"object":"error","message","type","param","code":400}
//	Gemini:                       [{"error":{"code":400,"message","status":"INVALID_ARGUMENT"}}]
//	Ollama:                       {"error":"message"}
//	FastAPI validation (422):     {"detail":"message"} or {"detail":[{"loc":[...],"msg":"..."}]}
//	anything else:                the body's text, trimmed and cut to 1 KiB
//
// A body nested deeper than jsondepth.Max is not read as JSON: it is "anything else".
//
// A type that is not one of OpenAI's snake_case kinds (vLLM's "BadRequestError") is replaced by
// the kind the status implies: invalid_request_error for 4xx, requests for 429, server_error for 5xx.
func UpstreamError(status int, header http.Header, body []byte) *apierror.Error {
	if status < 400 || status > 599 {
		status = http.StatusBadGateway
	}
	var e *apierror.Error
	// The depth first: gjson's validator, and errorFromBody's reads, recurse once per level.
	if jsondepth.Within(body, jsondepth.Max) && gjson.ValidBytes(body) {
		e = errorFromBody(gjson.ParseBytes(body), status)
	}
	if e == nil || e.Message == "" {
		msg := plainMessage(body)
		if msg == "" {
			msg = fmt.Sprintf("The upstream answered %d %s.", status, http.StatusText(status))
		}
		if e == nil {
			e = &apierror.Error{Status: status}
		}
		e.Message = msg
	}
	e.Status = status
	fillErrorKind(e)
	for _, k := range []string{"Retry-After", "Retry-After-Ms", "X-Should-Retry"} {
		if v := header.Values(k); len(v) > 0 {
			if e.Header == nil {
				e.Header = make(http.Header)
			}
			e.Header[k] = append([]string(nil), v...)
		}
	}
	return e
}

// bodyError returns the error object of a JSON answer or stream chunk (one with an error member, or whose object is "error"), in
// OpenAI's shape; status is used when the object names none.
func bodyError(root gjson.Result, status int) *apierror.Error {
	e := errorFromBody(root, status)
	if e == nil {
		e = &apierror.Error{Status: status}
	}
	if e.Message == "" {
		e.Message = plainMessage([]byte(root.Raw))
	}
	fillErrorKind(e)
	return e
}

// errorFromBody reads an error body in any of the shapes UpstreamError lists. It returns nil when
// root holds no error it knows. status is the one to use when the body names none.
func errorFromBody(root gjson.Result, status int) *apierror.Error {
	if root.IsArray() {
		root = root.Get("0")
	}
	if !root.IsObject() {
		return nil
	}
	e := &apierror.Error{Status: status}
	src := root
	switch er := root.Get("error"); {
	case er.IsObject():
		src = er
	case er.Type == gjson.String:
		e.Message = er.Str
	case root.Get("object").String() == "error", root.Get("message").Type == gjson.String:
	case present(root.Get("detail")):
		e.Message = detailMessage(root.Get("detail"))
	default:
		return nil
	}
	if e.Message == "" {
		e.Message = src.Get("message").String()
	}
	if t := src.Get("type"); t.Type == gjson.String {
		e.Type = t.Str
	}
	if p := src.Get("param"); p.Type == gjson.String {
		e.Param = p.Str
	}
	switch c := src.Get("code"); c.Type {
	case gjson.String:
		e.Code = c.Str
	case gjson.Number:
		// The HTTP status again (llama.cpp, vLLM, Gemini); an answer with status 200 takes it.
		if n := int(c.Int()); n >= 400 && n <= 599 && status == http.StatusBadGateway {
			e.Status = n
		}
	}
	return e
}

// detailMessage reads FastAPI's {"detail": ...}: a string, or a list of {"loc","msg"}.
func detailMessage(d gjson.Result) string {
	if d.Type == gjson.String {
		return d.Str
	}
	var msgs []string
	d.ForEach(func(_, it gjson.Result) bool {
		msg := it.Get("msg").String()
		var loc []string
		it.Get("loc").ForEach(func(_, l gjson.Result) bool {
			loc = append(loc, l.String())
			return true
		})
		if len(loc) > 0 {
			msg = strings.Join(loc, ".") + ": " + msg
		}
		msgs = append(msgs, msg)
		return true
	})
	if len(msgs) == 0 {
		return d.Raw
	}
	return strings.Join(msgs, "; ")
}

// plainMessage returns a body's text for a message: whitespace collapsed, cut to maxErrorMessage
// bytes on a character boundary.
func plainMessage(body []byte) string {
	msg := strings.Join(strings.Fields(string(bytes.ToValidUTF8(body, []byte("\uFFFD")))), " ")
	if len(msg) > maxErrorMessage {
		cut := maxErrorMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return msg
}

// fillErrorKind gives e the OpenAI type (and, for rate limits, code) its status implies when the
// upstream's is missing or not one of OpenAI's kinds.
func fillErrorKind(e *apierror.Error) {
	if !isSnakeCase(e.Type) {
		switch {
		case e.Status == http.StatusTooManyRequests:
			e.Type = "requests"
		case e.Status >= 500:
			e.Type = apierror.TypeServer
		default:
			e.Type = apierror.TypeInvalidRequest
		}
	}
	if e.Status == http.StatusTooManyRequests && e.Code == "" {
		e.Code = apierror.CodeRateLimitExceeded
	}
}

func isSnakeCase(s string) bool {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && c != '_' {
			return false
		}
	}
	return true
}

// Errors of the request translation: client-visible 400s naming the field.

func unsupported(param, msg string) error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeUnsupportedParameter, Message: msg, Err: ErrUnsupported}
}

func unsupportedValue(param, msg string) error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeUnsupportedValue, Message: msg, Err: ErrUnsupported}
}

func invalid(param, msg string) error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Message: msg, Err: ErrInvalid}
}

func invalidType(param, want string) error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeInvalidType,
		Message: "Invalid type for '" + param + "': expected " + want + ".", Err: ErrInvalid}
}

func invalidValue(param, msg string) error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeInvalidValue, Message: msg, Err: ErrInvalid}
}

func missing(param string) error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeMissingRequiredParameter,
		Message: "Missing required parameter: '" + param + "'.", Err: ErrInvalid}
}

func emptyArray(param string) error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeEmptyArray,
		Message: "Invalid '" + param + "': empty array. Expected an array with minimum length 1, but got an empty array instead.", Err: ErrInvalid}
}
