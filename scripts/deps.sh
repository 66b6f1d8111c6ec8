#!/usr/bin/env bash
# Installs what ciproxy's run and test commands need on a Debian machine, and only what is missing.
#   scripts/deps.sh          everything the tests need (sandbox, Python libraries, Node client deps)
#   scripts/deps.sh run      only what running the proxy with the local sandbox needs
#   scripts/deps.sh image    what building and testing the container image needs (podman, runc,
#                            debootstrap; uidmap for the modes with a user namespace; CNI's dnsname
#                            plugin, by which the compose test's containers find each other by name)
set -euo pipefail
cd "$(dirname "$0")/.."

want=(bubblewrap python3 python3-pip python3-numpy python3-pandas python3-matplotlib ca-certificates)
if [[ "${1:-}" == image ]]; then
	want=(podman runc debootstrap uidmap golang-github-containernetworking-plugin-dnsname ca-certificates)
elif [[ "${1:-}" != run ]]; then
	want+=(redis-server) # the replica tests start their own, on a free loopback port
	command -v node >/dev/null 2>&1 || want+=(nodejs npm)
fi

missing=()
for pkg in "${want[@]}"; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if ((${#missing[@]})); then
	if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		echo "deps: installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	else
		echo "deps: missing Debian packages: ${missing[*]}" >&2
		echo "deps: install them with: sudo apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
fi

command -v go >/dev/null 2>&1 || { echo "deps: Go 1.26 or newer is needed (https://go.dev/dl)" >&2; exit 1; }
go mod download

if [[ -z "${1:-}" ]]; then
	(cd test/node && npm ci --no-audit --no-fund --loglevel=error)
	(cd internal/sandbox/opensandboxtest/testdata/sdk && npm ci --no-audit --no-fund --loglevel=error)
fi
