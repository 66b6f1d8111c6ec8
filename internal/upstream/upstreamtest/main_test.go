package upstreamtest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that closed servers leave no goroutine behind, so that packages whose tests
// use goleak can use this server.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
