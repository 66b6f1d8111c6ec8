package redisserver

import "testing"

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
	s.Stop()
	if err := ping(s.Addr()); err == nil {
		t.Fatal("PING after Stop succeeded; want a refused connection")
	}
	s.Restart()
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
}
