package main

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
)

// The unwind runs last built first, goes on past a step that fails, logs that failure under the
// step's name, and runs once.
func TestAppCloseUnwindsInReverse(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	a := &app{log: zap.New(core)}
	var ran []string
	step := func(name string, err error) {
		a.onClose("closing "+name, func(ctx context.Context) error {
			if _, ok := ctx.Deadline(); !ok {
				t.Errorf("%s: the unwind's context has no deadline", name)
			}
			ran = append(ran, name)
			return err
		})
	}
	step("store", nil)
	step("backends", errors.New("backend stuck"))
	step("containers", nil)
	a.close()
	a.close()
	if want := []string{"containers", "backends", "store"}; !slices.Equal(ran, want) {
		t.Errorf("unwind ran %v; want %v, once", ran, want)
	}
	if got := logs.FilterMessage("closing backends").All(); len(got) != 1 || !strings.Contains(got[0].ContextMap()["error"].(string), "backend stuck") {
		t.Errorf("log of the failed step = %v; want one line with its error", got)
	}
	if n := logs.Len(); n != 1 {
		t.Errorf("%d lines logged; want only the failure's", n)
	}
}

// A wiring that fails part way closes what it had built: here the listen fails, after the state
// store and the sandbox backends were opened, and the data directory's lock is free again.
func TestWireUnwindsOnError(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	path := writeConfig(t, dir, `model_list:
  - model_name: m
    litellm_params: {model: openai/m, api_key: sk-x}
sandbox_tools:
  - sandbox_tool_name: cloud
    litellm_params: {sandbox_provider: e2b, api_key: e2b_k}
`)
	cfg, err := config.Load(path, backends.ParseOptions(nil))
	if err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	f := flags{config: path, host: "127.0.0.1", port: busy.Addr().(*net.TCPAddr).Port, dataDir: dataDir, sweep: defaultSweepInterval}
	a, err := wire(context.Background(), f, cfg, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), "listen") || !strings.Contains(err.Error(), strconv.Itoa(f.port)) {
		t.Fatalf("wire on a busy port = %v; want the listen error", err)
	}
	if a != nil {
		t.Errorf("wire returned an app with its error")
	}
	st, err := embedded.Open(embedded.Options{Dir: dataDir})
	if err != nil {
		t.Fatalf("the data directory is still held after the failed wiring: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Error(err)
	}
}
