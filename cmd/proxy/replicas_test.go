package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/peer"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

func TestAdvertiseURL(t *testing.T) {
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4000}
	specific := &net.TCPAddr{IP: net.ParseIP("10.0.0.5"), Port: 4000}
	every := &net.TCPAddr{IP: net.IPv4zero, Port: 4000}
	withConfig := &config.Config{General: config.General{AdvertiseURL: "http://10.9.9.9:4000"}}
	cases := []struct {
		name   string
		flag   string
		cfg    *config.Config
		listen net.Addr
		want   string // "" for an error
	}{
		{"the flag first", "http://flag:1", withConfig, every, "http://flag:1"},
		{"then the config", "", withConfig, every, "http://10.9.9.9:4000"},
		{"then a loopback listen address", "", &config.Config{}, loopback, "http://127.0.0.1:4000"},
		{"or a specific one", "", &config.Config{}, specific, "http://10.0.0.5:4000"},
		{"every address names none", "", &config.Config{}, every, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := advertiseURL(flags{advertise: tc.flag}, tc.cfg, tc.listen)
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), "advertise_url") {
					t.Errorf("= %q, %v; want an error naming advertise_url", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("= %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := parseFlags([]string{"--config", "c.yaml", "--advertise-url", "10.0.0.5:4000"}, io.Discard); err == nil {
		t.Error("a bad --advertise-url was accepted")
	}
	if _, err := parseFlags([]string{"--config", "c.yaml", "--sweep-interval", "0s"}, io.Discard); err == nil {
		t.Error("--sweep-interval 0 was accepted")
	}
}

func TestDeploymentTag(t *testing.T) {
	a, b := deploymentTag("one secret"), deploymentTag("another")
	if a == b || len(a) != 16 || a != deploymentTag("one secret") || strings.Contains(a, "secret") {
		t.Errorf("tags %q, %q", a, b)
	}
}

// TestReplicaNeedsItsSettings: with Redis, a replica listening on every address without an
// advertised one does not start, and says what to set.
func TestReplicaNeedsItsSettings(t *testing.T) {
	rs := redisserver.Start(t)
	up := newUpstreamServer(t)
	run1 := func(cfg string, args ...string) (int, string) {
		path := writeConfig(t, t.TempDir(), cfg)
		var stderr testutil.LockedBuffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		code := runOwnDir(t, ctx, append([]string{"--config", path, "--port", "0"}, args...), io.Discard, &stderr,
			func(net.Addr) { t.Error("a replica without its settings started"); cancel() })
		return code, stderr.String()
	}
	if code, out := run1(replicaConfig(up.URL, rs.URL()), "--host", "0.0.0.0"); code != 1 || !strings.Contains(out, "advertise_url") {
		t.Errorf("on 0.0.0.0 without advertise_url = %d %s", code, out)
	}
}

// TestReplicasAgreeOnASecret: replicas sharing Redis whose configuration sets no container_secret
// start, and answer each other's probes with the one secret the first of them stored in Redis; a
// replica with an explicit container_secret uses its own; no log line holds either.
func TestReplicasAgreeOnASecret(t *testing.T) {
	rs := redisserver.Start(t)
	up := newUpstreamServer(t)
	dir := t.TempDir()
	agreeing := writeConfig(t, dir, redisConfig(up.URL, rs.URL()))
	a := start(t, "--config", agreeing)
	b := start(t, "--config", agreeing)
	explicit := start(t, "--config", writeConfig(t, t.TempDir(), replicaConfig(up.URL, rs.URL())))

	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	secret, err := rdb.Get(context.Background(), redisstore.DefaultPrefix+"secret").Result()
	if err != nil || len(secret) < 32 {
		t.Fatalf("the secret in Redis = %q, %v", secret, err)
	}
	probe := func(r *running) string {
		req, _ := http.NewRequest(http.MethodGet, r.url+"/healthz", nil)
		req.Header.Set(peer.HeaderProbe, "nonce-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get(peer.HeaderPeer)
	}
	for _, r := range []*running{a, b} {
		if got := probe(r); got == "" || got != peer.ProbeAnswer(secret, r.url, "nonce-1") {
			t.Errorf("%s answers a probe with %q; want the answer under the secret in Redis", r.url, got)
		}
	}
	if got := probe(explicit); got != peer.ProbeAnswer("replicas-share-this", explicit.url, "nonce-1") {
		t.Errorf("the replica with container_secret answers %q; want the answer under its own secret", got)
	}
	// A reloaded file that still sets none keeps the agreed secret.
	writeConfig(t, dir, strings.Replace(redisConfig(up.URL, rs.URL()), configYAML(up.URL, "gpt-a"), configYAML(up.URL, "gpt-a", "gpt-b"), 1))
	testutil.Eventually(t, "gpt-b is served after the reload", func() bool {
		status, _, _ := a.post("gpt-b", "")
		return status == http.StatusOK
	})
	if got := probe(a); got != peer.ProbeAnswer(secret, a.url, "nonce-1") {
		t.Errorf("after a reload %s answers a probe with %q; want the answer under the secret in Redis", a.url, got)
	}
	for _, r := range []*running{a, b, explicit} {
		if out := r.stderr.String(); strings.Contains(out, secret) || strings.Contains(out, "replicas-share-this") {
			t.Errorf("%s logged a secret: %s", r.url, out)
		}
	}
}
