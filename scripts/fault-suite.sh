#!/usr/bin/env bash
# Runs the fault suite (internal/faultsuite) N times in a row under the race
# detector and stops at the first failing run, printing its counters and
# evidence. Each run starts its own redis-server and proxy on free loopback
# ports.
#
# Usage: scripts/fault-suite.sh [N]        (default 10)
# Environment: REDPROXY_FAULT_DURATION (Go duration, default 45s per run).
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-10}"
go test -race -c -o /tmp/redproxy-faultsuite.test ./internal/faultsuite/
for i in $(seq 1 "$n"); do
	echo "== fault suite run $i/$n"
	if ! /tmp/redproxy-faultsuite.test -test.run '^TestFaultSuite$' -test.count=1 -test.v >/tmp/redproxy-faultsuite.log 2>&1; then
		grep -v 'level=' /tmp/redproxy-faultsuite.log | tail -n 60
		echo "run $i of $n failed; full log in /tmp/redproxy-faultsuite.log"
		exit 1
	fi
	grep -E 'fault suite (counters|work)' /tmp/redproxy-faultsuite.log | sed 's/^ *//'
done
echo "all $n runs passed"
