package config

import "sync/atomic"

// Store publishes the current *Config. Load is safe for concurrent use; a handler loads once per
// request and keeps that snapshot. Only Watch replaces the config.
type Store struct {
	p atomic.Pointer[Config]
}

// NewStore returns a Store holding c (which may be nil until a first config is known).
func NewStore(c *Config) *Store {
	s := &Store{}
	s.p.Store(c)
	return s
}

// Load returns the current config. The result must not be modified.
func (s *Store) Load() *Config { return s.p.Load() }

// swap publishes c; only the watcher calls it.
func (s *Store) swap(c *Config) { s.p.Store(c) }
