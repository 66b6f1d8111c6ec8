// Package peer is what the replicas of one deployment know of each other, through the store they
// share: each one's lease (its advertised address, renewed by a heartbeat), where a container whose
// sandbox lives in one replica's process (a local sandbox) is served, and the forwarding of a
// request to that replica, authenticated by the deployment's shared secret and streamed through.
//
// A replica is alive while its lease is held, or while it answers a probe at its address with
// proof that it knows the shared secret (a lease can be missing while the replica lives: after the
// store lost its keys, until the next heartbeat). One that is gone (no lease, and no proof at its
// address) has lost its local sandboxes with its process: their containers are expired
// (Options.Expire), and requests for them are answered where they land, as for any expired
// container.
package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/store"
)

// DefaultLease is how long a replica's lease lasts without a heartbeat: how long a replica killed
// without a goodbye still looks alive. Heartbeats come every third of it.
const DefaultLease = 10 * time.Second

// statusExpired is the container status of an expired record (containers.StatusExpired): such a
// container is served nowhere.
const statusExpired = "expired"

// leaseKey is the claim that holds replica self's lease. Its holder is the address itself, so a
// replica restarted at the same address takes its lease over at once, and a replica that finds
// nothing listening at an address can end the lease for everyone.
func leaseKey(self string) string { return "peer:" + self }

// Options configure New.
type Options struct {
	// Store is the store the replicas share. Required.
	Store store.Store
	// Self is this replica's advertised address (http://host:port), the Host of the containers
	// whose sandboxes live in this process. Required.
	Self string
	// Lease is DefaultLease when zero.
	Lease time.Duration
	// Expire marks a container expired whose host is gone (containers.Manager.Expire). Nil: nothing
	// is expired here, and the request is served here anyway.
	Expire func(ctx context.Context, rec store.Container) error
	// Secret returns the deployment's shared secret now (it may change with a reload), for probes.
	// Nil, or "": a replica without a lease is gone.
	Secret func() string
	Logger *zap.Logger
}

// Peers is this replica among the others. It is safe for concurrent use.
type Peers struct {
	st     store.Store
	self   string
	lease  time.Duration
	expire func(context.Context, store.Container) error
	secret func() string
	log    *zap.Logger
	fwd    *forwarder
}

// New returns the Peers of replica opts.Self. Register (and Run) make it visible to the others.
func New(opts Options) (*Peers, error) {
	if opts.Store == nil || opts.Self == "" {
		return nil, errors.New("peer: Store and Self are required")
	}
	p := &Peers{st: opts.Store, self: opts.Self, lease: opts.Lease, expire: opts.Expire, secret: opts.Secret, log: opts.Logger}
	if p.lease <= 0 {
		p.lease = DefaultLease
	}
	if p.log == nil {
		p.log = zap.NewNop()
	}
	p.fwd = newForwarder(p.log)
	return p, nil
}

// Self is this replica's advertised address.
func (p *Peers) Self() string { return p.self }

// Register takes or renews this replica's lease.
func (p *Peers) Register(ctx context.Context) error {
	ok, err := p.st.Claim(ctx, leaseKey(p.self), p.self, p.lease)
	if err != nil {
		return fmt.Errorf("peer: registering %s: %w", p.self, err)
	}
	if !ok {
		// The holder of an address's lease is the address: only a bug gets here.
		return fmt.Errorf("peer: the lease of %s is held by someone else", p.self)
	}
	return nil
}

// Run renews the lease every third of its length (every second after a failure, so that a store
// back from an outage sees the replica again at once) until ctx ends, then ends it, so that the
// others stop forwarding here.
func (p *Peers) Run(ctx context.Context) {
	every := p.lease / 3
	t := time.NewTimer(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := p.st.Release(rctx, leaseKey(p.self), p.self); err != nil {
				p.log.Warn("ending this replica's lease", zap.Error(err))
			}
			cancel()
			return
		case <-t.C:
		}
		err := p.Register(ctx)
		switch {
		case err != nil && !failing:
			p.log.Warn("renewing this replica's lease failed; the others see it gone once it runs out", zap.Error(err))
		case err == nil && failing:
			p.log.Info("this replica's lease is renewed again")
		}
		failing = err != nil
		if failing {
			t.Reset(min(time.Second, every))
		} else {
			t.Reset(every)
		}
	}
}

