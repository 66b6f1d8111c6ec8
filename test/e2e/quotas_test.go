package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestReplicasShareQuotas: two processes of the binary on one redis-server enforce one
// max_containers_per_key together. Containers made through either count on both, and a container
// deleted through the other replica gives its place back.
func TestReplicasShareQuotas(t *testing.T) {
	if testing.Short() {
		t.Skip("two proxies and a redis-server: not in -short")
	}
	rs := redisserver.Start(t)
	emu, _ := newEmulator(t)
	up := upstreamtest.New(t)
	s := setup{Upstream: up.URL(), MasterKey: replicaKey, Tool: "e2b", E2B: emu, E2BKey: emu.APIKey(), WorkDir: workDir(t)}
	cfg := s.yaml() + "  max_containers_per_key: 2\n  container_secret: " + replicaSecret + "\nrouter_settings:\n  redis_url: " + rs.URL() + "\n"
	a, b := startProxy(t, cfg), startProxy(t, cfg)

	create := func(p *proxy) answer {
		t.Helper()
		return send(ctx(t, 60*time.Second), p, http.MethodPost, "/v1/containers", "application/json", []byte(`{"name":"q"}`))
	}
	var ids []string
	for _, p := range []*proxy{a, b} {
		got := create(p)
		if got.status != http.StatusOK || got.id == "" {
			t.Fatalf("create = %d %s %v", got.status, got.body, got.err)
		}
		ids = append(ids, got.id)
	}
	for i, p := range []*proxy{a, b} {
		got := create(p)
		if got.status != http.StatusTooManyRequests || gjson.GetBytes(got.body, "error.code").String() != "rate_limit_exceeded" ||
			!strings.Contains(gjson.GetBytes(got.body, "error.message").String(), "max_containers_per_key") {
			t.Errorf("third create, on replica %d = %d %s; want 429 naming max_containers_per_key", i, got.status, got.body)
		}
	}
	if got := send(ctx(t, 60*time.Second), b, http.MethodDelete, "/v1/containers/"+ids[0], "", nil); got.status != http.StatusOK {
		t.Fatalf("delete on the other replica = %d %s", got.status, got.body)
	}
	if got := create(a); got.status != http.StatusOK {
		t.Errorf("create after a delete on the other replica = %d %s; want 200", got.status, got.body)
	} else {
		ids[0] = got.id
	}
	for _, id := range ids {
		if got := send(ctx(t, 60*time.Second), a, http.MethodDelete, "/v1/containers/"+id, "", nil); got.status != http.StatusOK {
			t.Errorf("delete %s = %d %s", id, got.status, got.body)
		}
	}
}

// TestOneKeyUsesTheHost: a client suite of 38 cases against the binary's default quotas, with the
// master key alone, each case leaving its auto container behind as clients of OpenAI do: no 429
// (one key's share of max_containers is all of it), where the per-key default refused the 33rd.
func TestOneKeyUsesTheHost(t *testing.T) {
	if testing.Short() {
		t.Skip("38 local sandboxes: not in -short")
	}
	const cases = 38
	up := upstreamtest.New(t)
	p := startProxy(t, setup{Upstream: up.URL(), MasterKey: replicaKey, Tool: "local", WorkDir: workDir(t)}.yaml())
	code := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", `{"code":"1+1"}`)}}
	done := upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("2")}}
	seen := map[string]bool{}
	for i := range cases {
		up.Enqueue(code, done)
		a := send(ctx(t, 60*time.Second), p, http.MethodPost, "/v1/responses", "application/json", ciRequest("case", "", "", false))
		if a.err != nil || a.status != http.StatusOK || a.container == "" {
			t.Fatalf("case %d = %d %v %.300s", i+1, a.status, a.err, a.body)
		}
		seen[a.container] = true
	}
	if len(seen) != cases {
		t.Errorf("%d cases used %d containers; want one each", cases, len(seen))
	}
}
