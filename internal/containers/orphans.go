package containers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// Orphans. A sandbox outlives its record when the process that created it dies between the
// backend's create and the store's CreateContainer, or when the janitor that expired a record dies
// before deleting the sandbox. A backend that lists its sandboxes by metadata (Lister: e2b) lets
// one replica find them: every sandbox is created with the deployment's tag (and the id of the
// container it is for), and a tagged sandbox that no live record names, whose container is not
// being created right now (CreatingClaim), is an orphan. Each sweep is claim-locked, so one
// replica at a time does it.

// MetadataDeployment is the sandbox metadata key of the deployment's tag: the sandboxes of one
// deployment (the replicas sharing one store) carry the same value, so that a sweep never deletes
// the sandboxes of another deployment using the same backend account.
const MetadataDeployment = "ciproxy_deployment"

// orphansClaim is the claim that makes one replica sweep at a time.
const orphansClaim = "sweep:orphans"

// CreatingClaim is the claim a creator holds on a container id from before its sandbox is created
// until its record is written (or the sandbox deleted), so that no sweep takes the new sandbox for
// an orphan meanwhile.
func CreatingClaim(containerID string) string { return "creating:" + containerID }

// OrphanOptions configure SweepOrphans.
type OrphanOptions struct {
	// Store holds the container records and the claims. Required.
	Store store.Store
	// Registry returns the current sandbox tools; the sweep lists those whose provider is a Lister.
	Registry func() *sandbox.Registry
	// Tag is the metadata every sandbox of this deployment is created with (MetadataDeployment,
	// at least): the list's filter. A sweep with no tag deletes nothing.
	Tag map[string]string
	// Holder names this replica in the claim; Lease is how long one sweep holds it (a sweep that
	// takes longer may overlap the next replica's, which only deletes what is gone already).
	Holder string
	Lease  time.Duration
	Logger *zap.Logger
}

// SweepOrphans deletes, if it wins the sweep's claim, every tagged sandbox of every listing
// backend that no live container record names, except those of containers being created. It
// returns how many it deleted; false when another replica holds the claim.
func SweepOrphans(ctx context.Context, o OrphanOptions) (int, bool, error) {
	if len(o.Tag) == 0 || o.Tag[MetadataDeployment] == "" {
		return 0, false, errors.New("sandbox: an orphan sweep needs the deployment tag")
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	won, err := o.Store.Claim(ctx, orphansClaim, o.Holder, o.Lease)
	if err != nil || !won {
		return 0, false, err
	}
	var reg *sandbox.Registry
	if o.Registry != nil {
		reg = o.Registry()
	}
	type tool struct {
		name string
		ent  *sandbox.Tool
		l    sandbox.Lister
	}
	var tools []tool
	for _, name := range reg.Names() {
		ent, ok := reg.Tool(name)
		if !ok {
			continue
		}
		if l, ok := ent.Provider.(sandbox.Lister); ok && ent.Acquire() {
			tools = append(tools, tool{name, ent, l})
		}
	}
	defer func() {
		for _, t := range tools {
			_ = t.ent.Release(context.WithoutCancel(ctx))
		}
	}()
	if len(tools) == 0 {
		return 0, true, nil
	}

	// Order matters. A creator holds CreatingClaim from before its sandbox exists until its record
	// is written. So: list the sandboxes; then leave out those whose claim is held; then read the
	// records. A sandbox listed whose claim was free had its record written before the check, or
	// never will: the records read after it name every one of the first kind.
	type candidate struct {
		t  tool
		sb sandbox.Listed
	}
	var candidates []candidate
	var errs []error
	for _, t := range tools {
		listed, err := t.l.List(ctx, o.Tag)
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox tool %q: listing: %w", t.name, err))
			continue
		}
		for _, sb := range listed {
			if id := sb.Metadata[sandbox.MetadataContainerID]; id != "" {
				holder, err := o.Store.Holder(ctx, CreatingClaim(id))
				if err != nil {
					return 0, true, errors.Join(append(errs, err)...)
				}
				if holder != "" {
					continue // being created: its record is on its way
				}
			}
			candidates = append(candidates, candidate{t, sb})
		}
	}
	if len(candidates) == 0 {
		return 0, true, errors.Join(errs...)
	}
	live, err := liveSandboxes(ctx, o.Store)
	if err != nil {
		return 0, true, errors.Join(append(errs, err)...)
	}
	deleted := 0
	for _, c := range candidates {
		if live[c.sb.Handle.ID] {
			continue
		}
		h := c.sb.Handle
		h.Tool = c.t.name
		if err := c.t.ent.Provider.Delete(ctx, h); err != nil {
			errs = append(errs, fmt.Errorf("sandbox tool %q: deleting orphan %s: %w", c.t.name, h.ID, err))
			continue
		}
		deleted++
		log.Info("orphan sandbox deleted (no live container names it)", zap.String("tool", c.t.name),
			zap.String("sandbox", h.ID), zap.String("container", c.sb.Metadata[sandbox.MetadataContainerID]))
	}
	return deleted, true, errors.Join(errs...)
}

// liveSandboxes returns the backend ids of the sandboxes that live container records name. Every
// live record has an expiry pending (idle or held), so the expiring list holds them all.
func liveSandboxes(ctx context.Context, st store.Containers) (map[string]bool, error) {
	recs, err := st.ExpiringContainers(ctx, time.Now().AddDate(100, 0, 0), 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: listing the live containers: %w", err)
	}
	live := make(map[string]bool, len(recs))
	for _, rec := range recs {
		var h sandbox.Handle
		if len(rec.Handle) > 0 && json.Unmarshal(rec.Handle, &h) == nil && h.ID != "" {
			live[h.ID] = true
		}
	}
	return live, nil
}
