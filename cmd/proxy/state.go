package main

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/router"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
)

// openStore opens the proxy's state store: the Redis server of router_settings when one is
// configured (so that replicas share everything), else the embedded store in --data-dir, else
// general_settings.data_dir, else the default directory. It is chosen once: a change by a reload
// applies at the next start.
//
// A Redis that cannot be reached at start is an error, and the proxy exits: a replica that came up
// without it could serve nothing that needs state, and an orchestrator restarting it (with its
// back-off) is what brings it up once Redis answers. Once started, a Redis lost is survived: what
// needs it fails with 503 until it is back, and /readyz says so.
func openStore(ctx context.Context, f flags, cfg *config.Config, log *zap.Logger) (store.Store, error) {
	if r := cfg.Router.Redis; r.Configured() {
		// go-redis logs on its own (pool and connection troubles): through zap at debug level, never
		// to stderr raw. Every failure that matters reaches the caller as an error, which is logged
		// where it is handled; at warn, an outage would log each failed dial twice. Its lines name
		// addresses, never the password or the URL.
		redis.SetLogger(redisLogger{log.Named("redis")})
		st, err := redisstore.Open(ctx, redisstore.Options{URL: r.URL, Addr: r.Addr(), Password: r.Password, DB: r.DB})
		if err != nil {
			// The error names the address, never the password or the URL (which may hold it).
			return nil, fmt.Errorf("state store: router_settings.redis_*: %w", err)
		}
		log.Info("state store: Redis", zap.String("addr", redisAddr(r)))
		return st, nil
	}
	dir := f.dataDir
	if dir == "" {
		dir = cfg.General.DataDir
	}
	if dir == "" {
		var err error
		if dir, err = embedded.DefaultDir(); err != nil {
			return nil, err
		}
	}
	st, err := embedded.Open(embedded.Options{Dir: dir, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	log.Info("state store: data directory", zap.String("dir", st.Dir()))
	return st, nil
}

// redisAddr is where r points, for the log: host and port only, never credentials.
func redisAddr(r config.Redis) string {
	if r.URL == "" {
		return r.Addr()
	}
	u, err := url.Parse(r.URL)
	if err != nil {
		return "(redis_url)"
	}
	if u.Scheme == "unix" {
		return u.Path
	}
	return u.Host
}

// redisLogger routes go-redis's own log lines to zap, at debug level.
type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	if ce := l.log.Check(zap.DebugLevel, ""); ce != nil {
		ce.Message = fmt.Sprintf(format, v...)
		ce.Write()
	}
}

// pinger is a store that can say whether its backing service answers (the Redis store).
type pinger interface {
	Ping(ctx context.Context) error
}

// readyPingTimeout bounds the store check of one /readyz; readyPingEvery is how long its outcome
// is reused, so that probes (or anyone: /readyz is open) cost Redis at most one PING a second.
const (
	readyPingTimeout = time.Second
	readyPingEvery   = time.Second
)

// readiness is /readyz's check: not ready while shutting down; degraded, but ready, while the
// state store cannot be reached. Redis down is every replica's fault at once: were it to make
// them all unready, a load balancer would send nothing anywhere, and pass-through, which needs
// no state, would stop with the rest.
func readiness(draining *atomic.Bool, st store.Store) func(context.Context) router.Readiness {
	p, _ := st.(pinger)
	var mu sync.Mutex
	var last time.Time
	var degraded string
	return func(ctx context.Context) router.Readiness {
		if draining.Load() {
			return router.Readiness{NotReady: "shutting down"}
		}
		if p == nil {
			return router.Readiness{}
		}
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); now.Sub(last) >= readyPingEvery {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyPingTimeout)
			err := p.Ping(pctx)
			cancel()
			last, degraded = now, ""
			if err != nil {
				degraded = "the state store (Redis) cannot be reached"
			}
		}
		return router.Readiness{Degraded: degraded}
	}
}
