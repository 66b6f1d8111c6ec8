package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ciproxy/ciproxy/internal/ctxio"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// Files in and out of a sandbox's /mnt/data (sandbox.FileSystem).
//
// /mnt/data is a tmpfs inside the sandbox's own mount namespace. At start the provider opens it
// once through its init's /proc/PID/root (checking, with the pidfd, that the pid still names that
// init) and keeps the descriptor for the sandbox's life. Every operation then resolves paths below
// that descriptor with openat2 and RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
// | RESOLVE_NO_XDEV: no ".." out of it, no symbolic link followed anywhere on the path (a link
// the code swapped in mid-way is refused, not followed), no other mount. What is opened is checked
// with fstat: only a regular file with a single link counts as a file (a FIFO, socket or device is
// refused; /mnt/data is mounted nodev and no hard link can cross into it from another filesystem
// anyway). All of it runs on a thread whose filesystem uid and gid are the sandbox's own (root's
// file capabilities drop with them), so the proxy acts with the sandbox user's rights, and what
// it creates belongs to that user; a tmpfs mounted in the sandbox's user namespace would refuse
// files owned by host root anyway. A write goes to a new file created with O_EXCL in the target's
// directory and is renamed over the target only when complete. Reads copy at most the size
// fstat reported, so a file that grows meanwhile cannot push past max.

var _ sandbox.FileSystem = (*Provider)(nil)

// resolveBeneath is how every path below /mnt/data is resolved.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// maxListDepth bounds how deep ListFiles descends; deeper directories are counted as skipped.
const maxListDepth = 64

// uploadPrefix names files being written by WriteFile (ListFiles leaves them out).
const uploadPrefix = ".ciproxy-upload-"

// splitPath checks a relative, slash-separated path and returns its elements.
func splitPath(path string) ([]string, error) {
	if path == "" || len(path) > 4096 || strings.HasPrefix(path, "/") || strings.ContainsRune(path, 0) {
		return nil, fmt.Errorf("%w: invalid path %q", sandbox.ErrNotFound, path)
	}
	parts := strings.Split(path, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." || len(p) > 255 {
			return nil, fmt.Errorf("%w: invalid path %q", sandbox.ErrNotFound, path)
		}
	}
	return parts, nil
}

// withData runs f with the descriptor of h's /mnt/data, which stays open until f returns.
func (p *Provider) withData(h sandbox.Handle, f func(b *box, data int) error) error {
	b, err := p.lookup(h)
	if err != nil {
		return err
	}
	b.dataMu.RLock()
	defer b.dataMu.RUnlock()
	if b.data < 0 {
		return fmt.Errorf("%w: local sandbox %s", sandbox.ErrNotFound, h.ID)
	}
	if p.uids.size == 1 {
		return f(b, b.data) // the proxy's own uid is the sandbox's
	}
	// setfsuid and setfsgid change the calling thread only: keep this goroutine on it.
	runtime.LockOSThread()
	uid := int(p.uids.host(b.uid))
	unix.Setfsgid(uid)
	unix.Setfsuid(uid)
	if unix.Getuid() != 0 || fsuid() != uid {
		// Not switched: stop here rather than act as root.
		unix.Setfsuid(0)
		unix.Setfsgid(0)
		runtime.UnlockOSThread()
		return fmt.Errorf("local sandbox: cannot act as the sandbox's uid %d", uid)
	}
	err = f(b, b.data)
	unix.Setfsuid(0)
	unix.Setfsgid(0)
	if fsuid() == 0 {
		runtime.UnlockOSThread()
	} // else the thread ends with this goroutine's lock: it is never reused
	return err
}

// fsuid returns the calling thread's filesystem uid (setfsuid with an invalid uid only reports it).
func fsuid() int {
	prev, _ := unix.SetfsuidRetUid(-1)
	return prev
}

