#!/usr/bin/env bash
# Runs the local sandbox's cgroup tests on a real cgroup v2 kernel: Debian's kernel, booted under
# QEMU with software emulation (no KVM needed), on a Debian root that has what the sandbox needs.
# The guest mounts cgroup2 alone (no v1 hierarchy) and hands the tests a delegated subtree as
# systemd's Delegate=yes does; it runs the compiled tests of internal/sandbox/local and this
# script exits with their status.
#
#   test/cgroup2/run.sh                      the cgroup tests (CGROUP2_TESTS, a -test.run pattern;
#                                            CGROUP2_SKIP, a -test.skip pattern)
#   CGROUP2_TESTS=. test/cgroup2/run.sh      every test of the package
#   CGROUP2_RACE=1 test/cgroup2/run.sh       built with the race detector (several times slower)
#
# Then, in the same guest, the container mode of docs/modes.md on that cgroup v2 host: the image
# (IMAGE, default localhost/ciproxy:dev, which make test-cgroup2 builds first) run by the guest's
# podman with runc, the shipped seccomp profile, the OCI hook and a user namespace of its own, as
# scripts/image-test.sh runs it on the host: the image tests of test/e2e that CGROUP2_E2E names
# (a -test.run pattern), with the sandbox probes CGROUP2_PROBES names (TestImageSandboxProbes'
# CIPROXY_E2E_PROBES). CGROUP2_CONTAINER=0 leaves that part out.
#
# The kernel and the root filesystem are built once and kept in CIPROXY_CACHE (default
# ~/.cache/ciproxy/cgroup2); delete that directory to rebuild them. The image is copied into a
# podman storage kept there too (only its new layers are copied), and from it into a disk the
# guest mounts at /var/lib/containers/storage. Needs root (debootstrap) and Debian's apt; installs
# qemu-system-x86, debootstrap and busybox-static when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

