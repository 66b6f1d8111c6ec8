package snapshot

// WaitRetired waits until the retirements started so far are done, so that tests can tell "not
// retired" from "not retired yet".
func (s *Store) WaitRetired() { s.retiring.Wait() }