// openAttempts bounds the tries of one open below /mnt/data, and openPause is the pause after the
// first failed one (each next pause is four times longer). openat2 fails with EAGAIN when the
// kernel gave up a RESOLVE_BENEATH lookup that raced with a rename, or when a lease on the file
// refuses a non-blocking open (the open starts breaking it, and the lease's holder then has
// fs.lease-break-time, 45 s by default, to let go); with EINTR when a signal came. None of these
// may hold the proxy: a few tries, the context checked between them, then the file is busy.
const (
	openAttempts = 4
	openPause    = 5 * time.Millisecond
)

// openBeneath opens path below dir (resolveBeneath), trying again a bounded number of times when
// the kernel asks to; past them the error wraps sandbox.ErrFileBusy.
func openBeneath(ctx context.Context, dir int, path string, flags uint64) (int, error) {
	pause := openPause
	for attempt := 1; ; attempt++ {
		fd, err := unix.Openat2(dir, path, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveBeneath})
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			return fd, err
		}
		if attempt == openAttempts {
			return -1, fmt.Errorf("%w: %s: %w", sandbox.ErrFileBusy, path, err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return -1, ctx.Err()
		case <-t.C:
		}
		pause *= 4
	}
}

// notFound turns the errors of a refused or missing path into sandbox.ErrNotFound, and those of a
// full /mnt/data into sandbox.ErrContainerFull.
func notFound(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV),
		errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ENXIO), errors.Is(err, unix.EACCES),
		errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENODEV):
		return fmt.Errorf("%w: %s", sandbox.ErrNotFound, path)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("%w: %s: %w", sandbox.ErrContainerFull, path, err)
	}
	return fmt.Errorf("local sandbox: %s: %w", path, err)
}

// taken tells the errors of a rename onto something that is not a regular file.
func taken(err error) bool {
	return errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) ||
		errors.Is(err, unix.ENOTDIR)
}

// WriteFile creates or replaces the regular file at path below /mnt/data with r's content.
func (p *Provider) WriteFile(ctx context.Context, h sandbox.Handle, path string, r io.Reader, max int64) error {
	parts, err := splitPath(path)
	if err != nil {
		return err
	}
	return p.withData(h, func(b *box, data int) error {
		dir, err := openBeneath(ctx, data, ".", unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return notFound(path, err)
		}
		defer func() { unix.Close(dir) }()
		for _, name := range parts[:len(parts)-1] {
			if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return notFound(path, err)
			}
			next, err := openBeneath(ctx, dir, name, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				return notFound(path, err)
			}
			unix.Close(dir)
			dir = next
		}
		name := parts[len(parts)-1]
		var st unix.Stat_t
		if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("%w: %s", sandbox.ErrNameTaken, path)
		}
		tmp := uploadPrefix + newID()[:12]
		fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return notFound(path, err)
		}
		f := os.NewFile(uintptr(fd), tmp)
		ok := false
		defer func() {
			f.Close()
			if !ok {
				unix.Unlinkat(dir, tmp, 0)
			}
		}()
		n, err := p.chargedCopy(ctx, b, f, r, max+1)
		switch {
		case errors.Is(err, sandbox.ErrContainerFull):
			return err
		case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
			return notFound(path, err)
		case err != nil:
			return fmt.Errorf("local sandbox: writing %s: %w", path, err)
		case n > max:
			return fmt.Errorf("%w: %s is over %d bytes", sandbox.ErrFileTooLarge, path, max)
		}
		if err := unix.Renameat(dir, tmp, dir, name); err != nil {
			if taken(err) {
				return fmt.Errorf("%w: %s: %w", sandbox.ErrNameTaken, path, err)
			}
			return notFound(path, err)
		}
		ok = true
		return nil
	})
}

var _ sandbox.SpaceChecker = (*Provider)(nil)

// Fit counts the files that /mnt/data has room for, from the tmpfs's free blocks and inodes: each
// file takes its size rounded up to whole blocks, and an inode.
func (p *Provider) Fit(ctx context.Context, h sandbox.Handle, sizes []int64) (int, error) {
	n := 0
	err := p.withData(h, func(_ *box, data int) error {
		var st unix.Statfs_t
		if err := unix.Fstatfs(data, &st); err != nil {
			return fmt.Errorf("local sandbox: statfs: %w", err)
		}
		block := max(st.Bsize, 1)
		free, inodes := int64(st.Bavail)*block, st.Ffree
		for _, size := range sizes {
			need := (size + block - 1) / block * block
			if need > free || inodes == 0 {
				break
			}
			free -= need
			inodes--
			n++
		}
		return nil
	})
	return n, err
}

