// Package redisserver starts a real redis-server for tests: Debian's package, on a free loopback
// port, with persistence off, stopped when the test ends. Tests that need it call Start, which
// skips the test with a message when redis-server is not installed (scripts/deps.sh installs it).
package redisserver

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is one redis-server process. Its methods are safe for concurrent use.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu     sync.Mutex
	proc   *os.Process // nil while stopped
	exited chan error  // receives the process's end
}

// Start runs a redis-server on a free port and returns once it answers PING. It is stopped by
// t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (scripts/deps.sh installs Debian's redis-server)")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	var lastErr error
	for range 5 { // a free port can be taken between choosing it and redis binding it
		if s.port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("starting redis-server: %v", lastErr)
	return nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Stop kills the server (as a crash would: no save, connections cut). Stopping a stopped server
// does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Kill()
	<-s.exited
	s.proc = nil
}

// Restart stops the server and starts a new, empty one on the same port, as a Redis restart
// without persistence looks to its clients.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.start()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("restarting redis-server: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // the port may linger briefly after the kill
	}
}

// start runs the process and waits until it answers PING.
func (s *Server) start() error {
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited: %v", err)
		default:
		}
		if ping(s.Addr()) == nil {
			s.mu.Lock()
			s.proc, s.exited = cmd.Process, exited
			s.mu.Unlock()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("redis-server on port %d did not answer PING", s.port)
}

// ping sends PING in RESP and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// freePort returns a loopback port nothing listens on right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
