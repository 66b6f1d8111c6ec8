# ciproxy: an OpenAI-compatible proxy that runs code_interpreter in a sandbox you control.
CONFIG ?= config.example.yaml
GO ?= go

.PHONY: run test vet bench fuzz deps build chaos test-cgroup2 image image-test

build:
	$(GO) build -o bin/proxy ./cmd/proxy

# Starts the proxy with the example config (local sandbox, no sandbox key needed).
run:
	scripts/deps.sh run
	$(GO) run ./cmd/proxy --config $(CONFIG)

# The whole suite: vet, every Go test under the race detector, and the official clients
# (openai-go inside go test; the openai npm package through test/e2e, enabled by CIPROXY_CLIENT_TESTS).
test:
	scripts/deps.sh
	test -z "$$(gofmt -l cmd internal bench test)" || { gofmt -l cmd internal bench test; exit 1; }
	$(GO) vet ./...
	CIPROXY_CLIENT_TESTS=1 $(GO) test -race -count=1 -timeout 20m ./...

# Benchmarks: every Go benchmark (one package at a time), the pass-through comparison and the load
# steps; prints them and writes docs/benchmarks.md. Run it on an otherwise idle machine.
bench:
	scripts/deps.sh
	$(GO) run ./bench/report

# Runs each fuzz target for FUZZTIME (default 20s); see scripts/fuzz.sh for what counts as a finding.
FUZZTIME ?= 20s
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh

# Fault injection over 1000 intercepted requests (clients leaving, upstream errors and hangs, cut
# streams, failing sandboxes, config reloads), then leak accounting and a clean shutdown.
# CIPROXY_CHAOS_SEED=n replays a run.
chaos:
	scripts/deps.sh
	CIPROXY_CHAOS_N=1000 $(GO) test -race -run '^TestChaos$$' -count=1 -timeout 40m -v ./cmd/proxy/

# The local sandbox's cgroup tests on a real cgroup v2 kernel: Debian's kernel under QEMU (software
# emulation), a debootstrapped root, a delegated subtree as systemd's Delegate=yes gives one; then,
# in the same guest, the image in the container mode of docs/modes.md (podman, runc, the seccomp
# profile, the cgroup hook, a user namespace) with the image tests and sandbox probes of that mode.
# As root; the kernel and root are built once into ~/.cache/ciproxy/cgroup2. See test/cgroup2/run.sh.
test-cgroup2: image
	GO=$(GO) test/cgroup2/run.sh

# The container image, built with podman from a debootstrapped Debian (no registry needed; see
# scripts/image.sh). IMAGE names it (default localhost/ciproxy:dev).
image:
	scripts/image.sh

# The end-to-end and sandbox isolation tests against the image, in each way of running that
# docs/modes.md lists (scripts/image-test.sh), then docs/compose.yaml run with Docker Compose on
# podman and tested through its nginx (scripts/compose-test.sh), then the agent_sandbox backend's
# sandbox image built with a stand-in sandboxd and driven by the backend
# (scripts/sandbox-image-test.sh). As root.
image-test: image
	scripts/image-test.sh
	scripts/compose-test.sh
	scripts/sandbox-image-test.sh
