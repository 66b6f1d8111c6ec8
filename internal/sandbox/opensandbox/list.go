package opensandbox

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// listPageSize is the lifecycle API's largest page; listMaxPages bounds one List.
const (
	listPageSize = 200
	listMaxPages = 100
)

// listStates are the states of a sandbox that may still hold resources.
func listStates() []string {
	return []string{"Pending", "Allocated", "Running", "Pausing", "Paused", "Resuming", "Unknown"}
}

var _ sandbox.Lister = (*Provider)(nil)

// List implements [sandbox.Lister] with GET /sandboxes filtered by metadata (one query value that
// is itself a URL-encoded "k=v&k2=v2") in every state but the final ones, page by page.
func (p *Provider) List(ctx context.Context, metadata map[string]string) ([]sandbox.Listed, error) {
	filter := url.Values{}
	for k, v := range metadata {
		if !labelSafe(k, v) {
			return nil, nil // never sent at create, so no sandbox has it
		}
		filter.Set(k, v)
	}
	var out []sandbox.Listed
	for page := 1; page <= listMaxPages; page++ {
		q := url.Values{"state": listStates()}
		q.Set("page", fmt.Sprint(page))
		q.Set("pageSize", fmt.Sprint(listPageSize))
		if len(filter) > 0 {
			q.Set("metadata", filter.Encode())
		}
		raw, err := p.lifecycle(ctx, "list", http.MethodGet, "/sandboxes?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		j := gjson.ParseBytes(raw)
		for _, it := range j.Get("items").Array() {
			id := it.Get("id").String()
			if id == "" {
				continue
			}
			meta := map[string]string{}
			it.Get("metadata").ForEach(func(k, v gjson.Result) bool {
				meta[k.String()] = v.String()
				return true
			})
			created, _ := time.Parse(time.RFC3339Nano, it.Get("createdAt").String())
			out = append(out, sandbox.Listed{
				Handle:    sandbox.Handle{Backend: Backend, Tool: p.opts.Tool, ID: id},
				Metadata:  meta,
				StartedAt: created,
			})
		}
		if !j.Get("pagination.hasNextPage").Bool() || len(j.Get("items").Array()) == 0 {
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w: opensandbox list: more than %d pages", sandbox.ErrUnavailable, listMaxPages)
}
