package intercept

import (
	"context"
	"net/http"
	"slices"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// Minted reports whether id is a response id this proxy minted and still remembers, whoever its
// owner: GET and DELETE /v1/responses/{id} for it are ServeStored's, since the upstream has never
// heard of it. Any other id passes through to the upstream.
func (e *Engine) Minted(ctx context.Context, id string) bool {
	_, ok := e.store.Response(ctx, id)
	return ok
}

// ServeStored answers GET and DELETE /v1/responses/{id} for a response this proxy minted, as
// OpenAI answers for its stored responses: GET returns the Response the client received (kept
// when the request had store true), with the calls' outputs when the query includes
// code_interpreter_call.outputs (include[]= or include=) and null otherwise, whatever the
// request included; DELETE forgets it. A response minted for another caller, or
// one not kept, is a 404, as if it did not exist. An error means nothing was written; the caller
// writes it.
func (e *Engine) ServeStored(w http.ResponseWriter, r *http.Request, id, caller string) error {
	notFound := apierror.NotFound("Response with id '"+id+"' not found.", "")
	sr, ok := e.store.Response(r.Context(), id)
	if !ok || sr.Owner != caller {
		return notFound
	}
	switch r.Method {
	case http.MethodGet:
		if sr.Body == nil {
			return notFound
		}
		q := r.URL.Query()
		if slices.Contains(q["include[]"], includeOutputs) || slices.Contains(q["include"], includeOutputs) {
			writeJSON(w, sr.Body)
		} else {
			writeJSON(w, withoutOutputs(sr.Body))
		}
	case http.MethodDelete:
		e.store.Delete(r.Context(), id)
		writeJSON(w, marshal(deletedResponse{ID: id, Object: "response", Deleted: true}))
	default:
		return &apierror.Error{Status: http.StatusMethodNotAllowed, Message: "Method " + r.Method + " is not allowed for " + r.URL.Path + ".", Type: "invalid_request_error"}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
