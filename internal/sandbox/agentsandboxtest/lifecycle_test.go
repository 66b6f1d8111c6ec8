package agentsandboxtest

import (
	"context"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
)

func claimReady(t *testing.T, s *Server, name string) map[string]any {
	t.Helper()
	cl, err := client(t, s).Resource(claimsGVR).Namespace(s.Namespace()).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return readyCondition(cl)
}

func TestDeleteCascades(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool"})
	c := client(t, s)
	ctx := context.Background()
	cl, sb, _ := readyClaim(t, s, c, newClaim("pool"))
	pid := s.PodInitPID(sb)
	if err := c.Resource(claimsGVR).Namespace(s.Namespace()).Delete(ctx, cl.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resource(sandboxesGVR).Namespace(s.Namespace()).Get(ctx, sb, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the claim's sandbox after the claim's delete: %v", err)
	}
	waitFor(t, "pod gone", func() bool { return !procAlive(pid) && !slices.Contains(s.LivePods(), sb) })
	if len(s.LiveClaims()) != 0 {
		t.Errorf("LiveClaims = %v", s.LiveClaims())
	}
}

func TestColdStartWithEnv(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool"})
	c := client(t, s)
	claim := newClaim("pool")
	_ = unstructured.SetNestedSlice(claim.Object, []any{map[string]any{"name": "CLAIM_VAR", "value": "v"}}, "spec", "env")
	cl, sb, ip := readyClaim(t, s, c, claim)
	if sb != cl.GetName() {
		t.Errorf("cold sandbox %s; want the claim's name %s", sb, cl.GetName())
	}
	obj, err := c.Resource(sandboxesGVR).Namespace(s.Namespace()).Get(context.Background(), sb, metav1.GetOptions{})
	if err != nil || obj.GetAnnotations()[launchTypeAnno] != "cold" {
		t.Fatalf("sandbox %v %v", obj, err)
	}
	r, err := processClient(t, s, ip).Execute(context.Background(), &processv1.ExecuteRequest{Config: &processv1.ProcessConfig{Command: []string{"/bin/sh", "-c", "echo $CLAIM_VAR"}}})
	if err != nil || string(r.Stdout) != "v\n" {
		t.Errorf("env in the pod: %v %v", r, err)
	}
}

func TestExpiry(t *testing.T) {
	tests := []struct {
		policy      string
		claimRemain bool
	}{{"Delete", false}, {"Retain", true}}
	for _, tc := range tests {
		t.Run(tc.policy, func(t *testing.T) {
			s := New(t, Options{Template: "tmpl", WarmPool: "pool"})
			c := client(t, s)
			cl, sb, _ := readyClaim(t, s, c, newClaim("pool"))
			pid := s.PodInitPID(sb)
			patch := `{"spec":{"lifecycle":{"shutdownTime":"` + time.Now().Add(-time.Second).UTC().Format(time.RFC3339) + `","shutdownPolicy":"` + tc.policy + `"}}}`
			if _, err := c.Resource(claimsGVR).Namespace(s.Namespace()).Patch(context.Background(), cl.GetName(), "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "pod gone", func() bool { return !procAlive(pid) })
			waitFor(t, "claim state", func() bool {
				if !tc.claimRemain {
					return len(s.LiveClaims()) == 0
				}
				c := claimReady(t, s, cl.GetName())
				return c != nil && c["reason"] == reasonClaimExpired && c["status"] == "False"
			})
		})
	}
}

func TestFaultHooks(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool"})
	c := client(t, s)
	ctx := context.Background()
	claims := c.Resource(claimsGVR).Namespace(s.Namespace())

	t.Run("FailCreates", func(t *testing.T) {
		s.FailCreates(1)
		if _, err := claims.Create(ctx, newClaim("pool"), metav1.CreateOptions{}); !apierrors.IsInternalError(err) {
			t.Errorf("create = %v; want 500", err)
		}
		s.FailCreates(1, 403)
		if _, err := claims.Create(ctx, newClaim("pool"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("create = %v; want 403", err)
		}
		if len(s.LiveClaims()) != 0 {
			t.Errorf("LiveClaims = %v", s.LiveClaims())
		}
	})

	t.Run("StallClaims", func(t *testing.T) {
		s.StallClaims(true)
		cl, err := claims.Create(ctx, newClaim("pool"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		from := s.passes
		s.mu.Unlock()
		waitFor(t, "controller passes", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.passes >= from+5 })
		got, _ := claims.Get(ctx, cl.GetName(), metav1.GetOptions{})
		if got.GetAnnotations()[sandboxNameAnno] != "" {
			t.Errorf("stalled claim got %v", got.GetAnnotations())
		}
		s.StallClaims(false)
		waitFor(t, "unstalled", func() bool { c := claimReady(t, s, cl.GetName()); return c != nil && c["status"] == "True" })
		_ = claims.Delete(ctx, cl.GetName(), metav1.DeleteOptions{})
	})

	t.Run("HoldReadiness and KillPod", func(t *testing.T) {
		s.HoldReadiness(true)
		claim := newClaim("pool")
		_ = unstructured.SetNestedSlice(claim.Object, []any{map[string]any{"name": "X", "value": "1"}}, "spec", "env") // a new pod
		cl, err := claims.Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "pod IP while held", func() bool {
			c := claimReady(t, s, cl.GetName())
			return c != nil && c["reason"] == reasonNotReady && s.PodIP(cl.GetName()) != ""
		})
		s.HoldReadiness(false)
		waitFor(t, "ready", func() bool { c := claimReady(t, s, cl.GetName()); return c != nil && c["status"] == "True" })
		pid := s.PodInitPID(cl.GetName())
		if err := s.KillPod(cl.GetName()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "PodFailed", func() bool {
			c := claimReady(t, s, cl.GetName())
			return c != nil && c["reason"] == reasonPodFailed && !procAlive(pid)
		})
		sb, _ := c.Resource(sandboxesGVR).Namespace(s.Namespace()).Get(ctx, cl.GetName(), metav1.GetOptions{})
		if ips, ok, _ := unstructured.NestedSlice(sb.Object, "status", "podIPs"); ok {
			t.Errorf("a failed pod keeps podIPs %v", ips)
		}
		if slices.Contains(s.LivePods(), cl.GetName()) {
			t.Errorf("LivePods %v", s.LivePods())
		}
	})
}
