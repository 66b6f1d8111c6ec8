#!/usr/bin/env bash
# Runs the end-to-end tests (the official clients, the scripted upstream) against the image, and
# the local sandbox's isolation tests inside it, in each way of running docs/modes.md lists.
#
#   scripts/image-test.sh                 every mode: container, pod, rootless
#   scripts/image-test.sh pod             one of them
#
# IMAGE names the image (default localhost/ciproxy:dev; make image-test builds it first). As root,
# with podman and runc (scripts/deps.sh image). The container mode needs subordinate ids for
# podman's --userns=auto: a "containers" range in /etc/subuid and /etc/subgid, added here when
# missing, and the OCI hook deploy/oci-hooks/ciproxy-delegate-cgroup (the tests point podman at it).
set -euo pipefail
cd "$(dirname "$0")/.."
image=${IMAGE:-localhost/ciproxy:dev}
modes=("${@:-container}")
(($#)) || modes=(container pod rootless)

scripts/deps.sh image
# The Node client's packages, for its tests (make test, run before in CI, installed them).
[[ -d test/node/node_modules ]] || scripts/deps.sh
# 2^28 ids from 2^30 (4096 containers of 65536): inside the range systemd leaves to containers,
# below the local sandbox's default 0x70000000 on the host.
for f in /etc/subuid /etc/subgid; do
	grep -q '^containers:' "$f" 2>/dev/null || echo 'containers:1073741824:268435456' >>"$f"
done

# What each mode runs: every e2e test of the image, the clients' scenarios against it (pass-through,
# the code interpreter on the local sandbox, files in and out, the Containers API, network
# policies with pip installs and domain secrets) and the
# isolation probes. The rootless mode, the image's default, gets the probes and the code
# interpreter only: the pod mode runs everything under the same user with stricter settings.
full='^(TestImage.*|TestPassthroughOpenAIGo|TestCodeInterpreterOpenAIGo|TestFilesRoundTripOpenAIGo|TestInputPartsOpenAIGo|TestNodeOpenAIClient|TestNodeFilesRoundTrip|TestNetworkPolicy)$'
small='^(TestImageHealthAndIsolation|TestImageSandboxProbes|TestCodeInterpreterOpenAIGo)$'
for mode in "${modes[@]}"; do
	run=$full
	[[ $mode == rootless ]] && run=$small
	echo "image-test: $mode" >&2
	log=$(mktemp)
	status=0
	CIPROXY_E2E_IMAGE=$image CIPROXY_E2E_MODE=$mode CIPROXY_CLIENT_TESTS=1 \
		go test -count=1 -timeout 20m -run "$run" -v ./test/e2e/ >"$log" 2>&1 || status=$?
	# The summary: each test's result, and the isolation the sandbox tests saw in the container.
	grep -E '^(--- |    --- |ok|FAIL)|in the container: ' "$log" || true
	if ((status)); then
		cat "$log"
		rm -f "$log"
		echo "image-test: $mode failed" >&2
		exit 1
	fi
	rm -f "$log"
done
