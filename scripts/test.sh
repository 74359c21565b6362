#!/usr/bin/env bash
# Runs every test of redproxy: go vet, the whole suite under the race
# detector, and a short run of each fuzz target. Behaviour tests start real
# redis-server processes on free loopback ports, so this installs Debian's
# redis-server and redis-tools first when they are missing, and Debian's
# prometheus for promtool, which checks the /metrics exposition.
#
# Environment: FUZZTIME (default 10s per fuzz target; 0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
	echo "installing ${need[*]} from Debian's packages"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's package may start a service on 6379; the tests never use it, but
# stop it so nothing outside the tests answers there.
if command -v service >/dev/null 2>&1 && pgrep -x redis-server >/dev/null 2>&1; then
	service redis-server stop >/dev/null 2>&1 || true
fi
# Only promtool is wanted from the prometheus package, never its server.
if command -v service >/dev/null 2>&1 && pgrep -x prometheus >/dev/null 2>&1; then
	service prometheus stop >/dev/null 2>&1 || true
fi

echo "== go vet"
go vet ./...
# Under -race, internal/rawio uses the plain system calls (the detector must
# see what the kernel reads and writes), so the raw socket I/O the proxy
# ships with runs only in a build without it: the packages on the data path
# run again so. That run goes on beside the race run: internal/proxy's
# tests spend most of their time waiting on servers (about 200 s of CPU in
# 510 s), and run one after the other the two made CI take 26 minutes.
nonrace_log=$(mktemp "${TMPDIR:-/tmp}/redproxy-nonrace.XXXXXX")
trap 'rm -f "$nonrace_log"' EXIT
go test -count=1 -timeout 20m ./internal/rawio ./internal/resp ./internal/upstream ./internal/faultsuite ./internal/proxy ./cmd/redproxy >"$nonrace_log" 2>&1 &
nonrace_pid=$!
echo "== go test -race"
race_status=0
go test -race -count=1 -timeout 20m ./... || race_status=$?
nonrace_status=0
wait "$nonrace_pid" || nonrace_status=$?
echo "== go test (no -race: the raw socket I/O of the data path; ran beside the race run)"
cat "$nonrace_log"
if [ "$race_status" -ne 0 ] || [ "$nonrace_status" -ne 0 ]; then
	echo "go test failed (race run: exit $race_status, run without -race: exit $nonrace_status)"
	exit 1
fi

fuzztime="${FUZZTIME:-10s}"
if [ "$fuzztime" != "0" ]; then
	echo "== fuzz ($fuzztime each)"
	# -fuzzminimizetime=0: Go's fuzz engine reports an input whose
	# minimization is still running when -fuzztime ends as a failure
	# ("context deadline exceeded", internal/fuzz/worker.go), so a
	# time-boxed run must not minimize. A crasher is still written to
	# testdata/fuzz, unminimized.
	for pkg in $(go list ./...); do
		dir=$(go list -f '{{.Dir}}' "$pkg")
		for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
			echo "-- $pkg $target"
			# Even without minimization, Go's fuzz coordinator sometimes
			# reports its own -fuzztime deadline as the failure ("context
			# deadline exceeded", no input named or written; seen in CI on
			# FuzzTopologyReply, whose inputs take microseconds). Likely
			# cause: internal/fuzz/fuzz.go's stop() compares ctx.Err() with
			# the workers' child context before the cancellation has
			# reached it. Only such a run is repeated, once; a failing
			# input fails CI as before.
			if ! go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" -fuzzminimizetime=0 "$pkg" >/tmp/redproxy-fuzz.log 2>&1; then
				if grep -q '^    context deadline exceeded$' /tmp/redproxy-fuzz.log && ! grep -q 'Failing input written' /tmp/redproxy-fuzz.log; then
					echo "   (the fuzz coordinator reported its own deadline, no input failed: running $target again)"
					go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" -fuzzminimizetime=0 "$pkg" >/tmp/redproxy-fuzz.log 2>&1 || { cat /tmp/redproxy-fuzz.log; exit 1; }
				else
					cat /tmp/redproxy-fuzz.log
					exit 1
				fi
			fi
			tail -n 1 /tmp/redproxy-fuzz.log
		done
	done
fi
# FuzzRequestPath's and FuzzAuthPath's workers each start a redis-server that outlives them
# (a fuzz worker has no end-of-run hook); stop those, and only those.
for pid in $(pgrep -x redis-server 2>/dev/null); do
	case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in
	*/FuzzRequestPath*|*/FuzzAuthPath*) kill "$pid" 2>/dev/null || true ;;
	esac
done
echo "all tests passed"
