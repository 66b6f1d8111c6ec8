package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/peer"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// defaultSweepInterval is how often one replica (whichever holds the sweep's claim) looks for the
// containers of replicas that are gone and for sandboxes that no container names.
const defaultSweepInterval = 30 * time.Second

// advertiseURL is the address the other replicas reach this one at: --advertise-url, else
// general_settings.advertise_url, else the listen address when it names one host (a loopback or
// a specific address; 0.0.0.0 names none, so it must then be given: POD_IP in Kubernetes).
func advertiseURL(f flags, cfg *config.Config, listen net.Addr) (string, error) {
	switch {
	case f.advertise != "":
		return f.advertise, nil
	case cfg.General.AdvertiseURL != "":
		return cfg.General.AdvertiseURL, nil
	}
	tcp, ok := listen.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		return "", errors.New("router_settings.redis_* is set, so this replica is one of several, and it listens on every address: " +
			"set general_settings.advertise_url (or --advertise-url) to the http://host:port the other replicas reach it at")
	}
	return "http://" + tcp.String(), nil
}

// deploymentTag is the value every sandbox of this deployment carries in its metadata
// (containers.MetadataDeployment): derived from the replicas' shared secret, so it is the same on
// every replica and across restarts of Redis, differs between deployments, and reveals nothing
// of the secret.
func deploymentTag(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("ciproxy deployment tag"))
	return hex.EncodeToString(m.Sum(nil))[:16]
}

// sweepReplicas runs, every interval until ctx ends, the sweeps one replica does for all of them
// (each claim-locked): the containers of replicas that are gone are expired, and the sandboxes
// tagged for this deployment that no container names are deleted.
func sweepReplicas(ctx context.Context, interval time.Duration, replicas *peer.Peers, st store.Store,
	registry func() *sandbox.Registry, tag string, log *zap.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, _, err := replicas.SweepGone(ctx, interval); err != nil && ctx.Err() == nil {
			log.Warn("expiring the containers of gone replicas", zap.Error(err))
		} else if n > 0 {
			log.Info("containers of gone replicas expired", zap.Int("containers", n))
		}
		_, _, err := containers.SweepOrphans(ctx, containers.OrphanOptions{
			Store: st, Registry: registry, Tag: map[string]string{containers.MetadataDeployment: tag},
			Holder: replicas.Self(), Lease: interval, Logger: log,
		})
		if err != nil && ctx.Err() == nil {
			log.Warn("sweeping orphaned sandboxes", zap.Error(err))
		}
	}
}