cache=${CIPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ciproxy}/cgroup2
tests=${CGROUP2_TESTS:-'^(TestCgroupFilesWritten|TestCPULimit|TestLimits|TestProbeMemoryAggregate|TestProbeSocketFlood|TestProbeLeftoverCPU|TestRestartKernel|TestFilesCharged|TestIsolationMode|TestTimeout|TestCgroupsRemoved|TestSweepAfterKill)$'}
# The subtests without cgroups (the SIGSTOP fallback) are make test's: emulated, stopping a
# sandbox process by process is slow enough that a spinning process runs past their bound.
skip=${CGROUP2_SKIP-/SIGSTOP_fallback}
container=${CGROUP2_CONTAINER:-1}
image=${IMAGE:-localhost/ciproxy:dev}
# Each proxy and each sandbox test starts a zygote of its own, which takes 30-70 s emulated: what
# the v2 host adds (the delegated cgroup, the limits read back and enforced, a code interpreter
# call through openai-go in TestImageDelegatedCgroup), not every test of the mode (make
# image-test runs those on the host). TestCodeInterpreterOpenAIGo/local adds 90 s.
e2e=${CGROUP2_E2E:-'^(TestImageHealthAndIsolation|TestImageDelegatedCgroup|TestImageSandboxProbes)$'}
probes=${CGROUP2_PROBES:-TestCgroupFilesWritten,TestProbeMemoryAggregate,TestCPULimit}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
go=${GO:-go}
log() { echo "cgroup2: $*" >&2; }

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v debootstrap >/dev/null || need+=(debootstrap)
[[ -x /bin/busybox ]] && file -L /bin/busybox 2>/dev/null | grep -q static || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v file >/dev/null || need+=(file)
command -v depmod >/dev/null || need+=(kmod)
if ((${#need[@]})); then
	log "installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p "$cache"

# The kernel: the package linux-image-amd64 depends on, unpacked (not installed).
if [[ ! -f $cache/kernel/ok ]]; then
	log "fetching Debian's kernel"
	rm -rf "$cache/kernel" && mkdir -p "$cache/kernel/deb"
	pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
	[[ -n $pkg ]] || { apt-get update -qq; pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'); }
	(cd "$cache/kernel/deb" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >/dev/null)
	dpkg-deb -x "$cache"/kernel/deb/*.deb "$cache/kernel/root"
	# The package leaves modules.dep to its postinst.
	depmod -b "$cache/kernel/root" "$(ls "$cache/kernel/root/lib/modules")"
	rm -rf "$cache/kernel/deb"
	touch "$cache/kernel/ok"
fi
kroot=$cache/kernel/root
vmlinuz=$(ls "$kroot"/boot/vmlinuz-* | head -1)
kver=${vmlinuz##*/vmlinuz-}

# The initramfs: busybox and the modules that reach the root disk and the shared directory, and
# overlay, podman's storage (the root has no modules of its own). Named after its module list.
modules="virtio_pci virtio_blk crc32c_generic ext4 9pnet_virtio 9p overlay"
initrd=$cache/initrd-$(printf '%s' "$modules" | sha256sum | cut -c1-12).img
if [[ ! -f $initrd ]]; then
	log "building the initramfs for $kver"
	ird=$(mktemp -d)
	mkdir -p "$ird"/{bin,dev,proc,sys,newroot,lib/modules}
	cp /bin/busybox "$ird/bin/busybox"
	moddir=$kroot/lib/modules/$kver
	# Each wanted module after the modules it depends on, as modules.dep lists them.
	order=()
	add() {
		local path=$1 dep
		[[ " ${order[*]-} " == *" $path "* ]] && return
		for dep in $(awk -F': ' -v m="$path" '$1 == m {print $2}' "$moddir/modules.dep"); do add "$dep"; done
		order+=("$path")
	}
	for m in $modules; do
		path=$(awk -F: -v m="$m" '{n = $1; sub(/.*\//, "", n); sub(/\.ko(\.[a-z]+)?$/, "", n); gsub(/-/, "_", n)} n == m {print $1; exit}' "$moddir/modules.dep")
		[[ -n $path ]] && add "$path" # absent: built into the kernel
	done
	: >"$ird/modules"
	for path in "${order[@]}"; do
		name=${path##*/}
		case $name in
		*.xz) xz -dc "$moddir/$path" >"$ird/lib/modules/${name%.xz}" ;;
		*.zst) zstd -qdc "$moddir/$path" >"$ird/lib/modules/${name%.zst}" ;;
		*) cp "$moddir/$path" "$ird/lib/modules/$name" ;;
		esac
		name=${name%.xz} && name=${name%.zst}
		echo "/lib/modules/$name" >>"$ird/modules"
	done
	install -m 755 "$repo/test/cgroup2/initramfs-init" "$ird/init"
	(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$initrd.new"
	mv "$initrd.new" "$initrd"
	rm -rf "$ird"
fi

# The root filesystem: a minimal Debian with what the sandbox runs (the packages scripts/deps.sh
# installs for it) and what runs the image (podman, runc, conmon, and containernetworking-plugins,
# which debootstrap does not pick for the virtual package podman needs), as an
# ext4 image that every run opens as a throwaway snapshot. Its name holds a digest of the package
# list, so that a changed list builds a new one. Without the container part the root holds no
# podman.
packages=bubblewrap,python3,python3-numpy,python3-pandas,python3-matplotlib,ca-certificates
[[ $container == 1 ]] && packages+=,podman,runc,conmon,containernetworking-plugins,uidmap,procps
root=$cache/root-$(printf '%s' "$packages" | sha256sum | cut -c1-12).img
if [[ ! -f $root ]]; then
	log "debootstrapping $suite (minbase) with $packages"
	rootdir=$(mktemp -d)
	debootstrap --variant=minbase --include="$packages" \
		"$suite" "$rootdir" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
		{ tail -20 "$cache/debootstrap.log" >&2; exit 1; }
	rm -rf "$rootdir"/var/cache/apt/archives/*.deb "$rootdir"/var/lib/apt/lists/*
	mkdir -p "$rootdir/mnt/host"
	truncate -s 3G "$root.new"
	mkfs.ext4 -q -F -L ciproxy-root -d "$rootdir" "$root.new"
	mv "$root.new" "$root"
	rm -rf "$rootdir"
fi

# The tests, and what the guest runs, in a directory the guest mounts (9p).
share=$(mktemp -d)
trap 'rm -rf "$share"' EXIT
race=()
[[ ${CGROUP2_RACE:-} == 1 ]] && race=(-race)
log "building the tests of internal/sandbox/local ${race[*]-}"
if ((${#race[@]})); then
	"$go" test -c "${race[@]}" -o "$share/local.test" ./internal/sandbox/local/
else
	CGO_ENABLED=0 "$go" test -c -o "$share/local.test" ./internal/sandbox/local/
fi
cp /bin/busybox "$share/busybox"
install -m 755 "$repo/test/cgroup2/guest.sh" "$share/guest.sh"
printf '%s\n' "$tests" >"$share/tests"
printf '%s\n' "$skip" >"$share/skip"

# The container part: the image in a podman storage of the guest's own (overlay, on a disk of its
# own), the image tests built here, and what of the repository they read (the seccomp profile, the
# hook) where they look for it, two levels above their working directory.
disk=()
if [[ $container == 1 ]]; then
	podman image exists "$image" || { log "no image $image: make image builds it"; exit 1; }
	store=$cache/podman-store
	log "copying $image into the guest's podman storage"
	t0=$SECONDS
	mkdir -p "$store/storage" "$store/run"
	guestpodman=(podman --root "$store/storage" --runroot "$store/run" --storage-driver overlay)
	podman push -q "$image" "containers-storage:[overlay@$store/storage+$store/run]$image"
	"${guestpodman[@]}" image prune -f >/dev/null # the image's earlier versions
	# podman's own database records the paths it was opened with, which the guest's podman would
	# take over its configuration's: the guest makes its own.
	rm -rf "$store/storage/libpod" "$store/storage/defaultNetworkBackend"
	size=$(du -sm "$store/storage" | cut -f1)
	truncate -s $((size * 2 + 512))M "$share/storage.img"
	mkfs.ext4 -q -F -L ciproxy-storage -d "$store/storage" "$share/storage.img"
	disk=(-drive file="$share/storage.img",format=raw,if=virtio,cache=unsafe)
	log "the image's storage (${size} MB) took $((SECONDS - t0)) s"
	CGO_ENABLED=0 "$go" test -c -o "$share/e2e.test" ./test/e2e/
	mkdir -p "$share/repo/test/e2e" "$share/repo/deploy/oci-hooks"
	cp deploy/seccomp.json "$share/repo/deploy/"
	install -m 755 deploy/oci-hooks/ciproxy-delegate-cgroup "$share/repo/deploy/oci-hooks/"
	cp deploy/oci-hooks/ciproxy-delegate-cgroup.json "$share/repo/deploy/oci-hooks/"
	printf '%s\n' "$image" >"$share/image"
	printf '%s\n' "$e2e" >"$share/e2e"
	printf '%s\n' "$probes" >"$share/probes"
	log "the image's storage and the image tests took $((SECONDS - t0)) s"
fi

log "booting $kver under qemu (tcg)"
start=$SECONDS
timeout "${CGROUP2_TIMEOUT:-45m}" qemu-system-x86_64 \
	-accel tcg,thread=multi -cpu max -smp 2 -m "${CGROUP2_MEMORY:-4096}" \
	-nographic -no-reboot -monitor none -serial stdio -nic none \
	-kernel "$vmlinuz" -initrd "$initrd" \
	-append "console=ttyS0 quiet loglevel=1 panic=-1 init=/mnt/host/guest.sh" \
	-drive file="$root",format=raw,if=virtio,snapshot=on "${disk[@]}" \
	-virtfs local,path="$share",mount_tag=host,security_model=none,id=host \
	</dev/null || log "qemu exited with status $?"
log "guest ran for $((SECONDS - start)) s"
rc=$(cat "$share/rc" 2>/dev/null || echo missing)
if [[ $rc != 0 ]]; then
	log "FAIL: the tests exited with status $rc"
	exit 1
fi
if [[ $container == 1 ]]; then
	rc=$(cat "$share/rc-e2e" 2>/dev/null || echo missing)
	if [[ $rc != 0 ]]; then
		log "FAIL: the container tests exited with status $rc"
		exit 1
	fi
fi
log "ok"
