package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp filters of local sandboxes: classic BPF programs that both bubblewrap (--seccomp)
// and the kernel (prctl) load. The program is laid out here with golang.org/x/net/bpf (the Go
// team's assembler), and system call names are turned into numbers with the tables of
// github.com/elastic/go-seccomp-bpf/arch (pure Go, kept in step with Linux; no cgo, no libseccomp
// on the host). That library's own policy assembler is not used: after an argument comparison
// fails it goes on comparing system call numbers against the argument it loaded, so a rule with
// arguments could let a later rule match the wrong call (TestSeccompPolicy would catch it).
//
// The policy is an allowlist modelled on Docker's default profile: what a Python workload uses is
// allowed, everything else fails with EPERM, as under Docker (deniedSyscalls names the surface
// that matters most; the default refuses it anyway). The program first checks the ABI: every
// i386 call (int 0x80) gets the default action and every x32 call (number bit 0x40000000)
// ENOSYS, so none of the 32-bit ABIs' calls runs.
//
// Two filters stack (a filter can only narrow what the ones before it allow): bubblewrap installs
// the zygote's filter on the fork server, which must still create namespaces and mount the
// sandbox's filesystems; each kernel then installs the kernels' filter on itself before any user
// code runs, which refuses those too.

// allowedSyscalls are allowed unconditionally (x86_64 names). Compared with Docker's profile,
// io_uring, ptrace and process_vm_*, memfd_secret, name_to_handle_at, fanotify, modify_ldt, the
// clock-setting calls and SysV IPC are left out. SysV shared memory outlives the processes that
// use it and is bounded by per-namespace sysctls that only the namespace's root may set, which no
// sandbox has; Python's multiprocessing and shared_memory use POSIX shared memory (files in the
// sized /dev/shm) instead.
var allowedSyscalls = []string{
	"accept", "accept4", "access", "alarm", "arch_prctl", "bind", "brk", "cachestat", "capget",
	"capset", "chdir", "chmod", "chown", "clock_getres", "clock_gettime", "clock_nanosleep",
	"close", "close_range", "connect", "copy_file_range", "creat", "dup", "dup2", "dup3",
	"epoll_create", "epoll_create1", "epoll_ctl", "epoll_pwait", "epoll_pwait2", "epoll_wait",
	"eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group", "faccessat", "faccessat2",
	"fadvise64", "fallocate", "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchownat",
	"fcntl", "fdatasync", "fgetxattr", "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr",
	"fstat", "fstatfs", "fsync", "ftruncate", "futex", "futex_requeue", "futex_wait",
	"futex_waitv", "futex_wake", "futimesat", "get_robust_list", "get_thread_area", "getcpu",
	"getcwd", "getdents", "getdents64", "getegid", "geteuid", "getgid", "getgroups", "getitimer",
	"getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom",
	"getresgid", "getresuid", "getrlimit", "getrusage", "getsid", "getsockname", "getsockopt",
	"gettid", "gettimeofday", "getuid", "getxattr", "inotify_add_watch", "inotify_init",
	"inotify_init1", "inotify_rm_watch", "io_cancel", "io_destroy", "io_getevents",
	"io_pgetevents", "io_setup", "io_submit", "ioctl", "ioprio_get", "ioprio_set", "kill",
	"landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "lchown",
	"lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr", "lremovexattr", "lseek",
	"lsetxattr", "lstat", "madvise", "map_shadow_stack", "membarrier", "memfd_create", "mincore",
	"mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "mprotect",
	"mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink",
	"mremap", "mseal", "msync", "munlock", "munlockall",
	"munmap", "nanosleep", "newfstatat", "open", "openat", "openat2", "pause", "pidfd_open",
	"pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll",
	"ppoll", "prctl", "pread64", "preadv", "preadv2", "prlimit64", "process_mrelease",
	"pselect6", "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat",
	"readv", "recvfrom", "recvmmsg", "recvmsg", "remap_file_pages", "removexattr", "rename",
	"renameat", "renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction",
	"rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
	"rt_sigtimedwait", "rt_tgsigqueueinfo", "sched_get_priority_max", "sched_get_priority_min",
	"sched_getaffinity", "sched_getattr", "sched_getparam", "sched_getscheduler",
	"sched_rr_get_interval", "sched_setaffinity", "sched_setattr", "sched_setparam",
	"sched_setscheduler", "sched_yield", "seccomp", "select", "sendfile", "sendmmsg", "sendmsg", "sendto", "set_robust_list",
	"set_thread_area", "set_tid_address", "setfsgid", "setfsuid", "setgid", "setgroups",
	"setitimer", "setpgid", "setpriority", "setregid", "setresgid", "setresuid", "setreuid",
	"setrlimit", "setsid", "setsockopt", "setuid", "setxattr", "shutdown", "sigaltstack", "signalfd", "signalfd4", "socketpair", "splice", "stat",
	"statfs", "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo",
	"tee", "tgkill", "time", "timer_create", "timer_delete", "timer_getoverrun",
	"timer_gettime", "timer_settime", "timerfd_create", "timerfd_gettime", "timerfd_settime",
	"times", "tkill", "truncate", "umask", "uname", "unlink", "unlinkat", "utime", "utimensat",
	"utimes", "vfork", "vmsplice", "wait4", "waitid", "write", "writev",
}

