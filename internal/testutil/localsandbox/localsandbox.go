// Package localsandbox shares one local (bubblewrap) sandbox provider between a package's tests,
// started only by the tests that need one: on a host that cannot run it they skip, naming what is
// missing. It is apart from internal/testutil so that the local backend's own tests can use
// testutil without an import cycle. It is imported by _test.go files only.
package localsandbox

import (
	"context"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox/local"
)

// Shared is one local sandbox provider shared by a package's tests, started by the first test that
// asks for it, so a package whose other tests need no sandbox runs on a host without bubblewrap.
// Declare one per package and close it from TestMain:
//
//	var sandboxes = localsandbox.New(local.Options{PoolSize: 2})
//	func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }
type Shared struct {
	opts local.Options
	once sync.Once
	p    *local.Provider
	err  error
}

// New returns a Shared that starts a provider with opts when first asked.
func New(opts local.Options) *Shared { return &Shared{opts: opts} }

// Provider returns the shared provider, starting it on the first call. When the host cannot run a
// local sandbox it skips tb with local.Check's reason (which names what is missing: bubblewrap, the
// interpreter, user namespaces), and so does every later call.
func (s *Shared) Provider(tb testing.TB) *local.Provider {
	tb.Helper()
	s.once.Do(func() {
		if s.err = local.Check(context.Background(), s.opts); s.err != nil {
			return
		}
		s.p, s.err = local.New(s.opts)
	})
	if s.err != nil {
		tb.Skipf("needs a local sandbox: %v", s.err)
	}
	return s.p
}

// Close closes the provider if a test started it.
func (s *Shared) Close(ctx context.Context) error {
	if s.p == nil {
		return nil
	}
	return s.p.Close(ctx)
}

// PythonModules skips tb unless the local sandbox's interpreter (python, "" for local's default)
// imports every module named, naming those it lacks.
func PythonModules(tb testing.TB, python string, modules ...string) {
	tb.Helper()
	if python == "" {
		python = local.DefaultPython
	}
	var missing []string
	for _, m := range modules {
		if exec.Command(python, "-I", "-c", "import "+m).Run() != nil {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		tb.Skipf("needs the Python modules %s in %s", strings.Join(missing, ", "), python)
	}
}
