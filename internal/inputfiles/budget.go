package inputfiles

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// Budget counts the bytes of stored files that requests in flight inline, in all and by owner,
// against Limits: general_settings.max_inline_bytes_in_flight and
// max_inline_bytes_in_flight_per_key. A pass-through request streams its files and holds none of
// their bytes, but sends them all (1 KB in, 50 MB out); an intercepted one holds them as data
// URLs for its whole loop. Either way one request's count is the bytes of the files it names
// (docs/files.md). The zero Budget is ready; it is safe for concurrent use.
type Budget struct {
	mu      sync.Mutex
	total   int64
	byOwner map[string]int64
}

// Limits bound a Budget: the bytes all requests together, and one owner's, may inline at once.
// Zero is no bound.
type Limits struct {
	InFlight, PerOwner int64
}

// Reserve counts n bytes for a request of owner until the returned func is called (once; more
// calls do nothing). Past the owner's share it is a 429, as the caller's own load, which it can
// wait out; past the process's bound, which every caller shares, a 503: the server is busy, not
// the caller over its share. A request that needs more than a bound on its own, and would never
// be admitted, is a 400.
func (b *Budget) Reserve(owner string, n int64, lim Limits) (func(), error) {
	if n <= 0 {
		return func() {}, nil
	}
	for _, l := range []struct {
		max  int64
		name string
	}{{lim.PerOwner, "max_inline_bytes_in_flight_per_key"}, {lim.InFlight, "max_inline_bytes_in_flight"}} {
		if l.max > 0 && n > l.max {
			return nil, apierror.BadRequest(fmt.Sprintf("The files this request names by file_id take %d bytes, more than the %d bytes the proxy inlines at once (%s).", n, l.max, l.name), "input", apierror.CodeFileTooLarge)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if lim.PerOwner > 0 && b.byOwner[owner]+n > lim.PerOwner {
		return nil, apierror.RateLimited(fmt.Sprintf(
			"Rate limit reached for files inlined by file_id per API key: your requests in flight already inline %d bytes of the %d allowed at once (max_inline_bytes_in_flight_per_key). Please try again once one finishes.",
			b.byOwner[owner], lim.PerOwner), 0)
	}
	if lim.InFlight > 0 && b.total+n > lim.InFlight {
		return nil, &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeServer, Code: apierror.CodeServerOverloaded,
			Message: fmt.Sprintf("The server is busy: the requests in flight already inline %d bytes of files of the %d it allows at once (max_inline_bytes_in_flight). Please try again shortly.", b.total, lim.InFlight)}
	}
	if b.byOwner == nil {
		b.byOwner = map[string]int64{}
	}
	b.total += n
	b.byOwner[owner] += n
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.total -= n
			if b.byOwner[owner] -= n; b.byOwner[owner] <= 0 {
				delete(b.byOwner, owner)
			}
		})
	}, nil
}

// InFlight returns the bytes counted now, in all and for owner.
func (b *Budget) InFlight(owner string) (total, ofOwner int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total, b.byOwner[owner]
}
