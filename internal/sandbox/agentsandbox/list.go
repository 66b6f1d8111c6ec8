package agentsandbox

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

var _ sandbox.Lister = (*Provider)(nil)

// List implements [sandbox.Lister]: the namespace's claims this proxy made (managedByLabel) whose
// labels hold every pair of metadata, listed page by page. A pair that is not a valid label was
// never set at create, so nothing has it.
func (p *Provider) List(ctx context.Context, metadata map[string]string) ([]sandbox.Listed, error) {
	set := labels.Set{managedByLabel: managedByValue}
	for k, v := range metadata {
		if !labelSafe(k, v) {
			return nil, nil
		}
		set[k] = v
	}
	var out []sandbox.Listed
	cont := ""
	for page := 0; page < listMaxPages; page++ {
		ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
		list, err := p.claims().List(ctx, metav1.ListOptions{LabelSelector: set.String(), Limit: listPageSize, Continue: cont})
		cancel()
		if err != nil {
			return nil, p.apiError(ctx, "list claims", err)
		}
		for _, it := range list.Items {
			meta := map[string]string{}
			for k, v := range it.GetLabels() {
				if k != managedByLabel && !strings.HasPrefix(k, "agents.x-k8s.io/") {
					meta[k] = v
				}
			}
			out = append(out, sandbox.Listed{
				Handle:    sandbox.Handle{Backend: Backend, Tool: p.opts.Tool, ID: it.GetName()},
				Metadata:  meta,
				StartedAt: it.GetCreationTimestamp().Time,
			})
		}
		if cont = list.GetContinue(); cont == "" {
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w: agent_sandbox list: more than %d pages of claims", sandbox.ErrUnavailable, listMaxPages)
}
