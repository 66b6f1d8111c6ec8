#!/usr/bin/env bash
# Builds the agent_sandbox backend's sandbox image (deploy/kubernetes/agent-sandbox/Dockerfile)
# with podman and tests it (TestSandboxImage in test/e2e): a container of it, run as its user
# 1000, driven through its sandboxd by the agent_sandbox backend's code.
#
#   scripts/sandbox-image-test.sh          build and test (what make image-test runs)
#   scripts/sandbox-image-test.sh build    build only
#
# There is no container registry here, so neither of the Dockerfile's bases is pulled:
# - RUNTIME_IMAGE is the Debian base of scripts/image-base.sh (debootstrapped, cached), whose apt
#   source is the Debian mirror the build's apt-get installs from;
# - SANDBOXD_IMAGE is a stand-in for agent-sandbox's sandboxd image: a root holding only
#   /usr/local/bin/sandboxd, imported with `podman import`, where that binary is the static
#   stand-in of internal/sandbox/agentsandboxtest/cmd/sandboxd (the same process service and
#   files API, commands run as its children). Re-imported only when the binary changes.
# podman keeps the layers, so a second run rebuilds nothing that did not change.
# SANDBOX_IMAGE names the result (default localhost/ciproxy-sandbox:dev). As root.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${SANDBOX_IMAGE:-localhost/ciproxy-sandbox:dev}
standin=localhost/ciproxy-sandboxd-standin:dev
log() { echo "sandbox-image: $*" >&2; }

scripts/deps.sh image
podman=(podman --runtime runc)
base=$(scripts/image-base.sh)

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin"
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$root/usr/local/bin/sandboxd" ./internal/sandbox/agentsandboxtest/cmd/sandboxd
sum=$(sha256sum "$root/usr/local/bin/sandboxd" | cut -c1-16)
if [[ $("${podman[@]}" image inspect --format '{{index .Labels "sandboxd"}}' "$standin" 2>/dev/null) != "$sum" ]]; then
	log "importing the stand-in sandboxd as $standin"
	tar -C "$root" --numeric-owner --owner=0 --group=0 -cf "$root.tar" .
	"${podman[@]}" import --change "LABEL sandboxd=$sum" --change 'ENTRYPOINT ["/usr/local/bin/sandboxd"]' "$root.tar" "$standin" >/dev/null
	rm -f "$root.tar"
fi

log "building $image"
"${podman[@]}" build --format docker --network host -f deploy/kubernetes/agent-sandbox/Dockerfile \
	--build-arg "SANDBOXD_IMAGE=$standin" --build-arg "RUNTIME_IMAGE=$base" -t "$image" .
"${podman[@]}" image inspect --format "sandbox-image: $image {{.Size}} bytes" "$image"
[[ ${1:-} == build ]] && exit 0

log "testing $image"
CIPROXY_E2E_SANDBOX_IMAGE=$image go test -count=1 -timeout 10m -run '^TestSandboxImage' -v ./test/e2e/
