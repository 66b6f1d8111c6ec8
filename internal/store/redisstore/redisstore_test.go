package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

func TestConformance(t *testing.T) {
	srv := redisserver.Start(t)
	var n atomic.Int32
	storetest.Run(t, func(t *testing.T, now func() time.Time) func() store.Store {
		// Each test gets its own prefix on one server: the prefix is all that keeps them apart.
		prefix := fmt.Sprintf("conformance%d:", n.Add(1))
		return func() store.Store {
			// Small chunks, so that the suite's larger files span several.
			s, err := Open(context.Background(), Options{Addr: srv.Addr(), Prefix: prefix, Now: now, ChunkSize: 64 << 10})
			if err != nil {
				t.Fatalf("Open = %v", err)
			}
			return s
		}
	})
}
