#!/bin/sh
# PID 1 of the guest (on its Debian root, from the directory the host shares at /mnt/host): the
# mounts a systemd host has, cgroup2 alone, a delegated subtree for the tests as systemd gives a
# unit with Delegate=yes, then the tests; their status goes to /mnt/host/rc.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8
# The tests fail, rather than skip, where the provider does not get the v2 mode.
export CIPROXY_TEST_CGROUP2=1
# Emulated, a kernel takes about a minute to start (imports, matplotlib's font cache).
export CIPROXY_TEST_START_TIMEOUT=5m
bb=/mnt/host/busybox
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup
$bb ip link set lo up
$bb hostname cgroup2-guest

# What systemd sets up for a service with Delegate=yes: the controllers enabled down to the
# unit's cgroup, the service's processes in that cgroup, and the subtree below it the service's.
cd /sys/fs/cgroup
echo "+memory +pids +cpu" >cgroup.subtree_control
mkdir system.slice
echo "+memory +pids +cpu" >system.slice/cgroup.subtree_control
mkdir system.slice/ciproxy.service
echo $$ >system.slice/ciproxy.service/cgroup.procs
cd /

echo "guest: $(uname -r); cgroup2 at /sys/fs/cgroup: $(cat /sys/fs/cgroup/cgroup.controllers); swap accounting: $(test -e /sys/fs/cgroup/system.slice/memory.swap.max && echo yes || echo no)"
echo "guest: /proc/self/cgroup $(cat /proc/self/cgroup)"
tests=$(cat /mnt/host/tests)
skip=$(cat /mnt/host/skip)
start=$(date +%s)
{
	/mnt/host/local.test -test.v -test.count=1 -test.timeout=40m -test.run "$tests" -test.skip "$skip" 2>&1
	echo $? >/mnt/host/rc.tmp
} | tee /mnt/host/out.txt
echo "guest: the tests took $(($(date +%s) - start)) s and exited with status $(cat /mnt/host/rc.tmp)"

# The container mode on this host (run.sh's second part): the guest's podman, with the image in a
# storage on the second disk. No systemd here: podman makes the containers' cgroups itself
# (cgroupfs, below /libpod_parent, enabling the parents' controllers as systemd would for a
# delegated scope) and logs its events to a file.
if [ -x /mnt/host/e2e.test ]; then
	mkdir -p /var/lib/containers/storage /etc/containers
	mount -t ext4 /dev/vdb /var/lib/containers/storage
	printf '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n' >/etc/containers/containers.conf
	printf '[storage]\ndriver = "overlay"\ngraphroot = "/var/lib/containers/storage"\nrunroot = "/run/containers/storage"\n' >/etc/containers/storage.conf
	# podman's --userns auto takes its ids from this range, as scripts/image-test.sh adds it.
	echo containers:1073741824:268435456 >>/etc/subuid
	echo containers:1073741824:268435456 >>/etc/subgid
	echo "guest: $(podman --version), $(runc --version | head -1), image $(podman image inspect --format '{{.Id}}' "$(cat /mnt/host/image)" | cut -c1-12)"
	start=$(date +%s)
	# One test at a time: emulated, zygotes starting side by side on two CPUs take longer than
	# the proxy's own bound on a kernel's start (60 s).
	{
		cd /mnt/host/repo/test/e2e &&
			CIPROXY_E2E_IMAGE=$(cat /mnt/host/image) CIPROXY_E2E_MODE=container CIPROXY_E2E_PROBES=$(cat /mnt/host/probes) \
				CIPROXY_E2E_SANDBOX_TESTS=/mnt/host/local.test \
				/mnt/host/e2e.test -test.v -test.count=1 -test.parallel=1 -test.timeout=30m -test.run "$(cat /mnt/host/e2e)" 2>&1
		echo $? >/mnt/host/rc-e2e
	} | tee /mnt/host/out-e2e.txt
	cd /
	echo "guest: the container tests took $(($(date +%s) - start)) s and exited with status $(cat /mnt/host/rc-e2e)"
fi
mv /mnt/host/rc.tmp /mnt/host/rc
sync
echo o >/proc/sysrq-trigger
sleep 10