// deniedSyscalls fail with EPERM: the kernel surface no sandbox may reach (the default refuses
// them too; naming them keeps them refused should one be added to the allowlist by mistake).
var deniedSyscalls = []string{
	// io_uring runs operations the filter never sees.
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"bpf", "perf_event_open", "userfaultfd",
	"add_key", "request_key", "keyctl",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
	"fsmount", "fspick", "mount_setattr",
	"unshare", "setns",
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise",
	"swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd", "lookup_dcookie", "syslog",
	"sethostname", "setdomainname", "iopl", "ioperm", "modify_ldt", "vhangup",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"open_by_handle_at", "name_to_handle_at", "fanotify_init", "fanotify_mark", "memfd_secret",
	"uselib", "_sysctl", "nfsservctl", "mbind", "set_mempolicy", "migrate_pages", "move_pages",
	"shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl",
	"semget", "semop", "semtimedop", "semctl",
}

// zygoteSyscalls are allowed to the fork server only: creating a sandbox's namespaces, mounting
// its filesystems, naming its host.
var zygoteSyscalls = []string{"unshare", "mount", "sethostname"}

// cloneNamespaceFlags are the clone flags that create namespaces (CLONE_NEWNS, NEWCGROUP, NEWUTS,
// NEWIPC, NEWUSER, NEWPID, NEWNET); a clone with any of them fails with EPERM.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// socketFamilies may be opened; other families (vsock, packet, alg, bluetooth...) are
// EAFNOSUPPORT. A netlink socket is allowed for netlinkProtocols only.
var socketFamilies = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}

// netlinkProtocols are the netlink protocols a sandbox may open: routing (the interfaces and
// addresses that getifaddrs and socket.if_nameindex read) and socket diagnostics (ss). Every other
// one is EPROTONOSUPPORT: above all NETLINK_KOBJECT_UEVENT, which would deliver the host's device
// events (the sandbox's network namespace belongs to the host's user namespace), and the audit,
// connector and generic families that name host state.
var netlinkProtocols = []uint64{unix.NETLINK_ROUTE, unix.NETLINK_SOCK_DIAG}

// fcntlRefused are the fcntl commands no sandbox may use: a lease (F_SETLEASE) on a file in
// /mnt/data makes every other open of it fail or wait until the sandbox lets go, the proxy's
// included; directory notification (F_NOTIFY) is the obsolete dnotify, which inotify replaces.
var fcntlRefused = []uint64{unix.F_SETLEASE, unix.F_NOTIFY}

// personalities may be set (the ones Docker allows: Linux, with or without address-space
// randomization, and the query).
var personalities = []uint64{0, 8, 0x20000, 0x20008, 0xffffffff}

func errnoAction(errno unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(errno) }

// argMatch is one comparison of a system call argument.
type argMatch struct {
	arg   uint32
	value uint64
	clear bool // the argument has none of value's bits set (otherwise: it equals value)
	// low32 compares the low 32 bits only, for an argument the kernel reads as an int (an fcntl
	// command, a socket protocol): its upper half is ignored by the kernel and so must be by
	// the filter, or setting it would slip past a refusal.
	low32 bool
}

// alternative holds when all of its comparisons do.
type alternative []argMatch

// syscallRule applies action to the calls of names whose arguments satisfy one of alternatives
// (every call when there are none). Rules are tried in order; the first that applies decides.
type syscallRule struct {
	names        []string
	alternatives []alternative
	action       uint32
}

// each makes one single-comparison alternative per value of argument arg.
func each(arg uint32, values []uint64, low32 bool) []alternative {
	var out []alternative
	for _, v := range values {
		out = append(out, alternative{{arg: arg, value: v, low32: low32}})
	}
	return out
}

