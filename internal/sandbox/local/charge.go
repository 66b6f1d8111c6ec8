package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/ciproxy/ciproxy/internal/ctxio"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Charging what the proxy writes into a sandbox. A tmpfs page is charged to the memory cgroup of
// the process that first writes it, so bytes the proxy itself wrote into /mnt/data would count
// against the proxy's cgroup: the host would then hold max_containers × (memory_limit +
// max_disk_size), not max_containers × memory_limit. Where the sandbox has a memory controller,
// the bytes are written by a helper process instead, cat with the new file as its stdout, which
// is placed in the sandbox's memory cgroup (v1) or its v2Copy leaf (v2: beside the frozen box,
// below the sandbox's limits) before its first byte reaches it, so they count against the
// sandbox's memory_limit as the code's own files do. The helper runs as the sandbox's host uid (the proxy's in a
// container's user namespace on cgroup v1: inUserNamespace) and is the memory controller's first choice of victim (oom_score_adj 1000; in v2 its leaf is
// outside the box's oom group): a file the sandbox's memory cannot take kills the helper, not the
// kernel, and the write fails with sandbox.ErrContainerFull. Without a memory controller (mode
// rlimit) the proxy writes the bytes itself and Isolation says they are not charged.

// inUserNamespace tells whether this process is in a user namespace other than the host's (a
// container's own). There cgroup v1 lets root of the namespace move only processes of its own uid
// into a cgroup (the kernel exempts the host's root alone), so the copy helper keeps the proxy's
// uid: it is in the sandbox's memory cgroup all the same, and writes only to the file it was given.
func inUserNamespace() bool {
	m, err := os.ReadFile("/proc/self/uid_map")
	return err == nil && strings.Join(strings.Fields(string(m)), " ") != "0 0 4294967295"
}

// copyHelper is the program that copies into a sandbox's file.
const copyHelper = "cat"

// charges tells whether sandboxes' memory cgroups can be charged with placed files.
func (h *cgroupHost) charges() bool {
	return h != nil && (slices.Contains(h.v2Controllers, "memory") || h.v1["memory"] != "")
}

// chargeDir is the cgroup in which a process charges what it writes to the sandbox's memory, ""
// when there is none.
func (cg *sandboxCgroup) chargeDir() string {
	switch {
	case cg == nil:
		return ""
	case slices.Contains(cg.host.v2Controllers, "memory"):
		return cg.v2Dir(v2Copy)
	case cg.host.v1["memory"] != "":
		return filepath.Join(cg.host.v1["memory"], cg.name)
	}
	return ""
}

// chargedCopy copies at most limit bytes of src into dst, a new file in b's /mnt/data, charged to
// b's memory cgroup where it has one, and returns the bytes copied.
func (p *Provider) chargedCopy(ctx context.Context, b *box, dst *os.File, src io.Reader, limit int64) (int64, error) {
	src = io.LimitReader(ctxio.Reader(ctx, src), limit)
	memcg := b.cg.chargeDir()
	if memcg == "" || p.copier == "" {
		return io.Copy(dst, src)
	}
	var stderr headBuffer
	cmd := exec.Command(p.copier)
	cmd.Stdout, cmd.Stderr, cmd.Env, cmd.Dir = dst, &stderr, []string{"LC_ALL=C"}, "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if p.uids.size > 1 && !(b.cg.host.v1["memory"] != "" && inUserNamespace()) {
		uid := p.uids.host(b.uid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, fmt.Errorf("local sandbox: copy helper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("local sandbox: copy helper: %w", err)
	}
	// Both before the first byte (until then the helper waits on its stdin), and on another
	// thread: this one acts with the sandbox's filesystem uid (withData).
	pid := strconv.Itoa(cmd.Process.Pid)
	placed := make(chan error, 1)
	go func() {
		err := os.WriteFile("/proc/"+pid+"/oom_score_adj", []byte("1000"), 0)
		if err == nil {
			err = b.cg.host.fs.WriteFile(filepath.Join(memcg, "cgroup.procs"), pid)
		}
		placed <- err
	}()
	if err := <-placed; err != nil {
		cmd.Process.Kill()
		in.Close()
		cmd.Wait()
		return 0, fmt.Errorf("local sandbox: placing the copy helper in the sandbox's cgroup: %w", err)
	}
	kills := b.cg.oomKills()
	n, cerr := io.Copy(in, src)
	in.Close()
	werr := cmd.Wait()
	if werr != nil {
		if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			if b.cg.oomKills() == kills {
				return n, fmt.Errorf("%w: local sandbox %s stopped while a file was written", sandbox.ErrNotFound, b.id)
			}
			// The helper was the victim: the sandbox's own processes were not.
			b.copyOOM.Add(1)
			return n, fmt.Errorf("%w: the sandbox's memory cannot take the file", sandbox.ErrContainerFull)
		}
		if msg := stderr.Bytes(); bytes.Contains(msg, []byte("No space left")) || bytes.Contains(msg, []byte("quota")) {
			return n, fmt.Errorf("%w: %w", sandbox.ErrContainerFull, syscall.ENOSPC)
		}
		return n, fmt.Errorf("local sandbox: copy helper: %w: %s", werr, bytes.TrimSpace(stderr.Bytes()))
	}
	if cerr != nil && !errors.Is(cerr, syscall.EPIPE) {
		return n, cerr
	}
	return n, nil
}
