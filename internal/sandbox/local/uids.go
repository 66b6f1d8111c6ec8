package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// Host uids of sandboxes. When the proxy runs as root, every sandbox runs as a host uid of its
// own, so that the kernel's per-user limits (inotify instances and watches, pending signals,
// locked memory, message queue bytes, and RLIMIT_NPROC) are per sandbox: one tenant cannot take
// them from the others.
//
// The uids come from a range (UIDBase, UIDCount) cut into blocks of uidBlock. Each provider
// leases one block with an flock on a file in uidLockDir, held for its whole life, so that
// providers of other proxies on the same host (tests run several at once) never hand out the same
// uid; a provider that dies releases its block with its lock. Sandbox k of the block runs as host
// uid base+k (the block's first uid is never used), seen from inside its own user namespace as
// 1000.
//
// Without root there is no such map: every sandbox runs as the proxy's own uid (in a user
// namespace of its own all the same), and the per-user limits are shared.

// The default range, 0x70000000 (1879048192) and 2^20 uids after it, is in the one large range
// that systemd's allocation scheme (https://systemd.io/UIDS-GIDS/) leaves unused: above its
// container range (524288…1879048191, where systemd-nspawn, systemd-nsresourced and other
// container managers take 64K blocks, and where the earlier default 0x40000000 sat) and below
// its foreign range (0x7FFE0000…0x7FFEFFFF) and 2^31, above which setfsuid and some filesystems
// misbehave. Regular, homed, dynamic-service and nobody uids are all below 65536.
const (
	DefaultUIDBase  = 0x70000000
	DefaultUIDCount = 1 << 20
	uidBlock        = 4096
	uidLockDir      = "/run/ciproxy/uids"
)

// uidLease is the block of host uids a provider uses.
type uidLease struct {
	base uint32 // host uid of namespace uid 0
	size uint32 // namespace uids 0..size-1; 1 means a single shared uid
	lock *os.File

	mu   sync.Mutex
	next uint32   // the lowest namespace uid never handed out
	free []uint32 // namespace uids handed out and given back
}

// errNoUID: every uid of the block is in use.
var errNoUID = errors.New("every host uid of this provider's block is in use")

// leaseUIDs takes the first free block of [first, first+count) under lockDir.
func leaseUIDs(lockDir string, first, count uint32) (*uidLease, error) {
	if err := os.MkdirAll(lockDir, 0o700); err != nil {
		return nil, fmt.Errorf("uid leases: %w", err)
	}
	for b := uint32(0); b+uidBlock <= count; b += uidBlock {
		base := first + b
		f, err := os.OpenFile(filepath.Join(lockDir, fmt.Sprintf("%d.lock", base)), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("uid leases: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return &uidLease{base: base, size: uidBlock, lock: f, next: 1}, nil
	}
	return nil, fmt.Errorf("uid leases: all %d blocks of uids %d-%d are leased by other providers", count/uidBlock, first, first+count-1)
}

// sharedUID is the lease without root: the proxy's own uid for every sandbox.
func sharedUID() *uidLease {
	return &uidLease{base: uint32(os.Getuid()), size: 1}
}

// take returns a namespace uid for a new sandbox (0 when shared).
func (l *uidLease) take() (uint32, error) {
	if l.size == 1 {
		return 0, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.free); n > 0 {
		k := l.free[n-1]
		l.free = l.free[:n-1]
		return k, nil
	}
	if l.next >= l.size {
		return 0, errNoUID
	}
	l.next++
	return l.next - 1, nil
}

// put gives back a namespace uid whose sandbox has no process left.
func (l *uidLease) put(k uint32) {
	if k == 0 {
		return
	}
	l.mu.Lock()
	l.free = append(l.free, k)
	l.mu.Unlock()
}

// host is the host uid of namespace uid k.
func (l *uidLease) host(k uint32) uint32 { return l.base + k }

func (l *uidLease) release() {
	if l.lock != nil {
		l.lock.Close()
	}
}
