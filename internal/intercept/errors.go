package intercept

import (
	"errors"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// This file turns failures into what the client sees mid-stream: the detail of the nested error
// event. Failures before the first byte are returned to the router, which writes them.

// errStreamCut is an upstream stream that ended before its final event.
var errStreamCut = errors.New("upstream stream ended before the response completed")

// errorEventDetail returns the detail of an upstream error event in the nested shape: the
// upstream's own object when it sent the nested form, else one built from the flat form.
func errorEventDetail(data []byte) []byte {
	if e := gjson.GetBytes(data, "error"); e.IsObject() {
		return []byte(e.Raw)
	}
	ev := gjson.ParseBytes(data)
	code := ev.Get("code")
	typ := code.String()
	if typ == "" {
		typ = apierror.TypeServer
	}
	return marshal(errorDetail{Type: typ, Code: rawOrNull(code), Message: ev.Get("message").String(), Param: rawOrNull(ev.Get("param"))})
}

// upstreamErrorDetail returns the error of the upstream's failed Response as an error event detail.
func upstreamErrorDetail(final []byte) []byte {
	e := gjson.GetBytes(final, "error")
	code := e.Get("code").String()
	if code == "" {
		code = apierror.CodeServer
	}
	msg := e.Get("message").String()
	if msg == "" {
		msg = "The response failed."
	}
	return marshal(errorDetail{Type: code, Code: jsonString(code), Message: msg, Param: nullable("")})
}

// clientDetail returns the nested error event detail for a failure of the loop: an upstream's
// own error object as it sent it, or the client-safe form of err.
func clientDetail(err error) []byte {
	var us *upstream.StatusError
	if errors.As(err, &us) {
		if e := gjson.GetBytes(us.Body, "error"); e.IsObject() {
			return []byte(e.Raw)
		}
		return apiErrorDetail(&apierror.Error{Message: "The upstream answered with status " + strconv.Itoa(us.Status) + ".", Type: apierror.TypeServer, Code: apierror.CodeUpstreamError})
	}
	return apiErrorDetail(apierror.From(err))
}

func apiErrorDetail(e *apierror.Error) []byte {
	return marshal(errorDetail{Type: e.Type, Code: nullable(e.Code), Message: e.Message, Param: nullable(e.Param)})
}

// classify names a loop error for metrics.
func classify(err error) string {
	var us *upstream.StatusError
	if errors.As(err, &us) {
		return "upstream_error"
	}
	var ae *apierror.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case apierror.CodeSandboxUnavailable:
			return "sandbox_unavailable"
		case apierror.CodeUpstreamError, apierror.CodeUpstreamUnavailable:
			return "upstream_error"
		}
	}
	return "error"
}
