package local

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/settings"
)

// TestCheckMemoryLimit: the start check runs the kernel under the real limit, and when that is too
// low says what is enough, which then passes.
func TestCheckMemoryLimit(t *testing.T) {
	ctx := context.Background()
	iso, err := CheckIsolation(ctx, Options{MemoryLimit: 256 << 20})
	if err != nil {
		t.Fatalf("Check with 256 MiB: %v", err)
	}
	t.Logf("256 MiB is enough: %s", iso)
	err = Check(ctx, Options{MemoryLimit: 24 << 20})
	if err == nil {
		t.Fatal("Check with 24 MiB passed")
	}
	t.Logf("24 MiB: %v", err)
	m := regexp.MustCompile(`at least (\d+)m`).FindStringSubmatch(err.Error())
	if m == nil || !strings.Contains(err.Error(), "too low") {
		t.Fatalf("Check with 24 MiB: %v; want it to say the least memory_limit", err)
	}
	least, _ := settings.ParseSize(m[1] + "m")
	if err := Check(ctx, Options{MemoryLimit: least}); err != nil {
		t.Errorf("Check with the suggested %s MiB: %v", m[1], err)
	}
}

// TestIsolationModes: the host's mode is one value, from the uids and the cgroups it gives, and its
// guarantees and warnings say what holds in it; --check and the start log print both.
func TestIsolationModes(t *testing.T) {
	perSandbox := func() *uidLease { return &uidLease{base: 1879048192, size: uidBlock} }
	const (
		ownUID   = "a host uid per sandbox"
		bound    = "one memory and process bound per sandbox for all it holds"
		perProc  = "per-process limits only (memory, processes, file size, open files)"
		cpuCap   = "a CPU cap while code runs"
		filter   = "the seccomp filter"
		shared   = "sandboxes share one host uid"
		noCgroup = "no writable cgroup"
		noCPU    = "no cpu controller"
		noFilter = "no seccomp filter"
	)
	for _, tc := range []struct {
		name      string
		uids      *uidLease
		shape     *hostShape // nil: no writable cgroup
		noSeccomp bool
		mode      Mode
		limits    cgroupMode
		has, not  []string // guarantees
		warns     []string
		weaker    bool
	}{
		{"root, cgroup v1", perSandbox(), &hostShape{v1: allV1, memsw: true}, false,
			ModeRoot, modeCgroup1, []string{ownUID, bound, cpuCap, filter}, []string{perProc}, nil, false},
		{"root, cgroup v2 delegated", perSandbox(), &hostShape{v2: true, ctrl2: allV2, swap: true}, false,
			ModeRoot, modeCgroup2, []string{ownUID, bound, cpuCap, filter}, []string{perProc}, nil, false},
		{"root, cgroup v2 without cpu", perSandbox(), &hostShape{v2: true, ctrl2: []string{"memory", "pids"}}, false,
			ModeRoot, modeCgroup2, []string{ownUID, bound, filter}, []string{cpuCap}, []string{noCPU}, true},
		{"root, no cgroup", perSandbox(), nil, false,
			ModeRootNoCgroups, modeRlimit, []string{ownUID, perProc, filter}, []string{bound, cpuCap}, []string{noCgroup}, true},
		{"non-root, delegated cgroup v2", sharedUID(), &hostShape{v2: true, ctrl2: allV2, swap: true}, false,
			ModeNonRootCgroups, modeCgroup2, []string{bound, cpuCap, filter}, []string{ownUID}, []string{shared}, true},
		{"non-root, no cgroup (a container, a pod)", sharedUID(), nil, false,
			ModeNonRoot, modeRlimit, []string{perProc, filter}, []string{ownUID, bound, cpuCap}, []string{shared, noCgroup}, true},
		{"non-root, no seccomp", sharedUID(), nil, true,
			ModeNonRoot, modeRlimit, []string{perProc}, []string{filter}, []string{shared, noCgroup, noFilter}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Provider{uids: tc.uids, knobs: knobs{noSeccomp: tc.noSeccomp}, copier: "/usr/bin/" + copyHelper}
			if tc.shape != nil {
				_, p.cg = fakeHostOf(t, *tc.shape)
			}
			iso := p.Isolation()
			if iso.Mode != tc.mode || iso.Limits != string(tc.limits) {
				t.Errorf("mode %s, limits %s; want %s, %s", iso.Mode, iso.Limits, tc.mode, tc.limits)
			}
			for _, g := range tc.has {
				if !slices.Contains(iso.Guarantees, g) {
					t.Errorf("guarantees %q lack %q", iso.Guarantees, g)
				}
			}
			for _, g := range tc.not {
				if slices.Contains(iso.Guarantees, g) {
					t.Errorf("guarantees %q claim %q", iso.Guarantees, g)
				}
			}
			warnings := strings.Join(iso.Warnings, "; ")
			for _, w := range tc.warns {
				if !strings.Contains(warnings, w) {
					t.Errorf("warnings %q lack %q", warnings, w)
				}
			}
			if weaker := len(iso.Warnings) > 0; weaker != tc.weaker {
				t.Errorf("weaker = %v; want %v (warnings: %s)", weaker, tc.weaker, warnings)
			}
			if s := iso.String(); !strings.HasPrefix(s, "mode "+string(tc.mode)+": ") {
				t.Errorf("String() = %q; want it to start with the mode", s)
			}
		})
	}
}
