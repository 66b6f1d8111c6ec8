package router

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/containers"
)

// inflight counts the intercepted requests in progress, and the pass-through ones that inline
// stored files (each of which sends up to 50 MB for a small body), by caller and in total, against the
// quotas of each request's configuration snapshot (general_settings.max_concurrent_requests and
// max_concurrent_requests_per_key, or a client key's max_concurrent_requests).
type inflight struct {
	mu       sync.Mutex
	total    int
	byCaller map[string]int
}

// admit counts one such request of ctx's caller, or returns the 429 of the quota it would
// exceed. The returned func ends the request's count; call it once.
func (f *inflight) admit(ctx context.Context) (func(), error) {
	q := callerQuotas(ctx)
	who := Caller(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.MaxConcurrentRequestsPerKey > 0 && f.byCaller[who] >= q.MaxConcurrentRequestsPerKey {
		return nil, apierror.RateLimited(fmt.Sprintf(
			"Rate limit reached for concurrent code interpreter and file-inlining requests per API key: limit %d in flight (max_concurrent_requests_per_key). Please try again once one finishes.",
			q.MaxConcurrentRequestsPerKey), 0)
	}
	if q.MaxConcurrentRequests > 0 && f.total >= q.MaxConcurrentRequests {
		return nil, apierror.RateLimited(fmt.Sprintf(
			"Rate limit reached for concurrent code interpreter and file-inlining requests: the proxy serves its limit of %d at once (max_concurrent_requests). Please try again shortly.",
			q.MaxConcurrentRequests), 0)
	}
	if f.byCaller == nil {
		f.byCaller = map[string]int{}
	}
	f.total++
	f.byCaller[who]++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.total--
			if f.byCaller[who]--; f.byCaller[who] <= 0 {
				delete(f.byCaller, who)
			}
		})
	}, nil
}

// quotaError returns err as a 429 when it is a container quota (containers.QuotaError), else err.
func quotaError(err error) error {
	var qe *containers.QuotaError
	if errors.As(err, &qe) {
		return apierror.RateLimited(qe.Message, qe.RetryAfter)
	}
	return err
}