// Alive reports whether the replica at host holds its lease or, without one, proves at its
// address that it is one of this deployment's replicas.
func (p *Peers) Alive(ctx context.Context, host string) (bool, error) {
	if host == p.self {
		return true, nil
	}
	h, err := p.st.Holder(ctx, leaseKey(host))
	if err != nil {
		return false, fmt.Errorf("peer: reading the lease of %s: %w", host, err)
	}
	return h != "" || p.probe(ctx, host), nil
}

// gone ends the lease of host, where nothing listens any more, so that every replica sees it gone
// now rather than when the lease runs out.
func (p *Peers) gone(ctx context.Context, host string) {
	if err := p.st.Release(ctx, leaseKey(host), host); err != nil {
		p.log.Warn("ending the lease of a replica that is gone", zap.String("replica", host), zap.Error(err))
	}
}

// Host returns where owner's container id is served: host "" for this replica (the container
// is reachable from every replica, or hosted here). live is false when the container cannot be
// used anywhere: id is not a container id, or names one that is unknown, another owner's, or
// expired, or whose host is gone (it is expired first). Which container a request uses is the
// caller's to decide (intercept.Plan.Container asks live of each one it considers).
func (p *Peers) Host(ctx context.Context, owner, id string) (host string, live bool, err error) {
	if !store.ContainerKind.Valid(id) {
		return "", false, nil
	}
	rec, err := p.st.Container(ctx, owner, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	if rec.Status == statusExpired {
		return "", false, nil
	}
	if rec.Host == "" || rec.Host == p.self {
		return "", true, nil
	}
	alive, err := p.Alive(ctx, rec.Host)
	if err != nil || alive {
		return rec.Host, err == nil, err
	}
	p.expireGone(ctx, rec)
	return "", false, nil
}

// ContainerHost returns the replica that must serve owner's container id: "" for this one (also
// when the container cannot be used anywhere: it is answered here).
func (p *Peers) ContainerHost(ctx context.Context, owner, id string) (string, error) {
	host, _, err := p.Host(ctx, owner, id)
	return host, err
}

// expireGone expires a container whose host is gone.
func (p *Peers) expireGone(ctx context.Context, rec store.Container) {
	if p.expire == nil {
		return
	}
	if err := p.expire(ctx, rec); err != nil {
		p.log.Warn("expiring a container whose replica is gone", zap.String("container", rec.ID),
			zap.String("replica", rec.Host), zap.Error(err))
		return
	}
	p.log.Info("container expired: the replica that hosted it is gone", zap.String("container", rec.ID),
		zap.String("replica", rec.Host))
}

// hostsClaim makes one replica at a time sweep the containers of gone replicas.
const hostsClaim = "sweep:hosts"

// SweepGone expires, if it wins the sweep's claim, the live containers of every replica that is
// gone, so that they show as expired even if nobody asks for them. It returns how many it expired;
// false when another replica holds the claim.
func (p *Peers) SweepGone(ctx context.Context, lease time.Duration) (int, bool, error) {
	won, err := p.st.Claim(ctx, hostsClaim, p.self, lease)
	if err != nil || !won {
		return 0, false, err
	}
	recs, err := p.st.ExpiringContainers(ctx, time.Now().AddDate(100, 0, 0), 0)
	if err != nil {
		return 0, true, err
	}
	alive := map[string]bool{}
	n := 0
	for _, rec := range recs {
		if rec.Host == "" || rec.Host == p.self || rec.Status == statusExpired || p.expire == nil {
			continue
		}
		ok, known := alive[rec.Host]
		if !known {
			if ok, err = p.Alive(ctx, rec.Host); err != nil {
				return n, true, err
			}
			alive[rec.Host] = ok
		}
		if !ok {
			p.expireGone(ctx, rec)
			n++
		}
	}
	return n, true, nil
}
