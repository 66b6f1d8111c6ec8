package snapshot

// WaitRetired waits until the retirements started so far are done, so that tests can tell "not
// retired" from "not retired yet".
func (s *Current) WaitRetired() { s.retiring.Wait() }
