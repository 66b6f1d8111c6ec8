package agentsandboxtest

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestClaimAdoptsFromPool(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool", WarmPoolReplicas: 2})
	c := client(t, s)
	ctx := context.Background()
	waitFor(t, "pool ready", func() bool {
		p, err := c.Resource(poolsGVR).Namespace(s.Namespace()).Get(ctx, "pool", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n, _, _ := unstructuredInt(p.Object, "status", "readyReplicas")
		return n == 2
	})
	claim, sb, ip := readyClaim(t, s, c, newClaim("pool"))
	if !strings.HasPrefix(claim.GetName(), "sandbox-claim-") || len(claim.GetName()) != len("sandbox-claim-")+5 {
		t.Errorf("generateName gave %q", claim.GetName())
	}
	if claim.GetAnnotations()[sandboxNameAnno] != sb {
		t.Errorf("annotation %v; want %s", claim.GetAnnotations(), sb)
	}
	obj, err := c.Resource(sandboxesGVR).Namespace(s.Namespace()).Get(ctx, sb, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if obj.GetAnnotations()[launchTypeAnno] != "warm" || obj.GetLabels()[warmPoolLabel] != "" {
		t.Errorf("adopted sandbox %v %v", obj.GetAnnotations(), obj.GetLabels())
	}
	t.Log(sb, ip, s.LivePods())
	waitFor(t, "replenish", func() bool { return len(s.LivePods()) == 3 })
}
