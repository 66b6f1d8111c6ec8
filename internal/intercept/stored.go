package intercept

import (
	"net/http"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// ServeStored answers GET and DELETE /v1/responses/{id} for a response this proxy minted, as
// OpenAI answers for its stored responses: GET returns the Response the client received (kept
// when the request had store true), DELETE forgets it. It reports false, having written nothing,
// when id is not one of ours, so that the request passes through to the upstream. A response
// minted for another caller is a 404, as if it did not exist.
func (e *Engine) ServeStored(w http.ResponseWriter, r *http.Request, id, caller string) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		return false
	}
	sr, ok := e.store.Response(r.Context(), id)
	if !ok {
		return false
	}
	if sr.Owner != caller || (r.Method == http.MethodGet && sr.Body == nil) {
		apierror.Write(w, apierror.NotFound("Response with id '"+id+"' not found.", ""))
		return true
	}
	if r.Method == http.MethodDelete {
		e.store.Delete(r.Context(), id)
		writeJSON(w, http.StatusOK, []byte(`{"id":`+string(jsonString(id))+`,"object":"response","deleted":true}`))
		return true
	}
	writeJSON(w, http.StatusOK, sr.Body)
	return true
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
