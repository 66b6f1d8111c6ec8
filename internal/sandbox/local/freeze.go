package local

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Freezing without a cgroup freezer: every process of a sandbox descends from its init (orphans
// are reparented to it, as to any pid namespace's init), so the host can find them all through
// /proc/PID/task/TID/children and stop them with SIGSTOP, which no process can catch or ignore.
// A process forked while the walk runs is found on the next pass; the walk repeats until a pass
// finds every process in the wanted state. The init itself is left running (it only reaps).

// signalTree sends sig (SIGSTOP or SIGCONT) to every descendant of pid.
func signalTree(pid int, sig syscall.Signal) {
	for range 100 {
		pending := false
		for _, d := range descendantsOf(pid) {
			stopped := processState(d) == 'T'
			if (sig == syscall.SIGSTOP) == stopped {
				continue
			}
			pending = true
			syscall.Kill(d, sig)
		}
		if !pending {
			return
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
