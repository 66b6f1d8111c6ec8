package agentsandbox_test

import (
	"testing"

	"github.com/ciproxy/ciproxy/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m, locals.Close) }
