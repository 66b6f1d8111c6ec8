#!/usr/bin/env bash
# Runs every fuzz target in the module for FUZZTIME each (default 20s).
#
# A target fails the run when it finds something: a written failing input, a panic, a failed check.
# One failure is not a finding: Go 1.26's fuzz coordinator can report a bare "context deadline
# exceeded" when -fuzztime ends while a worker is still in a call (go.dev/issue/75804, fixed in Go
# 1.27). That message, with no failing input written, is retried once and then replayed against the
# seed corpus deterministically; only if the replay fails too does the run fail.
set -uo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-20s}"
GO="${GO:-go}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

# shutdown_race reports whether the output in $out is the coordinator's deadline race and nothing else.
shutdown_race() {
	grep -q '^    context deadline exceeded$' "$out" &&
		! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:' "$out"
}

for pkg in $("$GO" list ./...); do
	for target in $("$GO" test -list '^Fuzz' "$pkg" | grep '^Fuzz'); do
		echo "fuzz $pkg $target"
		ok=""
		for attempt in 1 2; do
			if "$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg" >"$out" 2>&1; then
				ok=1
				break
			fi
			if ! shutdown_race; then
				break
			fi
			echo "fuzz: $target: the coordinator's shutdown race (no failing input); attempt $attempt"
		done
		if [ -z "$ok" ] && shutdown_race &&
			"$GO" test -run "^${target}\$" -count=1 "$pkg" >>"$out" 2>&1; then
			echo "fuzz: $target: seed corpus replays clean; the deadline report is Go's, not a finding"
			ok=1
		fi
		tail -n 3 "$out"
		if [ -z "$ok" ]; then
			cat "$out"
			exit 1
		fi
	done
done
