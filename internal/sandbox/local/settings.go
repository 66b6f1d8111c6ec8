package local

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/settings"
)

// Keys are the litellm_params keys of a local sandbox tool (besides sandbox_provider).
func Keys() []string {
	keys := []string{"python", "memory_limit", "max_memory", "max_processes", "max_file_size", "max_disk_size", "pool_size", "work_dir", "host_paths", "cpu_limit", "max_open_files", "uid_base", "uid_count"}
	return append(append(keys, egress.Keys()...), egress.ServerKeys()...)
}

// DecodeSettings reads a local sandbox tool's litellm_params from p: every key it does not set keeps
// its DefaultOptions value, and each wrong value is recorded in p with its line (the default then
// stands in, so that all problems are found in one pass). Sizes are bytes, parsed once here.
func DecodeSettings(p *settings.Map) Options {
	o := DefaultOptions()
	if v := p.String("python"); v.Present {
		if !filepath.IsAbs(v.S) {
			p.Errorf(p.ValueLine("python"), "%s: %s must be an absolute path", p.Key("python"), v.Shown())
		} else {
			o.Python = v.S
		}
	}
	var memText, maxText string
	o.MemoryLimit, memText = p.Size("memory_limit", o.MemoryLimit)
	o.MaxMemory, maxText = p.Size("max_memory", o.MaxMemory)
	if o.MemoryLimit > o.MaxMemory {
		line := p.ValueLine("memory_limit")
		if line == 0 {
			line = p.ValueLine("max_memory")
		}
		p.Errorf(line, "%s: memory_limit (%s) is larger than max_memory (%s)", p.Path(), memText, maxText)
	}
	o.MaxProcesses = p.Int("max_processes", o.MaxProcesses, 1)
	o.MaxFileSize, _ = p.Size("max_file_size", o.MaxFileSize)
	o.MaxDiskSize, _ = p.Size("max_disk_size", o.MaxDiskSize)
	o.PoolSize = p.Int("pool_size", o.PoolSize, 0)
	if v := p.String("work_dir"); v.Present {
		if !filepath.IsAbs(v.S) {
			p.Errorf(p.ValueLine("work_dir"), "%s: %s must be an absolute path", p.Key("work_dir"), v.Shown())
		} else {
			o.WorkDir = filepath.Clean(v.S)
		}
	}
	if paths, ok := p.StringList("host_paths"); ok {
		for _, hp := range paths {
			if err := checkHostPath(hp, o.WorkDir); err != nil {
				p.Errorf(p.ValueLine("host_paths"), "%s: %q %v", p.Key("host_paths"), hp, err)
				continue
			}
			o.HostPaths = append(o.HostPaths, filepath.Clean(hp))
		}
	}
	if v := p.String("cpu_limit"); v.Present {
		cpus, err := strconv.ParseFloat(strings.TrimSpace(v.S), 64)
		if err != nil || cpus <= 0 || cpus > 1024 || math.IsNaN(cpus) {
			p.Errorf(p.ValueLine("cpu_limit"), "%s: %s is not a number of CPUs above 0 (1 is one core, 0.5 half of one)", p.Key("cpu_limit"), v.Shown())
		} else {
			o.CPULimit = cpus
		}
	}
	o.MaxOpenFiles = p.Int("max_open_files", o.MaxOpenFiles, 16)
	if base := p.Int("uid_base", int(o.UIDBase), 1); base > math.MaxUint32 {
		p.Errorf(p.ValueLine("uid_base"), "%s: must be at most %d", p.Key("uid_base"), uint32(math.MaxUint32))
	} else {
		o.UIDBase = uint32(base)
	}
	if count := p.Int("uid_count", int(o.UIDCount), uidBlock); uint64(o.UIDBase)+uint64(count) > math.MaxUint32 {
		p.Errorf(p.ValueLine("uid_count"), "%s: uid_base + uid_count must be at most %d", p.Key("uid_count"), uint32(math.MaxUint32))
	} else {
		o.UIDCount = uint32(count)
	}
	o.Network = egress.DecodeSettings(p)
	o.Egress = egress.DecodeServerSettings(p)
	return o
}

// hostPathDenied are the host directories (and all below them) never bound into a sandbox: the
// kernel's and the system's live state, where users and services keep theirs, and the places
// the sandbox has its own of (/tmp, /mnt/data), which would hide the bind.
var hostPathDenied = []string{"/proc", "/sys", "/dev", "/run", "/var/run", "/etc", "/root", "/home", "/boot", "/var/lib", "/var/log", "/tmp", "/mnt", "/media"}

// checkHostPath says why path cannot be one of host_paths: it must be an absolute directory
// that exists, neither / nor at or below a denied directory, nor holding or below workDir.
func checkHostPath(path, workDir string) error {
	clean := filepath.Clean(path)
	within := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	switch {
	case !filepath.IsAbs(path):
		return errors.New("must be an absolute path")
	case clean == "/":
		return errors.New("is the whole filesystem")
	case within(clean, workDir) || within(workDir, clean):
		return errors.New("holds or is within the sandboxes' work_dir")
	}
	for _, d := range hostPathDenied {
		switch {
		case within(clean, d):
			return fmt.Errorf("is at or below %s, which no sandbox may see", d)
		case within(d, clean):
			return fmt.Errorf("holds %s, which no sandbox may see", d)
		}
	}
	if fi, err := os.Stat(clean); err != nil || !fi.IsDir() {
		return errors.New("is not a directory on this host")
	}
	return nil
}

// Provision implements sandbox.Provisioner: it checks that a sandbox can start on this host with o
// (bubblewrap, user namespaces, the interpreter), so that a broken host fails the configuration rather
// than requests much later, and then starts the Provider of the tool.
func (o Options) Provision(ctx context.Context, tool string, log *zap.Logger) (sandbox.Provider, error) {
	o.Tool, o.Logger = tool, log
	if err := Check(ctx, o); err != nil {
		return nil, fmt.Errorf("cannot run on this host: %w", err)
	}
	return New(o)
}

// CheckHost implements sandbox.HostChecker: CheckIsolation with o.
func (o Options) CheckHost(ctx context.Context) (sandbox.HostReport, error) {
	iso, err := CheckIsolation(ctx, o)
	if err != nil {
		return sandbox.HostReport{}, err
	}
	return sandbox.HostReport{Isolation: iso.String(), Weaker: len(iso.Warnings) > 0}, nil
}

var (
	_ sandbox.Provisioner = Options{}
	_ sandbox.HostChecker = Options{}
)
