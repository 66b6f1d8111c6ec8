package intercept

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// jsonRenderer keeps the terminal event's Response and writes it as the JSON answer.
type jsonRenderer struct {
	w    http.ResponseWriter
	resp []byte
}

func (j *jsonRenderer) emit(ev Event) error {
	if ev.terminal() {
		j.resp = ev.Response
	}
	return nil
}

func (j *jsonRenderer) started() bool { return false }

func (j *jsonRenderer) done() {
	h := j.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(j.resp)+1))
	j.w.WriteHeader(http.StatusOK)
	_, _ = j.w.Write(append(j.resp, '\n'))
}

func (j *jsonRenderer) writeError(err error) { writeError(j.w, err) }

// writeError answers with err before anything else was written: an upstream's error keeps its
// status and body; anything else is an OpenAI-shaped error.
func writeError(w http.ResponseWriter, err error) {
	var us *upstreamStatusError
	if errors.As(err, &us) {
		h := w.Header()
		ct := us.header.Get("Content-Type")
		if ct == "" {
			ct = "application/json"
		}
		h.Set("Content-Type", ct)
		for _, k := range []string{"Retry-After", "Retry-After-Ms", "X-Should-Retry", "X-Request-Id"} {
			if v := us.header.Get(k); v != "" {
				h.Set(k, v)
			}
		}
		h.Set("Content-Length", strconv.Itoa(len(us.body)))
		w.WriteHeader(us.status)
		_, _ = w.Write(us.body)
		return
	}
	apierror.Write(w, apierror.From(err))
}

// clientDetail returns the nested error event detail for err.
func clientDetail(err error) []byte {
	var us *upstreamStatusError
	if errors.As(err, &us) {
		if e := gjson.GetBytes(us.body, "error"); e.IsObject() {
			return []byte(e.Raw)
		}
		ae := &apierror.Error{Message: "The upstream answered with status " + strconv.Itoa(us.status) + ".", Type: "server_error", Code: "upstream_error"}
		return detailJSON(ae)
	}
	return detailJSON(apierror.From(err))
}

func detailJSON(e *apierror.Error) []byte {
	d := e.Detail()
	b := []byte(`{"type":`)
	b = appendJSONString(b, d.Type)
	b = append(b, `,"code":`...)
	if d.Code != nil {
		b = appendJSONString(b, *d.Code)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"message":`...)
	b = appendJSONString(b, d.Message)
	b = append(b, `,"param":`...)
	if d.Param != nil {
		b = appendJSONString(b, *d.Param)
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

// classify names a loop error for metrics.
func classify(err error) string {
	var us *upstreamStatusError
	if errors.As(err, &us) {
		return "upstream_error"
	}
	var ae *apierror.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case "sandbox_unavailable":
			return "sandbox_unavailable"
		case "upstream_error", "upstream_unavailable":
			return "upstream_error"
		}
	}
	return "error"
}
