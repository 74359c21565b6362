#!/usr/bin/env bash
# bench/syscalls.sh: system calls per request of twemproxy and redproxy in
# front of one redis-server, counted by perf's syscall tracepoints on the
# proxy's process (all threads) while redis-benchmark runs, and divided by
# the commands Redis executed meanwhile (INFO commandstats). Counts do not
# depend on the machine's load the way CPU time does. At -P 1 a proxy makes
# one client read and one client write per request; what is above 1 in the
# write column is its upstream writes per request, so 1 / (write - 1) is
# about the commands each upstream write carried. Redis's count spans a
# little more than perf's (two redis-cli calls around it), so figures that
# should be 1.0 can read a few percent under it.
#
# Usage: bench/syscalls.sh LAYOUT TEST PIPELINE
#   LAYOUT split (Redis and redis-benchmark on cpu0, proxies on cpu1) or
#   shared (redis-benchmark on cpu0, Redis and proxies on cpu1); TEST get
#   or set; PIPELINE 1, 16, ...
# Environment: REDPROXY_BIN (default: build ./cmd/redproxy) SECONDS_COUNTED (3)
# Needs redis-server, redis-benchmark, redis-cli, nutcracker, perf, taskset.
set -euo pipefail
(($# == 3)) || { sed -n '2,19p' "$0"; exit 2; }
LAYOUT=$1 TEST=$2 P=$3
SECONDS_COUNTED=${SECONDS_COUNTED:-3}
case $LAYOUT in split) CPU_REDIS=0 ;; shared) CPU_REDIS=1 ;; *) echo "layout: split or shared" >&2; exit 2 ;; esac
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/nutcracker.sh
source "$REPO/bench/nutcracker.sh"
TMP=$(mktemp -d)
PIDS=()
cleanup() {
	((${#PIDS[@]})) && kill "${PIDS[@]}" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_pong() { for _ in $(seq 50); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.1; done; echo "port $1 never answered" >&2; exit 1; }

BIN=${REDPROXY_BIN:-}
if [[ -z $BIN ]]; then
	go -C "$REPO" build -o "$TMP/redproxy" ./cmd/redproxy
	BIN=$TMP/redproxy
fi
REDIS_PORT=$(freeport) TWEM_PORT=$(freeport) PROXY_PORT=$(freeport) STATS_PORT=$(freeport)
taskset -c "$CPU_REDIS" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
wait_pong "$REDIS_PORT"
redis-cli -p "$REDIS_PORT" eval "for i = 0, 99999 do redis.call('SET', string.format('key:%012d', i), string.rep('x', 64)) end" 0 >/dev/null
nutcracker_yml "$TWEM_PORT" "$REDIS_PORT" >"$TMP/nutcracker.yml"
taskset -c 1 nutcracker -c "$TMP/nutcracker.yml" -s "$STATS_PORT" -a 127.0.0.1 -o "$TMP/nutcracker.log" &
TWEM_PID=$!
PIDS+=("$TWEM_PID")
GOMAXPROCS=1 taskset -c 1 "$BIN" --listen "127.0.0.1:$PROXY_PORT" --upstream "127.0.0.1:$REDIS_PORT" \
	--admin "" --log-level warn >"$TMP/proxy.log" 2>&1 &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
wait_pong "$TWEM_PORT"
wait_pong "$PROXY_PORT"

calls() { redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' | awk -F'[=,:]' -v c="cmdstat_$TEST" '$1 == c {print $3}'; }
events=syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_ctl,raw_syscalls:sys_enter
printf "layout\ttest\ttarget\trequests\tread\twrite\twritev\tepoll_wait\tepoll_ctl\tall\n"
for target in "twemproxy:$TWEM_PORT:$TWEM_PID" "redproxy:$PROXY_PORT:$PROXY_PID"; do
	IFS=: read -r name port pid <<<"$target"
	# Far more requests than the counted seconds take; killed after them.
	taskset -c 0 redis-benchmark -p "$port" -t "$TEST" -n 100000000 -r 100000 -d 64 -c 50 -P "$P" -q >/dev/null 2>&1 &
	bench=$!
	sleep 1 # connections up, past the start
	c0=$(calls)
	perf stat -x, -e "$events" -p "$pid" -o "$TMP/perf.$name" sleep "$SECONDS_COUNTED"
	c1=$(calls)
	kill "$bench"
	wait "$bench" 2>/dev/null || true
	awk -F, -v n=$((c1 - c0)) -v name="$name" -v layout="$LAYOUT" -v test="$TEST -P $P" '
		/sys_enter/ { split($3, a, ":"); ev = a[2]; sub("sys_enter_", "", ev); v[ev] = $1 / n }
		END {
			printf "%s\t%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\n", layout, test, name, n,
				v["read"], v["write"], v["writev"], v["epoll_wait"] + v["epoll_pwait"], v["epoll_ctl"], v["sys_enter"]
		}' "$TMP/perf.$name"
done
