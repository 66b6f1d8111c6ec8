package agentsandboxtest

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
)

func TestAPIErrors(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool", WarmPoolReplicas: 1})
	c := client(t, s)
	ctx := context.Background()
	claims := c.Resource(claimsGVR).Namespace(s.Namespace())
	named := newClaim("pool")
	named.SetGenerateName("")
	named.SetName("fixed")
	if _, err := claims.Create(ctx, named, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	noPool := newClaim("pool")
	unstructured.RemoveNestedField(noPool.Object, "spec", "warmPoolRef")
	badName := newClaim("pool")
	badName.SetGenerateName("")
	badName.SetName("Not_A_Name")
	badPolicy := newClaim("pool")
	_ = unstructured.SetNestedField(badPolicy.Object, "Sometimes", "spec", "lifecycle", "shutdownPolicy")
	tests := []struct {
		name  string
		obj   *unstructured.Unstructured
		check func(error) bool
	}{
		{"already exists", named, apierrors.IsAlreadyExists},
		{"no warmPoolRef", noPool, apierrors.IsInvalid},
		{"bad name", badName, apierrors.IsInvalid},
		{"bad enum", badPolicy, apierrors.IsInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := claims.Create(ctx, tc.obj, metav1.CreateOptions{})
			if !tc.check(err) {
				t.Fatalf("Create = %v", err)
			}
			var se *apierrors.StatusError
			if errors.As(err, &se) && tc.name != "already exists" && se.ErrStatus.Code != 422 {
				t.Errorf("code %d; want 422", se.ErrStatus.Code)
			}
		})
	}
	if _, err := claims.Get(ctx, "nope", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Get(nope) = %v; want NotFound", err)
	}
	if err := claims.Delete(ctx, "nope", metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Delete(nope) = %v; want NotFound", err)
	}

	// Defaulting: the CRD's default shutdownPolicy.
	got, err := claims.Get(ctx, "fixed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetUID() == "" || got.GetResourceVersion() == "" || got.GetCreationTimestamp().Time.IsZero() {
		t.Errorf("metadata not set: %v", got.Object["metadata"])
	}

	// Merge patch on a claim moves its shutdown time.
	when := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	p, err := claims.Patch(ctx, "fixed", types.MergePatchType, []byte(`{"spec":{"lifecycle":{"shutdownTime":"`+when+`","shutdownPolicy":"Delete"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, _, _ := unstructured.NestedString(p.Object, "spec", "lifecycle", "shutdownTime"); v != when || p.GetGeneration() != 2 {
		t.Errorf("patched: %v gen %d", p.Object["spec"], p.GetGeneration())
	}
	if _, err := claims.Patch(ctx, "fixed", types.MergePatchType, []byte(`{"spec":{"lifecycle":{"shutdownPolicy":"Never"}}}`), metav1.PatchOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("invalid patch = %v; want Invalid", err)
	}
	if _, err := claims.Patch(ctx, "nope", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("patch of a missing claim = %v; want NotFound", err)
	}

	// List with selectors.
	l, err := claims.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=fixed"})
	if err != nil || len(l.Items) != 1 {
		t.Errorf("list by name: %v %v", l, err)
	}
	l, err = claims.List(ctx, metav1.ListOptions{LabelSelector: "agents.x-k8s.io/created-by=go-client"})
	if err != nil || len(l.Items) != 1 {
		t.Errorf("list by label: %v %v", l, err)
	}
	l, err = claims.List(ctx, metav1.ListOptions{LabelSelector: "agents.x-k8s.io/created-by=other"})
	if err != nil || len(l.Items) != 0 {
		t.Errorf("list by other label: %v %v", l, err)
	}
}

func TestAuthAndDiscovery(t *testing.T) {
	s := New(t, Options{})
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := dc.ServerResourcesForGroupVersion("extensions.agents.x-k8s.io/v1beta1")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rl.APIResources {
		names = append(names, r.Name)
	}
	if strings.Join(names, ",") != "sandboxclaims,sandboxtemplates,sandboxwarmpools" {
		t.Errorf("resources %v", names)
	}
	if _, err := dc.ServerGroups(); err != nil {
		t.Error(err)
	}

	// Without the token: 401 with a Status.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Get(cfg.Host + "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("tokenless = %d; want 401", resp.StatusCode)
	}
	reqs := s.Requests()
	last := reqs[len(reqs)-1]
	if last.WithToken || last.Code != 401 || reqs[0].Verb != "discovery" || !reqs[0].WithToken {
		t.Errorf("requests %+v", reqs)
	}
}

func TestWatch(t *testing.T) {
	s := New(t, Options{Template: "tmpl", WarmPool: "pool"})
	c := client(t, s)
	ctx := context.Background()
	claims := c.Resource(claimsGVR).Namespace(s.Namespace())
	cl, err := claims.Create(ctx, newClaim("pool"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv0 := cl.GetResourceVersion()

	// Resume from the create's version with a name selector and bookmarks: the claim's
	// changes follow, in increasing versions, until it is ready.
	w, err := claims.Watch(ctx, metav1.ListOptions{ResourceVersion: rv0, FieldSelector: "metadata.name=" + cl.GetName(), AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	open := false
	for _, r := range s.Requests() {
		open = open || (r.Verb == "watch" && r.Resource == "sandboxclaims" && strings.Contains(r.Query, "fieldSelector=metadata.name") && r.Code == 200)
	}
	if !open {
		t.Errorf("the open watch is not in Requests: %+v", s.Requests())
	}
	last := rv0
	sawBookmark, ready := false, false
	for ev := range w.ResultChan() {
		o := ev.Object.(*unstructured.Unstructured)
		if ev.Type == watch.Bookmark {
			sawBookmark = true
			if ready {
				break
			}
			continue
		}
		if o.GetName() != cl.GetName() || len(o.GetResourceVersion()) < len(last) || (len(o.GetResourceVersion()) == len(last) && o.GetResourceVersion() <= last) {
			t.Fatalf("event %s %s rv %s after %s", ev.Type, o.GetName(), o.GetResourceVersion(), last)
		}
		last = o.GetResourceVersion()
		ready = ready || isReady(o)
		if ready && sawBookmark {
			break
		}
	}
	w.Stop()
	if !sawBookmark {
		t.Error("no bookmark")
	}

	// DropWatches ends open watches.
	w, err = claims.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-w.ResultChan(); ev.Type != watch.Added {
		t.Fatalf("first event %v", ev.Type)
	}
	s.DropWatches()
	for range w.ResultChan() {
	}
	if s.WatchDrops() != 1 {
		t.Errorf("WatchDrops = %d", s.WatchDrops())
	}

	// After compaction, an old version is 410 Gone.
	s.Compact()
	_, err = claims.Watch(ctx, metav1.ListOptions{ResourceVersion: rv0})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("watch from a compacted version = %v; want 410", err)
	}
	if err := claims.Delete(ctx, cl.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
