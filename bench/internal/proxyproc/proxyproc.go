// Package proxyproc runs the real proxy binary for the benchmark programs: start it on a free
// loopback port, learn its address from its "listening" log line, stop it with SIGTERM; plus the
// small figures every program prints.
package proxyproc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proxy is one running proxy process.
type Proxy struct {
	Cmd    *exec.Cmd
	Base   string       // http://127.0.0.1:port
	Client *http.Client // for requests to it; its idle connections are closed by Stop

	done chan error
	once sync.Once
	err  error
}

// Start runs bin with args and --host 127.0.0.1 --port 0, copies its log to logPath, and returns
// once the process logs that it listens. client is used for requests to it.
func Start(bin string, args []string, logPath string, client *http.Client) (*Proxy, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append(args, "--host", "127.0.0.1", "--port", "0")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proxy{Cmd: cmd, Client: client, done: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logf.Write(append(line, '\n'))
			var v struct{ Msg, Addr string }
			if json.Unmarshal(line, &v) == nil && v.Msg == "listening" {
				select {
				case addr <- v.Addr:
				default:
				}
			}
		}
		_ = logf.Close()
		p.done <- cmd.Wait()
	}()
	select {
	case a := <-addr:
		p.Base = "http://" + a
		return p, nil
	case err := <-p.done:
		return nil, fmt.Errorf("proxy exited before listening (%v); log: %s", err, logPath)
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("proxy did not listen within 30s; log: %s", logPath)
	}
}

// Stop sends SIGTERM and waits for a clean exit (60 s at most); later calls return the same.
func (p *Proxy) Stop() error {
	p.once.Do(func() {
		p.Client.CloseIdleConnections()
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.done:
			if err != nil {
				p.err = fmt.Errorf("proxy exit: %w", err)
			}
		case <-time.After(60 * time.Second):
			_ = p.Cmd.Process.Kill()
			p.err = errors.New("proxy did not stop within 60s of SIGTERM")
		}
	})
	return p.err
}

// Percentiles returns p50, p90 and p99 of d in milliseconds.
func Percentiles(d []time.Duration) [3]float64 {
	if len(d) == 0 {
		return [3]float64{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) float64 { return float64(s[int(q*float64(len(s)-1))]) / float64(time.Millisecond) }
	return [3]float64{at(.5), at(.9), at(.99)}
}

// CPUs is the number of processors the machine reports.
func CPUs() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}
