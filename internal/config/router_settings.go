package config

import (
	"net/url"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ciproxy/ciproxy/internal/settings"
)

// DefaultStreamIdleTimeout is how long an upstream's body may send nothing, once its headers
// came, before the call is given up: minutes, since a reasoning model may think silently.
const DefaultStreamIdleTimeout = 5 * time.Minute

// deploymentDefaults are the router-wide values each deployment starts from.
type deploymentDefaults struct {
	timeout, streamTimeout time.Duration
	streamIdleTimeout      time.Duration
	numRetries             int // -1: not set
}

// routerSettings reads router_settings, with num_retries and request_timeout of litellm_settings
// (ls) as the fallbacks LiteLLM gives them ("settings on router_settings override those on
// litellm_settings").
func (d *decoder) routerSettings(n *yaml.Node, ls *settings.Map) (Router, deploymentDefaults) {
	const path = "router_settings"
	p := d.section(n, secRouter, path, path, path)
	if p.Has("health_check_interval") {
		d.Errorf(p.KeyLine("health_check_interval"), "%s: health_check_interval belongs in general_settings (LiteLLM refuses it here too)", path)
	}

	def := deploymentDefaults{numRetries: -1}
	def.numRetries = ls.Int("num_retries", def.numRetries, 0)
	def.numRetries = p.Int("num_retries", def.numRetries, 0)
	def.timeout = ls.Duration("request_timeout", 0, false)
	def.timeout = p.Duration("timeout", def.timeout, false)
	def.streamTimeout = p.Duration("stream_timeout", 0, false)
	def.streamIdleTimeout = p.Duration("stream_idle_timeout", DefaultStreamIdleTimeout, true)

	var r Router
	r.Redis = d.redis(p)
	return r, def
}

// redis reads router_settings' Redis server.
func (d *decoder) redis(p *settings.Map) Redis {
	var r Redis
	if u := p.String("redis_url"); u.Present {
		parsed, err := url.Parse(u.S)
		if err != nil || (parsed.Scheme != "redis" && parsed.Scheme != "rediss" && parsed.Scheme != "unix") {
			// The URL may hold a password: the message names the key, never the value.
			d.Errorf(p.ValueLine("redis_url"), "%s: not a redis://, rediss:// or unix:// URL%s", p.Key("redis_url"), u.FromEnv())
		} else {
			r.URL = u.S
		}
	}
	if h := p.String("redis_host"); h.Present {
		r.Host = strings.TrimSpace(h.S)
		if r.Host == "" {
			d.Errorf(p.ValueLine("redis_host"), "%s: must not be empty", p.Key("redis_host"))
		}
	}
	// LiteLLM documents the port as a string; RouterConfig types it as a number. Both are read.
	if v := p.String("redis_port"); v.Present {
		port, err := strconv.Atoi(strings.TrimSpace(v.S))
		if err != nil || port < 1 || port > 65535 {
			d.Errorf(p.ValueLine("redis_port"), "%s: %s is not a port (1 to 65535)", p.Key("redis_port"), v.Shown())
		} else {
			r.Port = port
		}
	}
	if r.Host != "" && r.Port == 0 {
		r.Port = DefaultRedisPort
	}
	if r.Host == "" && r.Port != 0 {
		d.Warnf("router_settings.redis_port is set without redis_host: no Redis server is configured")
		r.Port = 0
	}
	r.Password = p.String("redis_password").S
	r.DB = p.Int("redis_db", 0, 0)
	if r.URL != "" && r.Host != "" {
		d.Warnf("router_settings has both redis_url and redis_host: redis_url is used")
	}
	return r
}
