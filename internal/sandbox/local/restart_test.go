package local

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// privateMemory returns the memory the processes of h's sandbox hold alone (their private pages:
// what the sandbox costs beyond the pages it shares with the fork server), and how many there are.
func privateMemory(t *testing.T, p *Provider, h sandbox.Handle) (bytes int64, procs int) {
	t.Helper()
	for _, pid := range descendants(sandboxPID(t, p, h)) {
		f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "smaps_rollup"))
		if err != nil {
			continue // gone in between
		}
		procs++
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), ":")
			if k == "Private_Clean" || k == "Private_Dirty" {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				bytes += kb << 10
			}
		}
		f.Close()
	}
	return bytes, procs
}

// TestRestartKernel: a restart gives back the memory of the kernel's Python state and of the
// processes the code left, and keeps the sandbox's files; the next execution runs in a fresh kernel.
func TestRestartKernel(t *testing.T) {
	t.Run("cgroup freezer", func(t *testing.T) { testRestartKernel(t, sharedProvider(t)) })
	t.Run("SIGSTOP fallback", func(t *testing.T) {
		testRestartKernel(t, newTestProviderWith(t, Options{PoolSize: -1}, knobs{noCgroups: true}))
	})
}

func testRestartKernel(t *testing.T, p *Provider) {
	h := create(t, p, sandbox.CreateOptions{})
	fresh, freshProcs := privateMemory(t, p, h)
	run(t, p, h, `
import os, time
if os.fork() == 0:  # a process left behind
    time.sleep(1000)
    os._exit(0)
import numpy as np, pandas as pd, matplotlib.pyplot as plt
state = np.ones((64 << 20) // 8)  # 64 MiB of Python state
df = pd.DataFrame({"a": range(100000)}).describe()
plt.plot(range(10)); plt.savefig("plot.png")
open("kept.txt", "w").write("files stay")
`)
	used, usedProcs := privateMemory(t, p, h)
	if usedProcs <= freshProcs {
		t.Fatalf("%d processes after the code forked one; %d before", usedProcs, freshProcs)
	}
	if err := p.RestartKernel(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	restarted, restartedProcs := privateMemory(t, p, h)
	t.Logf("private memory of the sandbox: fresh %d MiB (%d processes), used %d MiB (%d), restarted %d MiB (%d)",
		fresh>>20, freshProcs, used>>20, usedProcs, restarted>>20, restartedProcs)
	if restartedProcs != freshProcs {
		t.Errorf("%d processes after the restart; want %d, as a fresh sandbox (the code's own is gone)", restartedProcs, freshProcs)
	}
	if used-restarted < 64<<20 {
		t.Errorf("the restart gave back %d MiB of %d; want at least the 64 MiB of state", (used-restarted)>>20, used>>20)
	}
	res := run(t, p, h, `print(open("kept.txt").read(), os.path.exists("plot.png"))`)
	if res.Error == nil || res.Error.Name != "NameError" {
		t.Errorf("os is still imported after the restart: %+v", res)
	}
	res = run(t, p, h, `import os; print(open("kept.txt").read(), os.path.exists("plot.png"), "state" in globals())`)
	if got := strings.TrimSpace(res.Stdout); got != "files stay True False" {
		t.Errorf("after the restart the code printed %q; want the files kept and the state gone", got)
	}
}

// TestCodeRestartsItsKernel: code that signals the kernel's template restarts its own kernel and
// nothing more: its execution ends at once with an error, and the sandbox goes on with a fresh one.
func TestCodeRestartsItsKernel(t *testing.T) {
	p := sharedProvider(t)
	h := create(t, p, sandbox.CreateOptions{})
	run(t, p, h, "open('kept.txt', 'w').write('x')\nmine = 1")
	_, err := p.Run(context.Background(), h, "import os, signal, time\nos.kill(os.getppid(), signal.SIGUSR1)\ntime.sleep(50)", sandbox.RunOptions{Timeout: 55 * time.Second})
	if err == nil || errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("Run = %v; want the execution ended by the restart, not by its timeout", err)
	}
	res := run(t, p, h, "import os\nprint(os.path.exists('kept.txt'), 'mine' in globals())")
	if got := strings.TrimSpace(res.Stdout); got != "True False" {
		t.Errorf("after the code's restart: %q; want the file kept and a fresh kernel", got)
	}
}

// TestSignalMasks: the restart's diagnostic reads the four signal sets of a process.
func TestSignalMasks(t *testing.T) {
	got := signalMasks("/proc/self")
	for _, k := range []string{"SigPnd ", "ShdPnd ", "SigBlk ", "SigCgt "} {
		if !strings.Contains(got, k) {
			t.Errorf("signalMasks(/proc/self) = %q; want %s", got, k)
		}
	}
	if got := signalMasks("/proc/0"); got != "" {
		t.Errorf("signalMasks of no process = %q; want nothing", got)
	}
}
