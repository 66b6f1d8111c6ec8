package agentsandboxtest

import (
	"context"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
)

var (
	claimsGVR    = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	sandboxesGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	poolsGVR     = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
)

func client(t *testing.T, s *Server) dynamic.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newClaim(pool string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"generateName": "sandbox-claim-", "labels": map[string]any{"agents.x-k8s.io/created-by": "go-client"}},
		"spec":     map[string]any{"warmPoolRef": map[string]any{"name": pool}},
	}}
}

// waitFor polls f (every 10ms) until it is true or 20s pass.
func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readyClaim creates a claim and waits until it names a ready sandbox; it returns the claim and
// the sandbox's name and pod IP.
func readyClaim(t *testing.T, s *Server, c dynamic.Interface, claim *unstructured.Unstructured) (*unstructured.Unstructured, string, string) {
	t.Helper()
	ctx := context.Background()
	got, err := c.Resource(claimsGVR).Namespace(s.Namespace()).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var sb, ip string
	waitFor(t, "claim ready", func() bool {
		cl, err := c.Resource(claimsGVR).Namespace(s.Namespace()).Get(ctx, got.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sb, _, _ = unstructured.NestedString(cl.Object, "status", "sandbox", "name")
		ips, _, _ := unstructured.NestedStringSlice(cl.Object, "status", "sandbox", "podIPs")
		if sb == "" || len(ips) == 0 || !isReady(cl) {
			return false
		}
		ip = ips[0]
		got = cl
		return true
	})
	return got, sb, ip
}

func unstructuredInt(obj map[string]any, path ...string) (int64, bool, error) {
	return unstructured.NestedInt64(obj, path...)
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }
