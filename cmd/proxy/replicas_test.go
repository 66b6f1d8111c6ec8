package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/config"
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

// TestReplicaNeedsItsSettings: with Redis, a replica without the shared secret, or listening on
// every address without an advertised one, does not start, and says what to set.
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
	if code, out := run1(redisConfig(up.URL, rs.URL()), "--host", "127.0.0.1"); code != 1 || !strings.Contains(out, "container_secret") {
		t.Errorf("without container_secret = %d %s", code, out)
	}
	if code, out := run1(replicaConfig(up.URL, rs.URL()), "--host", "0.0.0.0"); code != 1 || !strings.Contains(out, "advertise_url") {
		t.Errorf("on 0.0.0.0 without advertise_url = %d %s", code, out)
	}
}
