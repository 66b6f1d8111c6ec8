package local

import (
	"context"
	"regexp"
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
