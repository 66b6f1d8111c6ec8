package intercept

import (
	"net/http"
	"strconv"
)

// jsonRenderer keeps the terminal event's Response and writes it as the JSON answer. Every other
// event is dropped unrendered.
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

// started implements [renderer.started]: nothing is written before done.
func (j *jsonRenderer) started() bool { return false }

func (j *jsonRenderer) done() {
	h := j.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(j.resp)+1))
	j.w.WriteHeader(http.StatusOK)
	_, _ = j.w.Write(append(j.resp, '\n'))
}
