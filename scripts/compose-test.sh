#!/usr/bin/env bash
# Runs docs/compose.yaml (three replicas sharing one Redis, nginx in front on port 4000, e2b
# sandboxes) with Docker Compose v2 on podman, and TestCompose (test/e2e/compose_test.go) against
# it: the scripted upstream and the e2b emulator stand in for the model and e2b. make image-test
# runs it after the image's modes. As root, after scripts/image.sh (make image), whose
# debootstrapped base the stand-ins below are built on.
#
# Where no registry can be reached:
# - Compose is built from the Go module proxy into CIPROXY_CACHE (default ~/.cache/ciproxy) once,
#   and talks to podman's Docker-compatible API (podman system service) on a socket of its own,
#   with runc (crun refuses this host's hybrid cgroups) and ulimits within podman's hard limits.
# - Compose builds the proxy's image from the Dockerfile, as `up --build` does, as
#   localhost/ciproxy-compose:dev (CIPROXY_IMAGE), with podman's own builder (DOCKER_BUILDKIT=0:
#   Compose's BuildKit needs a BuildKit image from a registry, podman's API has none). Its bases
#   are stand-ins for the official ones (GO_IMAGE, RUNTIME_IMAGE): test/compose/golang.Containerfile
#   and the base itself; the build stage downloads the modules from the Go module proxy.
# - redis and nginx are Debian's packages on the same base (test/compose/*.Containerfile), given
#   to the file by REDIS_IMAGE and NGINX_IMAGE; the file's commands and configuration are the
#   same for the official images.
# - podman fires health checks from systemd timers, and there is no systemd here: TestCompose runs
#   each container's check every second itself (runHealthChecks).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${CIPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ciproxy}
compose_version=v2.29.7
base=localhost/ciproxy-base:bookworm
log() { echo "compose-test: $*" >&2; }

scripts/deps.sh image
# The e2b emulator runs the code in local sandboxes of this host (bubblewrap, Python).
scripts/deps.sh run
podman image exists "$base" || { log "no base $base: run scripts/image.sh (make image) first"; exit 1; }

compose=$cache/compose-$compose_version/docker-compose
if [[ ! -x $compose ]]; then
	log "building Docker Compose $compose_version from the Go module proxy"
	dir=$(dirname "$compose")
	mkdir -p "$dir"
	# Outside the module: compose is a tool of the test, not a dependency of ciproxy.
	(cd "$dir" && GOBIN=$dir GOFLAGS= go install "github.com/docker/compose/v2/cmd@$compose_version")
	mv "$dir/cmd" "$compose"
fi

stand_in() {
	log "building the $1 stand-in on $base"
	podman --runtime runc build --quiet --network host --build-arg "BASE=$base" "${@:2}" \
		-t "localhost/ciproxy-$1:bookworm" -f "test/compose/$1.Containerfile" test/compose >/dev/null
}
stand_in redis
stand_in nginx
ca=/etc/ssl/certs/ca-certificates.crt
stand_in golang --build-arg "GO_VERSION=$(go env GOVERSION)" --build-arg "CA_SUM=$(sha256sum "$ca" | cut -c1-16)" \
	--volume "$(go env GOROOT):/host/go:ro" --volume "$ca:/host/ca-certificates.crt:ro"

run=$(mktemp -d)
service=
cleanup() {
	[[ -z $service ]] || { kill "$service" 2>/dev/null; wait "$service" 2>/dev/null || true; }
	rm -rf "$run"
}
trap cleanup EXIT
cat >"$run/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=16384:16384"]
[engine]
runtime = "runc"
CONF
CONTAINERS_CONF=$run/containers.conf podman system service --time=0 "unix://$run/podman.sock" 2>"$run/service.log" &
service=$!
for _ in $(seq 50); do
	[[ -S $run/podman.sock ]] && break
	sleep 0.1
done
[[ -S $run/podman.sock ]] || { cat "$run/service.log" >&2; log "podman system service did not start"; exit 1; }

log "TestCompose"
status=0
DOCKER_HOST=unix://$run/podman.sock DOCKER_BUILDKIT=0 CIPROXY_E2E_COMPOSE=$compose \
	CIPROXY_IMAGE=localhost/ciproxy-compose:dev GO_IMAGE=localhost/ciproxy-golang:bookworm RUNTIME_IMAGE=$base \
	REDIS_IMAGE=localhost/ciproxy-redis:bookworm NGINX_IMAGE=localhost/ciproxy-nginx:bookworm \
	go test -count=1 -timeout 20m -run '^TestCompose$' -v ./test/e2e/ >"$run/test.log" 2>&1 || status=$?
if ((status)); then
	cat "$run/test.log" "$run/service.log"
	log "failed"
	exit 1
fi
grep -E '^(--- |ok|FAIL)|replicas that served' "$run/test.log" || true
