// Command sandboxd is a stand-in for agent-sandbox's sandboxd (packages/sandboxd/cmd/sandboxd):
// the same ProcessService on --grpc-port and files API on --rest-port, both on --listen-host,
// rooted at --root-dir, with commands run as plain child processes in their own process group
// (agentsandboxtest.Sandboxd). It is the process of a sandbox container, as sandboxd is;
// scripts/sandbox-image-test.sh puts it where agent-sandbox's image has sandboxd, to build and
// test deploy/kubernetes/agent-sandbox/Dockerfile without that image. Build it static:
//
//	CGO_ENABLED=0 go build -o sandboxd ./internal/sandbox/agentsandboxtest/cmd/sandboxd
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandboxtest"
)

func main() {
	listenHost := flag.String("listen-host", "0.0.0.0", "host interface to bind the gRPC and REST listeners on")
	grpcPort := flag.Int("grpc-port", 9090, "port for the gRPC ProcessService")
	restPort := flag.Int("rest-port", 8080, "port for the Filesystem & Runtime REST API")
	rootDir := flag.String("root-dir", "/workspace", "sandbox root directory that file operations and working directories are confined to; created if missing")
	shutdownTimeout := flag.Duration("shutdown-timeout", 10*time.Second, "maximum time to wait for in-flight requests and child processes during graceful shutdown")
	flag.Parse()
	if err := run(*listenHost, *grpcPort, *restPort, *rootDir, *shutdownTimeout); err != nil {
		log.Fatalf("sandboxd: %v", err)
	}
}

func run(host string, grpcPort, restPort int, rootDir string, shutdownTimeout time.Duration) error {
	for name, port := range map[string]int{"grpc-port": grpcPort, "rest-port": restPort} {
		if port < 1 || port > 65535 {
			return fmt.Errorf("--%s must be in range 1-65535 (got %d)", name, port)
		}
	}
	if grpcPort == restPort {
		return fmt.Errorf("--grpc-port and --rest-port must differ (both %d)", grpcPort)
	}
	if err := os.MkdirAll(rootDir, 0o755); err != nil {
		return fmt.Errorf("root dir %q: %w", rootDir, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	d := agentsandboxtest.NewSandboxd(rootDir, os.Environ())
	grpcAddr := net.JoinHostPort(host, strconv.Itoa(grpcPort))
	restAddr := net.JoinHostPort(host, strconv.Itoa(restPort))
	grpcLis, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return fmt.Errorf("listen grpc %q: %w", grpcAddr, err)
	}
	restLis, err := net.Listen("tcp", restAddr)
	if err != nil {
		_ = grpcLis.Close()
		return fmt.Errorf("listen rest %q: %w", restAddr, err)
	}
	gs := grpc.NewServer()
	d.RegisterGRPC(gs)
	reflection.Register(gs)
	hs := &http.Server{Handler: d.RESTHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second}

	errs := make(chan error, 2)
	go func() {
		if err := gs.Serve(grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errs <- fmt.Errorf("grpc server: %w", err)
		}
	}()
	go func() {
		if err := hs.Serve(restLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("rest server: %w", err)
		}
	}()
	log.Printf("sandboxd (agentsandboxtest stand-in) listening: grpc %s, rest %s, root %s", grpcLis.Addr(), restLis.Addr(), rootDir)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errs:
	}
	log.Printf("sandboxd: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	// Ending the commands closes their Start streams, which lets GracefulStop complete.
	d.ShutdownProcesses(sctx)
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	var once sync.Once
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		once.Do(func() { close(stopped) })
	}()
	select {
	case <-stopped:
	case <-sctx.Done():
		gs.Stop()
		<-stopped
	}
	return serveErr
}
