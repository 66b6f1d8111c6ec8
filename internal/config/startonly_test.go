package config

import (
	"slices"
	"testing"
)

func TestStartOnlyChanges(t *testing.T) {
	base := func() *Config {
		return &Config{
			General: General{DataDir: "/var/lib/ciproxy", AdvertiseURL: "http://10.0.0.1:4000", MasterKey: "sk-1"},
			Router:  Router{Redis: Redis{URL: "redis://r:6379", Host: "r", Port: 6379, Password: "p", DB: 1}},
		}
	}
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"nothing", func(*Config) {}, nil},
		{"only settings that apply live", func(c *Config) { c.General.MasterKey = "sk-2"; c.General.ShutdownGrace = 5 }, nil},
		{"data_dir", func(c *Config) { c.General.DataDir = "/srv/ciproxy" }, []string{"general_settings.data_dir"}},
		{"advertise_url", func(c *Config) { c.General.AdvertiseURL = "" }, []string{"general_settings.advertise_url"}},
		{"every redis setting", func(c *Config) {
			c.Router.Redis = Redis{URL: "redis://s:6379", Host: "s", Port: 6380, Password: "q", DB: 2}
		},
			[]string{"router_settings.redis_url", "router_settings.redis_host", "router_settings.redis_port", "router_settings.redis_password", "router_settings.redis_db"}},
		{"several", func(c *Config) { c.General.DataDir = ""; c.Router.Redis.DB = 0 }, []string{"general_settings.data_dir", "router_settings.redis_db"}},
	} {
		next := base()
		tt.edit(next)
		if got := StartOnlyChanges(base(), next); !slices.Equal(got, tt.want) {
			t.Errorf("%s: StartOnlyChanges = %v; want %v", tt.name, got, tt.want)
		}
	}
}
