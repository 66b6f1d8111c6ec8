package e2b

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// listPageSize is e2b's largest page of GET /v2/sandboxes.
const listPageSize = 100

// listMaxPages bounds one List: 100 pages of 100 sandboxes is far beyond any team's concurrency
// cap, so more would be a cursor that never ends.
const listMaxPages = 100

// listedSandbox is an element of GET /v2/sandboxes: e2b's ListedSandbox, as far as List reads it.
type listedSandbox struct {
	SandboxID string            `json:"sandboxID"`
	StartedAt time.Time         `json:"startedAt"`
	State     string            `json:"state"`
	Metadata  map[string]string `json:"metadata"`
}

var _ sandbox.Lister = (*Provider)(nil)

// List implements [sandbox.Lister] with GET /v2/sandboxes, filtered by metadata (sent as one
// query value, itself a URL-encoded "k=v&k2=v2", as the SDKs send it) in both states, running and
// paused, following X-Next-Token from page to page.
func (p *Provider) List(ctx context.Context, metadata map[string]string) ([]sandbox.Listed, error) {
	if p.opts.APIKey == "" {
		return nil, fmt.Errorf("%w: e2b list: no API key configured", sandbox.ErrUnavailable)
	}
	filter := url.Values{}
	for k, v := range metadata {
		filter.Set(k, v)
	}
	var out []sandbox.Listed
	next := ""
	for range listMaxPages {
		q := url.Values{}
		q.Set("state", "running,paused")
		q.Set("limit", fmt.Sprint(listPageSize))
		if len(filter) > 0 {
			q.Set("metadata", filter.Encode())
		}
		if next != "" {
			q.Set("nextToken", next)
		}
		var page []listedSandbox
		hdr, err := p.controlHeader(ctx, "list", http.MethodGet, "/v2/sandboxes?"+q.Encode(), nil, &page)
		if err != nil {
			return nil, err
		}
		for _, sb := range page {
			if sb.SandboxID == "" {
				continue
			}
			out = append(out, sandbox.Listed{
				Handle:    sandbox.Handle{Backend: backendName, Tool: p.opts.Tool, ID: sb.SandboxID},
				Metadata:  sb.Metadata,
				StartedAt: sb.StartedAt,
			})
		}
		if next = hdr.Get("X-Next-Token"); next == "" || len(page) == 0 {
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w: e2b list: more than %d pages", sandbox.ErrUnavailable, listMaxPages)
}