// seccompRules are the rules of kernels (zygote false) or of the fork server (zygote true).
func seccompRules(zygote bool) []syscallRule {
	allow := append([]string(nil), allowedSyscalls...)
	var deny []string
	for _, name := range deniedSyscalls {
		if zygote && slices.Contains(zygoteSyscalls, name) {
			allow = append(allow, name)
			continue
		}
		deny = append(deny, name)
	}
	sockets := each(0, socketFamilies, false)
	for _, proto := range netlinkProtocols {
		sockets = append(sockets, alternative{{arg: 0, value: unix.AF_NETLINK}, {arg: 2, value: proto, low32: true}})
	}
	return []syscallRule{
		// Before the allowlist, which allows fcntl's other commands.
		{names: []string{"fcntl"}, alternatives: each(1, fcntlRefused, true), action: errnoAction(unix.EPERM)},
		{names: allow, action: unix.SECCOMP_RET_ALLOW},
		{names: []string{"clone"}, alternatives: []alternative{{{arg: 0, value: cloneNamespaceFlags, clear: true}}}, action: unix.SECCOMP_RET_ALLOW},
		{names: []string{"socket"}, alternatives: sockets, action: unix.SECCOMP_RET_ALLOW},
		{names: []string{"personality"}, alternatives: each(0, personalities, false), action: unix.SECCOMP_RET_ALLOW},
		// glibc tries clone3 first and falls back to clone only on ENOSYS; clone3's flags are in
		// memory, where a filter cannot read them.
		{names: []string{"clone3"}, action: errnoAction(unix.ENOSYS)},
		{names: []string{"socket"}, alternatives: []alternative{{{arg: 0, value: unix.AF_NETLINK, low32: true}}}, action: errnoAction(unix.EPROTONOSUPPORT)},
		{names: []string{"socket"}, action: errnoAction(unix.EAFNOSUPPORT)},
		{names: append(deny, "clone", "personality"), action: errnoAction(unix.EPERM)},
	}
}

// defaultAction is what a call no rule names gets.
var defaultAction = errnoAction(unix.EPERM)

// Offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// x32Bit marks the system calls of the x32 ABI, which share AUDIT_ARCH_X86_64.
const x32Bit = 0x40000000

// assembleFilter lays rules out as a program for the host's architecture.
func assembleFilter(rules []syscallRule) ([]bpf.Instruction, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: defaultAction},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
	}
	if info.ID == arch.X86_64.ID {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: x32Bit, SkipFalse: 1},
			bpf.RetConstant{Val: errnoAction(unix.ENOSYS)})
	}
	for _, r := range rules {
		for _, name := range r.names {
			nr, ok := info.SyscallNames[name]
			if !ok {
				if !onAMD64 {
					continue // the lists are x86_64's; a call this architecture lacks needs no rule
				}
				return nil, fmt.Errorf("seccomp filter: no system call %q on %s", name, info.Name)
			}
			if len(r.alternatives) == 0 {
				prog = append(prog,
					bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(nr), SkipFalse: 1},
					bpf.RetConstant{Val: r.action})
				continue
			}
			// Each alternative returns the action when its comparisons hold and falls through to
			// the next one otherwise. The accumulator then holds an argument: reload the number.
			var block []bpf.Instruction
			for _, alt := range r.alternatives {
				b, err := alternativeBlock(alt, r.action)
				if err != nil {
					return nil, fmt.Errorf("seccomp filter: %s: %w", name, err)
				}
				block = append(block, b...)
			}
			block = append(block, bpf.LoadAbsolute{Off: offNr, Size: 4})
			if len(block) > 255 {
				return nil, fmt.Errorf("seccomp filter: too many alternatives for %s", name)
			}
			prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(nr), SkipFalse: uint8(len(block))})
			prog = append(prog, block...)
		}
	}
	return append(prog, bpf.RetConstant{Val: defaultAction}), nil
}

// alternativeBlock returns action when every comparison of alt holds and falls through past
// its end otherwise. It is laid out from the end, so each failed comparison's jump is the length
// of what follows it.
func alternativeBlock(alt alternative, action uint32) ([]bpf.Instruction, error) {
	block := []bpf.Instruction{bpf.RetConstant{Val: action}}
	prepend := func(off, val uint32, clear bool) error {
		if len(block) > 255 {
			return errors.New("too many comparisons")
		}
		skip := uint8(len(block))
		cmp := bpf.JumpIf{Cond: bpf.JumpEqual, Val: val, SkipFalse: skip}
		if clear {
			cmp = bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: val, SkipTrue: skip}
		}
		block = append([]bpf.Instruction{bpf.LoadAbsolute{Off: off, Size: 4}, cmp}, block...)
		return nil
	}
	for i := len(alt) - 1; i >= 0; i-- {
		m := alt[i]
		lo32, hi32 := offArgs+8*m.arg, offArgs+8*m.arg+4
		if err := prepend(lo32, uint32(m.value), m.clear); err != nil {
			return nil, err
		}
		if !m.low32 {
			if err := prepend(hi32, uint32(m.value>>32), m.clear); err != nil {
				return nil, err
			}
		}
	}
	return block, nil
}

// buildFilter assembles rules into the sock_filter array (8 bytes an instruction, native byte
// order) that bubblewrap's --seccomp and prctl(PR_SET_SECCOMP) read.
func buildFilter(rules []syscallRule) ([]byte, error) {
	insts, err := assembleFilter(rules)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	if len(raw) > 4096 { // BPF_MAXINSNS
		return nil, fmt.Errorf("seccomp filter: %d instructions, over the kernel's 4096", len(raw))
	}
	out := make([]byte, 0, 8*len(raw))
	for _, in := range raw {
		out = binary.NativeEndian.AppendUint16(out, in.Op)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out, nil
}

// onAMD64 tells whether the syscall names above are the host's (the policy is written for x86_64).
const onAMD64 = runtime.GOARCH == "amd64"
