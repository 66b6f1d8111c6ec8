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
