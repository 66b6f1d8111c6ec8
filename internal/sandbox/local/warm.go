package local

// Warm reports how many started kernels wait in the warm pool: containers.Manager counts them in
// the total of containers (general_settings.max_containers).
func (p *Provider) Warm() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pool)
}
