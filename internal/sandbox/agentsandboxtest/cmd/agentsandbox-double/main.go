// Command agentsandbox-double serves the agentsandboxtest double (an API server with
// agent-sandbox's resources and controllers, bwrap pods running a sandboxd double, optionally a
// sandbox-router) and prints the settings an agent_sandbox sandbox tool needs, as YAML, on
// stdout. It serves until interrupted, then kills every pod. It must run as root.
//
//	go run ./internal/sandbox/agentsandboxtest/cmd/agentsandbox-double -dir /tmp/asd -router
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandboxtest"
	"github.com/ciproxy/ciproxy/internal/sandbox/kernel"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	stop := make(chan struct{})
	go func() {
		<-sig
		close(stop)
	}()
	if err := run(os.Args[1:], os.Stdout, stop); err != nil {
		log.Fatal(err)
	}
}

// run serves the double with the command line's flags, writes the settings to out, and serves
// until stop is closed.
func run(args []string, out io.Writer, stop <-chan struct{}) error {
	flag := flag.NewFlagSet("agentsandbox-double", flag.ContinueOnError)
	dir := flag.String("dir", "", "directory for the kubeconfig and the pods (default: a new temporary directory)")
	ns := flag.String("namespace", "default", "namespace of the template, the pool and the claims")
	tmpl := flag.String("template", "ciproxy-python", "SandboxTemplate to create")
	pool := flag.String("warm-pool", "ciproxy-python", "SandboxWarmPool to create")
	replicas := flag.Int("replicas", 2, "the pool's replicas")
	router := flag.Bool("router", false, "serve a sandbox-router")
	authz := flag.String("router-authz", "scoped-token", "the router's authz mode: allow-all or scoped-token")
	readyDelay := flag.Duration("ready-delay", 0, "how long a new pod takes to become Ready")
	processPort := flag.Int("process-port", 9090, "sandboxd's gRPC port on each pod IP")
	filesPort := flag.Int("files-port", 8080, "sandboxd's REST port on each pod IP")
	if err := flag.Parse(args); err != nil {
		return err
	}

	if *dir == "" {
		d, err := os.MkdirTemp("", "agentsandbox-double-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	s, err := agentsandboxtest.Start(agentsandboxtest.Options{
		Namespace: *ns, Template: *tmpl, WarmPool: *pool, WarmPoolReplicas: *replicas,
		ImageFiles: map[string]string{kernel.Path: string(kernel.Source()), kernel.DaemonPath: string(kernel.DaemonSource())},
		ReadyDelay: *readyDelay, Router: *router, RouterAuthz: *authz, Dir: *dir,
		ProcessPort: *processPort, FilesPort: *filesPort,
	})
	if err != nil {
		return err
	}
	settings := map[string]any{
		"sandbox_provider": "agent_sandbox",
		"kubeconfig":       s.Kubeconfig(),
		"namespace":        s.Namespace(),
		"warm_pool":        s.WarmPool(),
		"process_port":     s.ProcessPort(),
		"files_port":       s.FilesPort(),
	}
	if *router {
		settings["connect"] = "router" // files through the router; the process service at the pod IP
		settings["router_url"] = s.RouterURL()
		if *authz == "scoped-token" {
			settings["scoped_token_secret"] = s.ScopedTokenSecret()
		}
	}
	b, err := yaml.Marshal(settings)
	if err != nil {
		s.Close()
		return err
	}
	if _, err := out.Write(b); err != nil {
		s.Close()
		return err
	}
	<-stop
	done := make(chan struct{})
	go func() {
		s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("pods did not stop within 30s")
	}
	return nil
}
