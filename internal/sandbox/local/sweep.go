package local

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Start-up hygiene. Every provider owns a directory WorkDir/p-ID and holds an exclusive flock on
// WorkDir/p-ID.lock for its whole life (the lock file is made and locked before the directory,
// so a directory of a live provider always has a held lock). A new provider sweeps what earlier
// processes left: a p-ID (or check-ID) whose lock it can take belongs to a process that is gone,
// so it removes the directory, the provider's cgroups (named ciproxy-ID) and the lock file. A lock
// that is held belongs to a live proxy, which may share the work dir: it is left alone.
// Directories without any lock file come from versions before the lock; they are removed once
// they are an hour old.

const legacyAge = time.Hour

// ownerLock creates and locks the lock file of id in workDir.
func ownerLock(workDir, id string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(workDir, id+".lock"), os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// sweepResult counts what a sweep removed.
type sweepResult struct {
	dirs, cgroups int
}

// sweep removes the leftovers of dead providers in workDir and, for each, its parent cgroup
// ciproxy-ID below every one of cgroupParents (cgroupRoots: every hierarchy, used or not).
func sweep(workDir string, cgroupParents []string, now time.Time) sweepResult {
	var res sweepResult
	entries, err := os.ReadDir(workDir)
	if err != nil {
		return res
	}
	names := map[string]bool{}
	for _, e := range entries {
		names[e.Name()] = true
	}
	for _, e := range entries {
		name := e.Name()
		id, isLock := strings.CutSuffix(name, ".lock")
		if !isLock {
			id = name
		}
		if !strings.HasPrefix(id, "p-") && !strings.HasPrefix(id, "check-") {
			continue
		}
		if !isLock {
			if names[id+".lock"] {
				continue // handled with its lock
			}
			// A directory of a version without locks.
			if info, err := e.Info(); err == nil && e.IsDir() && now.Sub(info.ModTime()) > legacyAge {
				if os.RemoveAll(filepath.Join(workDir, id)) == nil {
					res.dirs++
				}
			}
			continue
		}
		f, err := os.OpenFile(filepath.Join(workDir, name), os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close() // held: a live provider
			continue
		}
		// Ours now: its owner is gone. Remove its sandboxes' cgroups (their processes died with
		// the owner's fork server), its directory, then the lock.
		for _, parent := range cgroupParents {
			if removeCgroupTree(filepath.Join(parent, cgroupName(id))) {
				res.cgroups++
			}
		}
		if names[id] {
			if os.RemoveAll(filepath.Join(workDir, id)) == nil {
				res.dirs++
			}
		}
		os.Remove(filepath.Join(workDir, name))
		f.Close()
	}
	return res
}

// cgroupName is the name of a provider's parent cgroup.
func cgroupName(id string) string { return "ciproxy-" + id }

// removeCgroupTree removes a provider's parent cgroup and the empty cgroups below it (the
// sandboxes' and their leaves), depth first.
func removeCgroupTree(dir string) bool {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	for _, e := range entries {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	removeCgroup(osCgroupFS{}, dir)
	_, err = os.Stat(dir)
	return errors.Is(err, fs.ErrNotExist)
}
