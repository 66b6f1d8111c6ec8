package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// noExpiry is the modification time of a record that never expires: later than any sweep.
var noExpiry = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

func expired(at, now time.Time) bool { return !at.IsZero() && !now.Before(at) }

func mtimeFor(at time.Time) time.Time {
	if at.IsZero() {
		return noExpiry
	}
	return at
}

// PutResponse implements [store.Responses.PutResponse]. The calls are written before the
// response, so that a response a reader can see always has its calls.
func (s *Store) PutResponse(ctx context.Context, r store.Response, calls []store.Call) error {
	if !store.SafeID(r.ID) {
		return fmt.Errorf("%w: response id %q", errInvalid, r.ID)
	}
	for _, c := range calls {
		if !store.SafeID(c.ID) {
			return fmt.Errorf("%w: call id %q", errInvalid, c.ID)
		}
	}
	for _, raw := range append([]json.RawMessage{r.Body, r.Input}, r.Pending...) {
		if raw != nil && !json.Valid(raw) {
			return fmt.Errorf("%w: response %s holds JSON that does not parse", errInvalid, r.ID)
		}
	}
	if err := s.openCheck(); err != nil {
		return err
	}
	for _, c := range calls {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.writeRecord(dirCalls, c.ID, c, cached, mtimeFor(c.ExpiresAt)); err != nil {
			return err
		}
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = s.now()
	}
	return s.writeRecord(dirResponses, r.ID, r, cached, mtimeFor(r.ExpiresAt))
}

func (s *Store) openCheck() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkOpen()
}

// readTimed reads a response or call record, hiding a missing, unreadable or expired one.
func (s *Store) readTimed(dir, id string, v any, expiresAt func() time.Time) error {
	if err := s.openCheck(); err != nil {
		return err
	}
	if !store.SafeID(id) {
		return fmt.Errorf("%s %q: %w", dir, id, store.ErrNotFound)
	}
	err := s.readRecord(dir, id, v)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && expired(expiresAt(), s.now())) {
		return fmt.Errorf("%s %s: %w", dir, id, store.ErrNotFound)
	}
	return err
}

// Response implements [store.Responses.Response].
func (s *Store) Response(_ context.Context, id string) (store.Response, error) {
	var r store.Response
	if err := s.readTimed(dirResponses, id, &r, func() time.Time { return r.ExpiresAt }); err != nil {
		return store.Response{}, err
	}
	return r, nil
}

// Call implements [store.Responses.Call].
func (s *Store) Call(_ context.Context, id string) (store.Call, error) {
	var c store.Call
	if err := s.readTimed(dirCalls, id, &c, func() time.Time { return c.ExpiresAt }); err != nil {
		return store.Call{}, err
	}
	return c, nil
}

// DeleteResponse implements [store.Responses.DeleteResponse].
func (s *Store) DeleteResponse(_ context.Context, id string) error {
	if err := s.openCheck(); err != nil {
		return err
	}
	if !store.SafeID(id) {
		return nil
	}
	return s.removeRecord(dirResponses, id, cached)
}

func responseExpiry(b []byte) (time.Time, error) {
	var r struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	err := json.Unmarshal(b, &r)
	return r.ExpiresAt, err
}

func callExpiry(b []byte) (time.Time, error) { return responseExpiry(b) }

// sweepTimed removes the records of dir whose expiry has passed. The modification time says which
// ones may have (it is set to the expiry); only those are read, and removed when their record
// agrees, so a record replaced since the directory was listed survives.
func (s *Store) sweepTimed(ctx context.Context, dir string, now time.Time, expiry func([]byte) (time.Time, error)) error {
	entries, err := os.ReadDir(s.path(dir))
	if err != nil {
		return fmt.Errorf("embedded store: %w", err)
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		id, ok := cutJSON(e.Name())
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil || info.ModTime().After(now) {
			continue
		}
		b, err := os.ReadFile(s.path(dir, e.Name()))
		if err != nil {
			continue
		}
		at, err := expiry(b)
		if err != nil {
			s.quarantine(dir, e.Name(), err)
			continue
		}
		if expired(at, now) {
			if err := s.removeRecord(dir, id, cached); err != nil {
				return err
			}
		}
	}
	return nil
}
