package main

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader in two goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

func TestRun(t *testing.T) {
	var out syncBuffer
	stop := make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- run([]string{"-dir", t.TempDir(), "-router", "-replicas", "1"}, &out, stop) }()
	var settings map[string]any
	for deadline := time.Now().Add(30 * time.Second); len(settings) == 0; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-errc:
			t.Fatalf("run = %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no settings printed")
		}
		if b := out.Bytes(); len(b) > 0 {
			if err := yaml.Unmarshal(b, &settings); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, k := range []string{"kubeconfig", "namespace", "warm_pool", "process_port", "files_port", "connect", "router_url", "scoped_token_secret"} {
		if settings[k] == nil || settings[k] == "" {
			t.Errorf("settings lack %s: %v", k, settings)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", settings["kubeconfig"].(string))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := c.Resource(schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}).
		Namespace(settings["namespace"].(string)).Get(context.Background(), settings["warm_pool"].(string), metav1.GetOptions{})
	if err != nil || pool.GetName() != "ciproxy-python" {
		t.Fatalf("the pool: %v %v", pool, err)
	}
	runCell(t, settings)
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// runCell runs a cell through the printed settings as a proxy would: a sandbox_tools entry parsed
// with every backend, provisioned, a container created, code run, the container deleted.
func runCell(t *testing.T, settings map[string]any) {
	t.Helper()
	b, err := yaml.Marshal(map[string]any{"sandbox_tools": []any{map[string]any{"sandbox_tool_name": "k8s", "litellm_params": settings}}})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.ParseWith(b, "double.yaml", backends.ParseOptions(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatalf("the printed settings do not parse: %v\n%s", err, b)
	}
	reg, err := backends.Build(context.Background(), cfg.SandboxTools, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Retire(context.Background(), nil)
	p, ok := reg.Get("k8s")
	if !ok {
		t.Fatal("no k8s tool")
	}
	h, err := p.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Delete(context.Background(), h)
	r, err := p.Run(context.Background(), h, "print(6 * 7)", sandbox.RunOptions{})
	if err != nil || r.Stdout != "42\n" {
		t.Errorf("a cell through the printed settings: %+v, %v", r, err)
	}
}
