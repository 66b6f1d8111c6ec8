package daytona

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

var _ sandbox.Lister = (*Provider)(nil)

// List implements [sandbox.Lister] with GET /sandbox?labels=<JSON>, which Daytona filters by
// every label given. Sandboxes being deleted or deleted already are left out.
func (p *Provider) List(ctx context.Context, metadata map[string]string) ([]sandbox.Listed, error) {
	if p.opts.APIKey == "" {
		return nil, fmt.Errorf("%w: daytona list: no API key configured", sandbox.ErrUnavailable)
	}
	labels, err := json.Marshal(metadata)
	if err != nil {
		return nil, fmt.Errorf("daytona list: %w", err)
	}
	if metadata == nil {
		labels = []byte("{}")
	}
	raw, err := p.api(ctx, "list", http.MethodGet, "/sandbox?"+url.Values{"labels": {string(labels)}}.Encode(), nil)
	if err != nil {
		return nil, err
	}
	if !raw.IsArray() {
		return nil, fmt.Errorf("%w: daytona list: the answer is not a list", sandbox.ErrUnavailable)
	}
	var out []sandbox.Listed
	for _, item := range raw.Array() {
		sb := parseSandbox(item)
		if sb.ID == "" || sb.State == "destroyed" || sb.State == "destroying" {
			continue
		}
		out = append(out, sandbox.Listed{
			Handle:    sandbox.Handle{Backend: Backend, Tool: p.opts.Tool, ID: sb.ID},
			Metadata:  sb.Labels,
			StartedAt: sb.CreatedAt,
		})
	}
	return out, nil
}
