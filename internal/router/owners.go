package router

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// The responses an upstream stores for a request that passed through (its own resp_ ids, which
// the proxy did not mint) are reachable upstream with the deployment's key, whoever asks: the
// proxy alone can tell one key's from another's. So it records the owner of every id such an
// answer carries (upstream.ProxyResponses, before the client sees the id), and serves the id
// (GET, DELETE, input_items, cancel, previous_response_id) only to that owner; anyone else is
// told it does not exist, as for another key's minted response. With client keys configured, an
// id with no recorded owner is refused too (it was not made through this proxy, or its record
// expired); with the master key alone, or in an open proxy, it passes through as before.
//
// The records are store.Response records under ownerID(id), apart from the ids the interceptor
// mints (which never start so), holding only the owner, and expiring after ownerTTL.

// ownerTTL is how long the owner of an upstream's response id is kept: OpenAI keeps stored
// responses 30 days.
const ownerTTL = 30 * 24 * time.Hour

// ownerID is the store id of the owner record of the upstream's response id.
func ownerID(id string) string { return "upstream-" + id }

// noteOwner is the upstream.NoteID of a pass-through POST /v1/responses: it records that the
// request's caller owns id. An id the store cannot hold (not a plain id) is not recorded, and so
// not served to anyone when client keys are configured.
func (s *server) noteOwner(ctx context.Context, id string) error {
	err := s.owners.PutResponse(ctx, store.Response{ID: ownerID(id), Owner: Caller(ctx), ExpiresAt: s.now().Add(ownerTTL)}, nil)
	switch {
	case errors.Is(err, store.ErrInvalid):
		return nil
	case errors.Is(err, store.ErrUnavailable):
		return storeUnavailable(err)
	}
	return err
}

// passResponsesTo passes body through to target, recording the owner of the response it creates
// unless the request says store false (the upstream keeps nothing to reach again).
func (s *server) passResponsesTo(w http.ResponseWriter, r *http.Request, target *upstream.Target, body upstream.Streamed, stored bool) {
	if s.owners == nil || !stored {
		target.ProxyStreamed(w, r, body)
		return
	}
	target.ProxyResponses(w, r, body, s.noteOwner)
}

// ownsUpstream reports whether the caller of ctx may name id, a response id the interceptor did
// not mint, to the upstream. An error means the store could not answer.
func (s *server) ownsUpstream(ctx context.Context, id string) (bool, error) {
	if s.owners == nil {
		return true, nil
	}
	rec, err := s.owners.Response(ctx, ownerID(id))
	switch {
	case err == nil:
		return rec.Owner == Caller(ctx), nil
	case errors.Is(err, store.ErrNotFound):
		return len(configFrom(ctx).General.ClientKeys) == 0, nil
	}
	return false, err
}

// checkPrevious refuses a previous_response_id the caller may not continue, in OpenAI's words for
// one that does not exist.
func (s *server) checkPrevious(ctx context.Context, prev string) error {
	ok, err := s.ownsUpstream(ctx, prev)
	if err != nil {
		return err
	}
	if !ok {
		return apierror.BadRequest("Previous response with id '"+prev+"' not found.", "previous_response_id", apierror.CodePreviousResponseNotFound)
	}
	return nil
}

// responseNotFound is OpenAI's answer for a response id it does not have.
func responseNotFound(id string) *apierror.Error {
	return apierror.NotFound("Response with id '"+id+"' not found.", "")
}
