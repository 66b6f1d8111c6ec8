#!/usr/bin/env bash
# Builds the ciproxy image with podman, from the Dockerfile at the repository root.
#
#   scripts/image.sh              bases made here, with no container registry (what make image does)
#   scripts/image.sh official     the Dockerfile's default bases, pulled from a registry
#
# IMAGE names the result (default localhost/ciproxy:dev). As root; installs podman, runc and
# debootstrap when missing (scripts/deps.sh image).
#
# Without a registry, both bases come from one Debian root, made by `debootstrap --variant=minbase`
# from a Debian mirror (DEBIAN_MIRROR) and imported with `podman import`:
# - the runtime stage installs its packages on it from that mirror, as it would on debian:bookworm-slim;
# - the build stage runs on it with this host's Go toolchain and module cache mounted read-only
#   for the build (GOPROXY=off: nothing is downloaded), and its build cache mounted to keep
#   rebuilds fast. Nothing of them ends up in the image: only the static binary is copied out of
#   that stage. This is simpler and more honest than an image that bundles a toolchain: the
#   binary is built by the same `go build` line as with the official golang image, with the Go
#   that the tests of this checkout ran with.
# scripts/image-base.sh makes that base and caches the root in CIPROXY_CACHE (default
# ~/.cache/ciproxy/image), and podman keeps the layers, so a second build redoes only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

how=${1:-local}
image=${IMAGE:-localhost/ciproxy:dev}
log() { echo "image: $*" >&2; }

scripts/deps.sh image
# This host's cgroups (v1 beside an empty v2 hierarchy) are refused by crun: runc runs the build.
podman=(podman --runtime runc)
version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
args=(--format docker --network host --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)"
	--build-arg "VERSION=$version" -t "$image" -f Dockerfile)

case $how in
official) ;;
local)
	base=$(scripts/image-base.sh)
	goroot=$(go env GOROOT)
	modcache=$(go env GOMODCACHE)
	gocache=$(go env GOCACHE)
	go mod download
	args+=(--build-arg "GO_IMAGE=$base" --build-arg "RUNTIME_IMAGE=$base"
		--build-arg GOPROXY=off --build-arg GOFLAGS=-mod=readonly
		--volume "$goroot:/usr/local/go:ro" --volume "$modcache:/go/pkg/mod:ro"
		--volume "$gocache:/root/.cache/go-build")
	;;
*)
	echo "usage: scripts/image.sh [official]" >&2
	exit 2
	;;
esac

log "building $image"
"${podman[@]}" build "${args[@]}" .
"${podman[@]}" image inspect --format "image: $image {{.Size}} bytes" "$image"
