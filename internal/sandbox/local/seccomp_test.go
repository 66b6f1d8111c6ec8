package local

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// runFilter evaluates a filter as the kernel would for one system call (struct seccomp_data).
func runFilter(t *testing.T, prog []byte, auditArch uint32, nr int, args ...uint64) uint32 {
	t.Helper()
	var raw []bpf.RawInstruction
	for i := 0; i+8 <= len(prog); i += 8 {
		raw = append(raw, bpf.RawInstruction{
			Op: binary.NativeEndian.Uint16(prog[i:]), Jt: prog[i+2], Jf: prog[i+3],
			K: binary.NativeEndian.Uint32(prog[i+4:]),
		})
	}
	insts, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("filter does not disassemble")
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	// The VM loads words in network byte order, the kernel in native order: lay out each 32-bit
	// word of struct seccomp_data where the filter reads it (little-endian halves of the 64-bit
	// arguments), in big-endian.
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], uint32(nr))
	binary.BigEndian.PutUint32(data[4:], auditArch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[16+8*i+4:], uint32(a>>32))
	}
	ret, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

func TestSeccompPolicy(t *testing.T) {
	if !onAMD64 {
		t.Skip("the filter's table is checked for x86_64")
	}
	code, err := buildFilter(seccompRules(false))
	if err != nil {
		t.Fatal(err)
	}
	zyg, err := buildFilter(seccompRules(true))
	if err != nil {
		t.Fatal(err)
	}
	const (
		allow  = unix.SECCOMP_RET_ALLOW
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
		eafno  = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)
		eproto = unix.SECCOMP_RET_ERRNO | uint32(unix.EPROTONOSUPPORT)
		x86_64 = unix.AUDIT_ARCH_X86_64
		i386   = unix.AUDIT_ARCH_I386
	)
	cases := []struct {
		name       string
		arch       uint32
		nr         int
		args       []uint64
		code, zygo uint32
	}{
		{"getpid", x86_64, unix.SYS_GETPID, nil, allow, allow},
		{"read", x86_64, unix.SYS_READ, nil, allow, allow},
		{"io_uring_setup", x86_64, unix.SYS_IO_URING_SETUP, nil, eperm, eperm},
		{"bpf", x86_64, unix.SYS_BPF, nil, eperm, eperm},
		{"perf_event_open", x86_64, unix.SYS_PERF_EVENT_OPEN, nil, eperm, eperm},
		{"userfaultfd", x86_64, unix.SYS_USERFAULTFD, nil, eperm, eperm},
		{"keyctl", x86_64, unix.SYS_KEYCTL, nil, eperm, eperm},
		{"add_key", x86_64, unix.SYS_ADD_KEY, nil, eperm, eperm},
		{"kexec_load", x86_64, unix.SYS_KEXEC_LOAD, nil, eperm, eperm},
		{"finit_module", x86_64, unix.SYS_FINIT_MODULE, nil, eperm, eperm},
		{"setns", x86_64, unix.SYS_SETNS, nil, eperm, eperm},
		{"unshare", x86_64, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, eperm, allow},
		{"mount", x86_64, unix.SYS_MOUNT, nil, eperm, allow},
		{"fsopen", x86_64, unix.SYS_FSOPEN, nil, eperm, eperm},
		{"clone, a thread", x86_64, unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND}, allow, allow},
		{"clone, a user namespace", x86_64, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER}, eperm, eperm},
		{"clone, a pid namespace", x86_64, unix.SYS_CLONE, []uint64{unix.CLONE_NEWPID | 17}, eperm, eperm},
		{"clone3", x86_64, unix.SYS_CLONE3, nil, enosys, enosys},
		{"socket inet", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_INET}, allow, allow},
		{"socket vsock", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_VSOCK}, eafno, eafno},
		{"socket alg", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_ALG}, eafno, eafno},
		{"socket inet, upper half set", x86_64, unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_INET}, eafno, eafno},
		{"socket netlink route", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, allow, allow},
		{"socket netlink sock_diag", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_SOCK_DIAG}, allow, allow},
		{"socket netlink uevent", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT}, eproto, eproto},
		{"socket netlink uevent, upper half of the protocol set", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM, 1<<32 | unix.NETLINK_KOBJECT_UEVENT}, eproto, eproto},
		{"socket netlink uevent, upper half of the family set", x86_64, unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_ROUTE}, eproto, eproto},
		{"socket netlink route, upper half of the protocol set", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, 1<<32 | unix.NETLINK_ROUTE}, allow, allow},
		{"socket netlink audit", x86_64, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT}, eproto, eproto},
		{"fcntl getfl", x86_64, unix.SYS_FCNTL, []uint64{3, unix.F_GETFL}, allow, allow},
		{"fcntl getlease", x86_64, unix.SYS_FCNTL, []uint64{3, unix.F_GETLEASE}, allow, allow},
		{"fcntl setlease", x86_64, unix.SYS_FCNTL, []uint64{3, unix.F_SETLEASE, unix.F_WRLCK}, eperm, eperm},
		{"fcntl setlease, upper half set", x86_64, unix.SYS_FCNTL, []uint64{3, 1<<32 | unix.F_SETLEASE, unix.F_WRLCK}, eperm, eperm},
		{"fcntl notify", x86_64, unix.SYS_FCNTL, []uint64{3, unix.F_NOTIFY, 0}, eperm, eperm},
		{"personality query", x86_64, unix.SYS_PERSONALITY, []uint64{0xffffffff}, allow, allow},
		{"personality other", x86_64, unix.SYS_PERSONALITY, []uint64{0x0400000}, eperm, eperm},
		{"unknown number", x86_64, 1000, nil, eperm, eperm},
		{"x32 getpid", x86_64, unix.SYS_GETPID | 0x40000000, nil, enosys, enosys},
		{"i386 getpid", i386, 20, nil, eperm, eperm},
		{"i386 number of x86_64 read", i386, unix.SYS_READ, nil, eperm, eperm},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := runFilter(t, code, tc.arch, tc.nr, tc.args...); got != tc.code {
				t.Errorf("kernel filter: %#x; want %#x", got, tc.code)
			}
			if got := runFilter(t, zyg, tc.arch, tc.nr, tc.args...); got != tc.zygo {
				t.Errorf("zygote filter: %#x; want %#x", got, tc.zygo)
			}
		})
	}
}

func BenchmarkSeccompAssemble(b *testing.B) {
	for b.Loop() {
		if _, err := buildFilter(seccompRules(false)); err != nil {
			b.Fatal(err)
		}
	}
}
