package router

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/peer"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// namedInterceptor takes every request and answers with its replica's name and the caller; input
// "stream" is answered as three server-sent events.
type namedInterceptor struct {
	name string
	eng  *intercept.Engine // plans the requests; nil: plans name no container
}

func (n namedInterceptor) Prepare(ctx context.Context, req *intercept.Request) (*intercept.Plan, error) {
	return planned(ctx, n.eng, req, true, n.Minted)
}

func (n namedInterceptor) Serve(w http.ResponseWriter, r *http.Request, plan *intercept.Plan) error {
	req := plan.Request
	if strings.Contains(string(req.Body), `"input":"stream"`) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"served_by\":%q,\"n\":%d}\n\n", n.name, i)
			w.(http.Flusher).Flush()
		}
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"served_by":%q,"caller":%q,"forwarded":%v}`, n.name, req.Caller, forwarded(r.Context()))
	return nil
}

func (namedInterceptor) Minted(context.Context, string) (bool, error) { return false, nil }
func (namedInterceptor) ServeStored(http.ResponseWriter, *http.Request, string, string) error {
	return nil
}
func (namedInterceptor) ServeInputItems(http.ResponseWriter, *http.Request, string, string) error {
	return nil
}
func (namedInterceptor) ServeCancel(http.ResponseWriter, *http.Request, string, string) error {
	return nil
}

// replica is one router with its own address, sharing a store with the others.
type replica struct {
	*httptest.Server
	peers *peer.Peers
	logs  *observer.ObservedLogs
}

const forwardSecret = "shared-between-replicas"

func newReplica(t *testing.T, st store.Store, name string, expire func(context.Context, store.Container) error) *replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	p, err := peer.New(peer.Options{Store: st, Self: "http://" + ln.Addr().String(), Expire: expire, Logger: log,
		Secret: func() string { return forwardSecret }})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("http://127.0.0.1:1/v1", func(c *config.Config) { c.General.ContainerSecret = forwardSecret })
	h := New(Options{
		Store:       snapshot.Fixed(&snapshot.Snapshot{Config: cfg}),
		Client:      upstream.NewClient(upstream.ClientOptions{Logger: log}),
		Balancer:    upstream.NewBalancer(),
		Interceptor: namedInterceptor{name: name, eng: intercept.New(intercept.Options{Store: st})},
		Replicas:    p,
		Logger:      log,
	})
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return &replica{Server: srv, peers: p, logs: logs}
}

func (rp *replica) post(t *testing.T, path, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, rp.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer abc")
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestForwarding: a request for a container that another replica hosts is served there, whatever
// names the container; the client cannot tell; a forwarded request is never forwarded again; a
// host found gone has its container expired and the request is served where it landed.
func TestForwarding(t *testing.T) {
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	var mu sync.Mutex
	var expired []string
	expire := func(ctx context.Context, rec store.Container) error {
		mu.Lock()
		expired = append(expired, rec.ID)
		mu.Unlock()
		rec.Status, rec.ExpiresAt, rec.ForgetAt = "expired", time.Time{}, time.Now().Add(time.Hour)
		_, err := st.UpdateContainer(ctx, rec)
		return err
	}
	a := newReplica(t, st, "a", expire)
	b := newReplica(t, st, "b", expire)
	const caller = "ba7816bf8f01cfea414140de5dae2223" // the caller of "Bearer abc"
	hosted := func(host string) string {
		t.Helper()
		c, err := st.CreateContainer(ctx, store.Container{Owner: caller, Backend: "local", Tool: "local", Host: host,
			Status: "running", ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	onB := hosted(b.peers.Self())
	onA := hosted(a.peers.Self())
	if err := st.PutResponse(ctx, store.Response{ID: "resp_prev", Owner: caller, UpstreamID: "resp_upstream", ContainerID: onB}, nil); err != nil {
		t.Fatal(err)
	}
	tool := func(container string) string {
		return `"tools":[{"type":"code_interpreter","container":"` + container + `"}]`
	}
	cases := []struct {
		name, body, want string
	}{
		{"explicit container on b", `{"model":"gpt-test","input":"x",` + tool(onB) + `}`, `"served_by":"b"`},
		{"explicit container on a", `{"model":"gpt-test","input":"x",` + tool(onA) + `}`, `"served_by":"a"`},
		{"previous response's container", `{"model":"gpt-test","input":"x","previous_response_id":"resp_prev","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, `"served_by":"b"`},
		{"a replayed call's container", `{"model":"gpt-test","input":[{"type":"code_interpreter_call","id":"ci_1","container_id":"` + onB + `","code":"1"}],"tools":[{"type":"code_interpreter"}]}`, `"served_by":"b"`},
		{"the conversation's latest container", `{"model":"gpt-test","previous_response_id":"resp_prev","input":[{"type":"code_interpreter_call","id":"ci_2","container_id":"` + onA + `","code":"1"}],"tools":[{"type":"code_interpreter"}]}`, `"served_by":"a"`},
		{"the latest live one", `{"model":"gpt-test","previous_response_id":"resp_prev","input":[{"type":"code_interpreter_call","id":"ci_3","container_id":"cntr_` + strings.Repeat("0", 48) + `","code":"1"}],"tools":[{"type":"code_interpreter"}]}`, `"served_by":"b"`},
		{"no container named", `{"model":"gpt-test","input":"x","tools":[{"type":"code_interpreter"}]}`, `"served_by":"a"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := a.post(t, "/v1/responses", tc.body)
			if status != http.StatusOK || !strings.Contains(body, tc.want) || !strings.Contains(body, `"caller":"`+caller+`"`) {
				t.Errorf("= %d %s; want %s", status, body, tc.want)
			}
			if ids := hdr.Values(RequestIDHeader); len(ids) != 1 {
				t.Errorf("X-Request-Id = %q; want one", ids)
			}
		})
	}

	t.Run("streaming comes through", func(t *testing.T) {
		status, hdr, body := a.post(t, "/v1/responses", `{"model":"gpt-test","input":"stream",`+tool(onB)+`}`)
		if status != http.StatusOK || hdr.Get("Content-Type") != "text/event-stream" || strings.Count(body, `"served_by":"b"`) != 3 {
			t.Errorf("= %d %v %q", status, hdr, body)
		}
	})

	t.Run("the request id is kept", func(t *testing.T) {
		_, hdr, _ := a.post(t, "/v1/responses", `{"model":"gpt-test","input":"x",`+tool(onB)+`}`, RequestIDHeader, "req_from_client")
		if hdr.Get(RequestIDHeader) != "req_from_client" {
			t.Errorf("X-Request-Id = %q", hdr.Get(RequestIDHeader))
		}
		found := false
		for _, e := range b.logs.FilterMessage("request").All() {
			if e.ContextMap()["request_id"] == "req_from_client" {
				found = true
			}
		}
		if !found {
			t.Error("b did not log the request under the client's id")
		}
	})

	t.Run("a forwarded request is served where it arrives", func(t *testing.T) {
		sig := peer.Sign(forwardSecret, http.MethodPost, "/v1/responses", time.Now())
		status, _, body := b.post(t, "/v1/responses", `{"model":"gpt-test","input":"x",`+tool(onA)+`}`, peer.HeaderForwarded, sig)
		if status != http.StatusOK || !strings.Contains(body, `"served_by":"b"`) || !strings.Contains(body, `"forwarded":true`) {
			t.Errorf("= %d %s; want b to serve it", status, body)
		}
	})

	t.Run("a bad signature is refused", func(t *testing.T) {
		for _, sig := range []string{
			"t=1,v1=00",
			peer.Sign("another secret", http.MethodPost, "/v1/responses", time.Now()),
			peer.Sign(forwardSecret, http.MethodPost, "/v1/other", time.Now()),
		} {
			status, _, body := b.post(t, "/v1/responses", `{"model":"gpt-test","input":"x"}`, peer.HeaderForwarded, sig)
			if _, _, _, code := decodeError(t, []byte(body)); status != http.StatusUnauthorized || code != "invalid_forwarding" {
				t.Errorf("%s = %d %s; want 401", sig, status, body)
			}
		}
	})

	t.Run("containers API requests follow their container", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, a.URL+"/v1/containers/"+onB+"/files?limit=2", nil)
		req.Header.Set("Authorization", "Bearer abc")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		served := false
		for _, e := range b.logs.FilterMessage("request").All() {
			if e.ContextMap()["path"] == "/v1/containers/"+onB+"/files" {
				served = true
			}
		}
		if !served {
			t.Errorf("b did not serve the container's request (%d)", resp.StatusCode)
		}
	})

	t.Run("a replica without its lease that proves it is one is alive", func(t *testing.T) {
		if err := st.Release(ctx, "peer:"+b.peers.Self(), b.peers.Self()); err != nil {
			t.Fatal(err)
		}
		status, _, body := a.post(t, "/v1/responses", `{"model":"gpt-test","input":"x",`+tool(onB)+`}`)
		if status != http.StatusOK || !strings.Contains(body, `"served_by":"b"`) {
			t.Errorf("= %d %s; want b to serve it", status, body)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(expired) != 0 {
			t.Errorf("expired %v while its replica lived", expired)
		}
	})

	t.Run("a replica that is gone", func(t *testing.T) {
		if err := b.peers.Register(ctx); err != nil {
			t.Fatal(err)
		}
		b.Close() // nothing listens at its address any more; its lease is still held
		status, _, body := a.post(t, "/v1/responses", `{"model":"gpt-test","input":"x",`+tool(onB)+`}`)
		if status != http.StatusOK || !strings.Contains(body, `"served_by":"a"`) {
			t.Errorf("= %d %s; want a to serve it", status, body)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(expired) != 1 || expired[0] != onB {
			t.Errorf("expired %v; want %s", expired, onB)
		}
		if alive, _ := a.peers.Alive(ctx, b.peers.Self()); alive {
			t.Error("the gone replica's lease was not ended")
		}
	})

	t.Run("a replica that cannot be reached", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		}()
		host := "http://" + ln.Addr().String()
		if ok, err := st.Claim(ctx, "peer:"+host, host, time.Minute); !ok || err != nil {
			t.Fatal(ok, err)
		}
		id := hosted(host)
		status, _, body := a.post(t, "/v1/responses", `{"model":"gpt-test","input":"x",`+tool(id)+`}`)
		if _, _, _, code := decodeError(t, []byte(body)); status != http.StatusServiceUnavailable || code != "replica_unavailable" {
			t.Errorf("= %d %s; want 503 replica_unavailable", status, body)
		}
	})
}

// TestProbeOnlyOnHealth: a replica proves it is one of the deployment's (peer.HeaderProbe) on GET
// /healthz, the route another replica's probe asks, and on no other: anyone may send a probe, and
// an HMAC of any nonce is not to be had from every route.
func TestProbeOnlyOnHealth(t *testing.T) {
	st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	a := newReplica(t, st, "a", nil)
	b := newReplica(t, st, "b", nil)
	const nonce = "0123456789abcdef"
	want := peer.ProbeAnswer(forwardSecret, b.peers.Self(), nonce)
	for _, tc := range []struct {
		method, path string
		answers      bool
	}{
		{http.MethodGet, "/healthz", true},
		{http.MethodGet, "/readyz", false},
		{http.MethodGet, "/v1/models", false},
		{http.MethodGet, "/metrics", false},
		{http.MethodPost, "/v1/responses", false},
		{http.MethodGet, "/v1/responses/resp_1", false},
		{http.MethodGet, "/nowhere", false},
	} {
		req, _ := http.NewRequest(tc.method, b.URL+tc.path, strings.NewReader(`{"model":"gpt-test","input":"x"}`))
		req.Header.Set(peer.HeaderProbe, nonce)
		req.Header.Set("Authorization", "Bearer abc")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch got := resp.Header.Get(peer.HeaderPeer); {
		case tc.answers && got != want:
			t.Errorf("%s %s: %s = %q; want the proof %q", tc.method, tc.path, peer.HeaderPeer, got, want)
		case !tc.answers && got != "":
			t.Errorf("%s %s answered the probe (%s: %q); only GET /healthz may", tc.method, tc.path, peer.HeaderPeer, got)
		}
	}
	// And the probe still works between replicas: without its lease, b is alive by its proof.
	if err := st.Release(context.Background(), "peer:"+b.peers.Self(), b.peers.Self()); err != nil {
		t.Fatal(err)
	}
	if alive, err := a.peers.Alive(context.Background(), b.peers.Self()); err != nil || !alive {
		t.Errorf("Alive(b) without its lease = %v, %v; want true by the probe", alive, err)
	}
}
