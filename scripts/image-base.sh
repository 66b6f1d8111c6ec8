#!/usr/bin/env bash
# Makes the Debian base that the image builds use when there is no container registry:
# a root made by `debootstrap --variant=minbase` from a Debian mirror (DEBIAN_MIRROR), with that
# mirror as its apt source, imported with `podman import` as localhost/ciproxy-base:bookworm
# (printed on stdout). scripts/image.sh and scripts/sandbox-image-test.sh build on it.
#
# The root is cached in CIPROXY_CACHE (default ~/.cache/ciproxy/image) and re-imported only when
# it is newer than the base image, so a second run costs a checksum. As root, with podman, runc
# and debootstrap (scripts/deps.sh image).
set -euo pipefail
cache=${CIPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ciproxy}/image
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
base=localhost/ciproxy-base:$suite
log() { echo "image: $*" >&2; }
podman=(podman --runtime runc)

mkdir -p "$cache"
if [[ ! -f $cache/root.tar ]]; then
	log "debootstrapping $suite (minbase) from $mirror"
	root=$(mktemp -d)
	trap 'rm -rf "$root"' EXIT
	debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
		{ tail -20 "$cache/debootstrap.log" >&2; exit 1; }
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
	echo "deb $mirror $suite main" >"$root/etc/apt/sources.list"
	tar -C "$root" --numeric-owner -cf "$cache/root.tar.new" .
	mv "$cache/root.tar.new" "$cache/root.tar"
	rm -rf "$root"
	trap - EXIT
fi
# Re-imported only when the cached root is newer than the base image.
sum=$(sha256sum "$cache/root.tar" | cut -c1-16)
if [[ $("${podman[@]}" image inspect --format '{{index .Labels "root"}}' "$base" 2>/dev/null) != "$sum" ]]; then
	log "importing the root as $base"
	"${podman[@]}" import --change "LABEL root=$sum" --change 'CMD ["/bin/bash"]' "$cache/root.tar" "$base" >/dev/null
fi
echo "$base"
