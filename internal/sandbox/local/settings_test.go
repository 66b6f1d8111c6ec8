package local

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ciproxy/ciproxy/internal/settings"
)

func decode(t *testing.T, src string) (Options, error) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	d := settings.NewDecoder(func(string) (string, bool) { return "", false })
	o := DecodeSettings(d.Map(doc.Content[0], "p", "p", Keys(), nil))
	return o, d.Err("c.yaml")
}

// Each default is written once: what a tool that sets nothing decodes to is DefaultOptions, and New
// keeps it as it is (pool_size 0 included, which means no warm pool, not the default pool).
func TestDecodeSettingsDefaults(t *testing.T) {
	o, err := decode(t, "{}")
	if err != nil || !reflect.DeepEqual(o, DefaultOptions()) {
		t.Errorf("DecodeSettings({}) = %+v, %v; want DefaultOptions() %+v", o, err, DefaultOptions())
	}
	if got := o.withDefaults(); got.PoolSize != DefaultPoolSize || got.MemoryLimit != DefaultMemoryLimit {
		t.Errorf("withDefaults changed the decoded defaults: %+v", got)
	}
	o, err = decode(t, "{pool_size: 0, memory_limit: 512m, max_memory: 1g}")
	if err != nil || o.PoolSize != 0 || o.withDefaults().PoolSize != 0 || o.MemoryLimit != 512<<20 || o.MaxMemory != 1<<30 {
		t.Errorf("DecodeSettings(pool_size 0) = %+v, %v; want no pool and the sizes in bytes", o, err)
	}
	if got := (Options{}).withDefaults(); got.PoolSize != 0 || got.Python != DefaultPython {
		t.Errorf("Options{}.withDefaults() = %+v; want the defaults with no pool", got)
	}
}

func TestDecodeSettingsErrors(t *testing.T) {
	_, err := decode(t, "max_memory: 512m\n")
	const want = "c.yaml:1: p: memory_limit (1g) is larger than max_memory (512m)"
	if err == nil || err.Error() != want {
		t.Errorf("DecodeSettings(max_memory below the default memory_limit) error = %v; want %q", err, want)
	}
}

func TestDecodeSettingsLimits(t *testing.T) {
	o, err := decode(t, "{cpu_limit: 0.5, max_open_files: 64, uid_base: 200000, uid_count: 8192}")
	if err != nil || o.CPULimit != 0.5 || o.MaxOpenFiles != 64 || o.UIDBase != 200000 || o.UIDCount != 8192 {
		t.Errorf("DecodeSettings = %+v, %v", o, err)
	}
	for _, tc := range []struct{ src, want string }{
		{"cpu_limit: 0", "c.yaml:1: p.cpu_limit"},
		{"cpu_limit: many", "not a number of CPUs"},
		{"max_open_files: 3", "must be at least 16"},
		{"uid_base: 0", "must be at least 1"},
		{"uid_count: 10", "must be at least 4096"},
		{"{uid_base: 4294967000, uid_count: 4096}", "uid_base + uid_count must be at most"},
	} {
		if _, err := decode(t, tc.src); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeSettings(%s) error = %v; want %q", tc.src, err, tc.want)
		}
	}
}

// TestDefaultUIDRange: the default uids collide with nothing systemd allocates or reserves
// (https://systemd.io/UIDS-GIDS/).
func TestDefaultUIDRange(t *testing.T) {
	first, last := uint64(DefaultUIDBase), uint64(DefaultUIDBase)+uint64(DefaultUIDCount)-1
	for _, r := range []struct {
		what        string
		first, last uint64
	}{
		{"system and regular users", 0, 60000},
		{"homed users and host users mapped into containers", 60001, 60577},
		{"dynamic service users", 61184, 65519},
		{"nobody and 16-bit -1", 65534, 65535},
		{"container ranges (nspawn, nsresourced)", 524288, 1879048191},
		{"foreign range", 0x7FFE0000, 0x7FFEFFFF},
		{"2^31 and above", 1 << 31, 1<<32 - 1},
	} {
		if first <= r.last && r.first <= last {
			t.Errorf("default uids %d…%d overlap systemd's %s (%d…%d)", first, last, r.what, r.first, r.last)
		}
	}
}

// TestHostPaths: host_paths takes existing directories outside the host's live state, refuses
// the rest with a reason, and each one becomes a read-only bind in the sandbox's view, its bin
// directory on PATH.
func TestHostPaths(t *testing.T) {
	rt := hostRuntime(t)
	for _, tc := range []struct {
		path, refusal string
	}{
		{rt, ""},
		{"relative/jdk", "absolute"},
		{"/", "whole filesystem"},
		{"/etc/ssl", "/etc"},
		{"/proc/self", "/proc"},
		{"/var", "holds /var/run"},
		{"/home/someone", "/home"},
		{"/tmp/jdk", "/tmp"},
		{rt + "/missing", "not a directory"},
		{DefaultOptions().WorkDir, "work_dir"},
	} {
		o, err := decode(t, "host_paths: ["+tc.path+"]\n")
		switch {
		case tc.refusal == "" && (err != nil || len(o.HostPaths) != 1 || o.HostPaths[0] != tc.path):
			t.Errorf("host_paths [%s] = %v, %v; want it taken", tc.path, o.HostPaths, err)
		case tc.refusal != "" && (err == nil || !strings.Contains(err.Error(), tc.refusal) || len(o.HostPaths) != 0):
			t.Errorf("host_paths [%s] = %v, %v; want it refused naming %q", tc.path, o.HostPaths, err, tc.refusal)
		}
	}
	args := strings.Join(zygoteArgs("/usr/bin/python3", []string{rt}, nil, -1, nil, []string{"x"}), " ")
	if !strings.Contains(args, "--ro-bind "+rt+" "+rt) {
		t.Errorf("the view does not bind %s read-only: %s", rt, args)
	}
	if env := strings.Join(sandboxEnv([]string{rt}), " "); !strings.Contains(env, "PATH /usr/bin:/bin:"+rt+"/bin") {
		t.Errorf("PATH does not end with the runtime's bin: %s", env)
	}
}

// hostRuntime makes a runtime directory for host_paths, outside /tmp (a sandbox's own /tmp would
// hide it), readable by any uid, with bin/hello-runtime; it is removed at the end of the test.
func hostRuntime(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("/var/tmp", "ciproxy-runtime-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	rt := base + "/runtime"
	if err := os.MkdirAll(rt+"/bin", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rt+"/bin/hello-runtime", []byte("#!/bin/sh\necho hello from the runtime\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return rt
}
