package agentsandboxtest

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

// TestPodKillTakesDaemons: a daemon that left its process group and session still dies with
// the pod, by KillPod and by Close.
func TestPodKillTakesDaemons(t *testing.T) {
	for _, how := range []string{"KillPod", "Close"} {
		t.Run(how, func(t *testing.T) {
			s := New(t, Options{Template: "tmpl", WarmPool: "pool",
				ImageFiles: map[string]string{"/opt/ciproxy/kernel.py": string(kernel.Source())}})
			_, sb, ip := readyClaim(t, s, client(t, s), newClaim("pool"))
			pc := processClient(t, s, ip)
			r, err := pc.Execute(context.Background(), &processv1.ExecuteRequest{Config: &processv1.ProcessConfig{
				Command: []string{"/bin/sh", "-c", "setsid sleep 1001 </dev/null >/dev/null 2>&1 & python3 -c 'import sys; print(sys.version_info[0])' && test -r /opt/ciproxy/kernel.py && echo ok"}}})
			if err != nil || string(r.Stdout) != "3\nok\n" {
				t.Fatalf("Execute = %v %v (stderr %q)", r, err, r.GetStderr())
			}
			var daemon int
			waitFor(t, "daemon", func() bool { daemon = findHostPID(t, s, sb, "sleep 1001"); return daemon != 0 })
			init := s.PodInitPID(sb)
			if how == "KillPod" {
				if err := s.KillPod(sb); err != nil {
					t.Fatal(err)
				}
			} else {
				s.Close()
			}
			waitFor(t, "daemon killed", func() bool { return !procAlive(daemon) && !procAlive(init) })
		})
	}
}

func TestSandboxStatus(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool", ReadyDelay: 300 * time.Millisecond})
	c := client(t, s)
	ctx := context.Background()

	t.Run("missing pool", func(t *testing.T) {
		cl, err := c.Resource(claimsGVR).Namespace(s.Namespace()).Create(ctx, newClaim("nope"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "WarmPoolNotFound", func() bool { r := claimReady(t, s, cl.GetName()); return r != nil && r["reason"] == "WarmPoolNotFound" })
	})

	t.Run("ready delay", func(t *testing.T) {
		claim := newClaim("pool")
		_ = unstructured.SetNestedSlice(claim.Object, []any{map[string]any{"name": "A", "value": "1"}}, "spec", "env")
		start := time.Now()
		readyClaim(t, s, c, claim)
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Errorf("ready after %v; want at least the ReadyDelay", d)
		}
	})

	t.Run("sandbox shutdownTime Retain", func(t *testing.T) {
		cl, sb, _ := readyClaim(t, s, c, newClaim("pool"))
		_ = cl
		obj, err := c.Resource(sandboxesGVR).Namespace(s.Namespace()).Get(ctx, sb, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Sandboxes are the controller's: the double changes them itself, as an operator would.
		s.mu.Lock()
		next := s.st.objects["sandboxes"][key(s.Namespace(), sb)].DeepCopy()
		_ = unstructured.SetNestedField(next.Object, time.Now().Add(-time.Second).UTC().Format(time.RFC3339), "spec", "shutdownTime")
		s.put(mustResource("Sandbox"), next, "MODIFIED")
		s.mu.Unlock()
		_ = obj
		waitFor(t, "SandboxExpired", func() bool {
			o, err := c.Resource(sandboxesGVR).Namespace(s.Namespace()).Get(ctx, sb, metav1.GetOptions{})
			if err != nil {
				return false
			}
			r := readyCondition(o)
			_, hasIPs, _ := unstructured.NestedSlice(o.Object, "status", "podIPs")
			return r != nil && r["reason"] == reasonExpired && !hasIPs
		})
		waitFor(t, "claim sees it", func() bool { r := claimReady(t, s, cl.GetName()); return r != nil && r["reason"] == reasonExpired })
	})
}
