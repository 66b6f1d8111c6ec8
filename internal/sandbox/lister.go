package sandbox

import (
	"context"
	"time"
)

// Lister is implemented by providers whose backend lists the sandboxes it runs by their metadata
// (e2b), so that a sandbox whose creator died before recording it can be found and deleted.
type Lister interface {
	// List returns every sandbox (running or paused) whose metadata holds all of the pairs in
	// metadata.
	List(ctx context.Context, metadata map[string]string) ([]Listed, error)
}

// Listed is one sandbox as a backend lists it.
type Listed struct {
	// Handle is enough to Delete the sandbox (its backend and id; no access token).
	Handle    Handle
	Metadata  map[string]string
	StartedAt time.Time
}

// MetadataContainerID is the sandbox metadata key naming the container a sandbox was created for,
// so that a sandbox whose record was never written (its process died in between) can be found by
// listing the backend's sandboxes.
const MetadataContainerID = "ciproxy_container_id"
