package local

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Freezing without a cgroup freezer: every process of a sandbox descends from its init (orphans
// are reparented to it, as to any pid namespace's init), so the host can find them all through
// /proc/PID/task/TID/children and stop them with SIGSTOP, which no process can catch or ignore.
// A process forked while the walk runs is found on the next pass. The init itself is left running
// (it only reaps).

// signalTree sends sig (SIGSTOP or SIGCONT) to every descendant of pid. Stopping waits (for a
// moment at most) until each one is stopped; continuing signals every one, stopped or not, since
// SIGCONT also discards a stop still pending, and repeats until no process is new.
func signalTree(pid int, sig syscall.Signal) {
	deadline := time.Now().Add(time.Second)
	sent := map[int]bool{}
	for {
		pending := false
		for _, d := range descendantsOf(pid) {
			if sig == syscall.SIGCONT {
				if !sent[d] {
					sent[d] = true
					pending = true
					syscall.Kill(d, sig)
				}
				continue
			}
			if st := processState(d); st != 'T' && st != 'Z' && st != 0 {
				pending = true
				syscall.Kill(d, sig)
			}
		}
		if !pending || time.Now().After(deadline) {
			return
		}
		if sig == syscall.SIGSTOP {
			runtime.Gosched()
		}
	}
}

// descendantsOf lists the processes below pid.
func descendantsOf(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p))
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", p, t.Name()))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
					queue = append(queue, c)
				}
			}
		}
	}
	return out
}

// processState is the state letter of /proc/PID/stat (R, S, D, T, Z...), or 0.
func processState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ...: comm may hold spaces and parentheses; the state follows the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}