// ReadFile copies the regular file at path below /mnt/data into w.
func (p *Provider) ReadFile(ctx context.Context, h sandbox.Handle, path string, w io.Writer, max int64) (int64, error) {
	if _, err := splitPath(path); err != nil {
		return 0, err
	}
	var n int64
	err := p.withData(h, func(_ *box, data int) error {
		// O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
		fd, err := openBeneath(ctx, data, path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
		if err != nil {
			return notFound(path, err)
		}
		f := os.NewFile(uintptr(fd), path)
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("local sandbox: %s: %w", path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
			return fmt.Errorf("%w: %s is not a regular file", sandbox.ErrNotFound, path)
		}
		if st.Size > max {
			return fmt.Errorf("%w: %s is %d bytes, over %d", sandbox.ErrFileTooLarge, path, st.Size, max)
		}
		n, err = io.CopyN(w, ctxio.Reader(ctx, f), st.Size)
		if errors.Is(err, io.EOF) {
			err = nil // it shrank meanwhile
		}
		return err
	})
	return n, err
}

// ListFiles lists the regular files below /mnt/data.
func (p *Provider) ListFiles(ctx context.Context, h sandbox.Handle, limit int) (sandbox.Listing, error) {
	var out sandbox.Listing
	err := p.withData(h, func(_ *box, data int) error {
		root, err := openBeneath(ctx, data, ".", unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return notFound(".", err)
		}
		return listDir(ctx, root, "", 0, limit, &out)
	})
	return out, err
}

// listDir lists the directory open as dir (and closes it), depth first.
func listDir(ctx context.Context, dir int, prefix string, depth, limit int, out *sandbox.Listing) error {
	f := os.NewFile(uintptr(dir), prefix)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		out.Skipped++
		return nil
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := e.Name()
		switch t := e.Type(); {
		case t.IsDir():
			if depth+1 >= maxListDepth {
				out.Skipped++
				continue
			}
			sub, err := openBeneath(ctx, dir, name, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				out.Skipped++
				continue
			}
			if err := listDir(ctx, sub, prefix+name+"/", depth+1, limit, out); err != nil {
				return err
			}
			if out.Truncated {
				return nil
			}
		case t.IsRegular():
			if strings.HasPrefix(name, uploadPrefix) {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil ||
				st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
				out.Skipped++
				continue
			}
			if len(out.Files) >= limit {
				out.Truncated = true
				return nil
			}
			out.Files = append(out.Files, sandbox.FileInfo{
				Path: prefix + name, Size: st.Size, ModTime: time.Unix(st.Mtim.Unix()),
			})
		default:
			out.Skipped++ // links, FIFOs, sockets, devices
		}
	}
	return nil
}

var _ sandbox.FileRemover = (*Provider)(nil)

// RemoveFile removes the file at path below /mnt/data: the entry itself (a link is removed, never
// followed), resolved like every other path, with the sandbox user's rights. A missing path, or a
// directory there, is left as it is and is not an error.
func (p *Provider) RemoveFile(ctx context.Context, h sandbox.Handle, path string) error {
	parts, err := splitPath(path)
	if err != nil {
		return err
	}
	return p.withData(h, func(_ *box, data int) error {
		parent := strings.Join(parts[:len(parts)-1], "/")
		if parent == "" {
			parent = "."
		}
		dir, err := openBeneath(ctx, data, parent, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			if err := notFound(path, err); !errors.Is(err, sandbox.ErrNotFound) {
				return err
			}
			return nil
		}
		defer unix.Close(dir)
		if err := unix.Unlinkat(dir, parts[len(parts)-1], 0); err != nil {
			if err := notFound(path, err); !errors.Is(err, sandbox.ErrNotFound) {
				return err
			}
		}
		return nil
	})
}
