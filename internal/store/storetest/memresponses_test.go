package storetest

import (
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

func TestMemResponses(t *testing.T) {
	RunResponses(t, func(_ *testing.T, now func() time.Time) store.Responses { return NewMemResponses(now) })
}
