package e2b

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKillTree runs killProcess's script on this host against a command that started children
// in several ways, its process not leading a group (as under envd), and checks that none is left.
func TestKillTree(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	mark := strconv.Itoa(os.Getpid())
	cmd := exec.Command("bash", "-c", fmt.Sprintf("sleep 1%[1]s & (sleep 2%[1]s; true) & bash -c 'sleep 3%[1]s' & echo ready; wait", mark))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a group of its own, away from go test's
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("read %q, %v", buf, err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(sleeps(mark)) < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the command's sleeps did not start: %v", sleeps(mark))
		}
	}
	// The script runs with the command's process not leading a group: the tree walk must do.
	script := strings.ReplaceAll(fmt.Sprintf(killTree, cmd.Process.Pid), "kill -KILL -- -", "true ")
	if b, err := exec.Command("bash", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("killTree: %v %s", err, b)
	}
	_ = cmd.Wait()
	for _, pid := range sleeps(mark) {
		t.Errorf("left running: pid %d", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// sleeps returns the pids of this test's sleep processes.
func sleeps(mark string) []int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if err == nil && strings.HasPrefix(string(b), "sleep\x00") && strings.HasSuffix(string(b), mark+"\x00") {
			if pid, err := strconv.Atoi(p.Name()); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
