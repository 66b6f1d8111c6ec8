package config

// StartOnlyChanges names, as the file spells them, the settings that the process reads only when
// it starts and that differ between started (the configuration it started with) and next: a
// reload publishes everything else, and these apply at the next start. They are where the
// proxy's state lives (data_dir, the Redis settings) and the address other replicas reach it by
// (advertise_url).
func StartOnlyChanges(started, next *Config) []string {
	var changed []string
	check := func(name string, differ bool) {
		if differ {
			changed = append(changed, name)
		}
	}
	check("general_settings.data_dir", started.General.DataDir != next.General.DataDir)
	check("general_settings.advertise_url", started.General.AdvertiseURL != next.General.AdvertiseURL)
	a, b := started.Router.Redis, next.Router.Redis
	check("router_settings.redis_url", a.URL != b.URL)
	check("router_settings.redis_host", a.Host != b.Host)
	check("router_settings.redis_port", a.Port != b.Port)
	check("router_settings.redis_password", a.Password != b.Password)
	check("router_settings.redis_db", a.DB != b.DB)
	return changed
}
