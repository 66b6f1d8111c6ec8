package e2b

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// TestRedirectsAreNotFollowed: code in an e2b sandbox can answer on its own data plane; a redirect
// must not carry the code and the access token anywhere else.
func TestRedirectsAreNotFollowed(t *testing.T) {
	var hit atomic.Int32
	inside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit.Add(1) }))
	defer inside.Close()
	dataPlane := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, inside.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer dataPlane.Close()
	for _, client := range []*http.Client{nil, {}} {
		p, err := New(Options{APIKey: "e2b_0123", APIBase: dataPlane.URL, SandboxURL: dataPlane.URL, HTTPClient: client})
		if err != nil {
			t.Fatal(err)
		}
		h := sandbox.Handle{Backend: "e2b", ID: "iabc", AccessToken: "secret-token"}
		if _, err := p.Run(context.Background(), h, "print(1)", sandbox.RunOptions{}); err == nil {
			t.Error("Run through a redirect succeeded; want an error")
		}
		if _, err := p.Create(context.Background(), sandbox.CreateOptions{}); err == nil {
			t.Error("Create through a redirect succeeded; want an error")
		}
		_ = p.Close(context.Background())
	}
	if n := hit.Load(); n != 0 {
		t.Errorf("the redirect target got %d requests; want none", n)
	}
}
