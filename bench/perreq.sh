#!/usr/bin/env bash
# bench/perreq.sh: per-request cost of one or more redproxy binaries, the
# measures that stay meaningful on a loaded machine: CPU µs per request of
# the proxy and of Redis behind it, context switches (all threads) and
# system calls (perf stat raw_syscalls:sys_enter) per request. Binaries
# (or wrapper scripts that exec one, to set environment) run interleaved
# against one redis-server, each round in the same order.
#
# Usage: bench/perreq.sh BIN [BIN ...]
# Environment: ROUNDS (3) N (requests at -P 1, 200000; x4 at -P 16)
#   TESTS ("get:1 set:1 get:16", command:pipeline[:keyspace], keyspace
#   100000 by default; get:16:100 reads 100 hot keys) GMP (GOMAXPROCS, 1)
#   CPU_PROXY (1) CPU_OTHER (0: Redis and redis-benchmark)
# Needs redis-server, redis-benchmark, redis-cli, perf, taskset; run as a
# user perf may trace (root here). Only 127.0.0.1 is used.
set -euo pipefail
ROUNDS=${ROUNDS:-3} N=${N:-200000} TESTS=${TESTS:-"get:1 set:1 get:16"}
GMP=${GMP:-1} CPU_PROXY=${CPU_PROXY:-1} CPU_OTHER=${CPU_OTHER:-0}
(($#)) || { sed -n '2,14p' "$0"; exit 2; }
TMP=$(mktemp -d)
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; } # utime+stime, clock ticks (100/s)
ctxsw() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/voluntary_ctxt/{s+=$2} END{print s}'; }
REDIS_PORT=$(freeport) PROXY_PID=""
taskset -c "$CPU_OTHER" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$TMP/redis.log" 2>&1 &
REDIS_PID=$!
cleanup() {
	[[ -n $PROXY_PID ]] && kill "$PROXY_PID" 2>/dev/null
	kill "$REDIS_PID" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
# Every key redis-benchmark names at the default keyspace holds a value, so
# reads of a small keyspace (hot keys) are never of missing keys.
redis-cli -p "$REDIS_PORT" eval "for i = 0, 99999 do redis.call('SET', string.format('key:%012d', i), string.rep('x', 64)) end" 0 >/dev/null
printf "bin\ttest\tround\tkrps\tp99ms\tproxy_us\tredis_us\tctxsw\tsyscalls\n"
for round in $(seq 1 "$ROUNDS"); do
	for t in $TESTS; do
		for bin in "$@"; do
			port=$(freeport)
			GOMAXPROCS=$GMP taskset -c "$CPU_PROXY" "$bin" --listen "127.0.0.1:$port" \
				--upstream "127.0.0.1:$REDIS_PORT" --admin "" --log-level warn >"$TMP/proxy.log" 2>&1 &
			PROXY_PID=$!
			for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
			IFS=: read -r cmd P R <<<"$t"
			R=${R:-100000} n=$N
			((P > 1)) && n=$((N * 4))
			redis-benchmark -p "$port" -q -t "$cmd" -n 20000 -r "$R" -d 64 -c 50 -P "$P" >/dev/null # warm up
			t0=$(ticks $PROXY_PID) r0=$(ticks $REDIS_PID) c0=$(ctxsw $PROXY_PID)
			perf stat -x, -e raw_syscalls:sys_enter -p "$PROXY_PID" -o "$TMP/perf" &
			perf_pid=$!
			sleep 0.2
			out=$(taskset -c "$CPU_OTHER" redis-benchmark -p "$port" -t "$cmd" -n "$n" -r "$R" -d 64 -c 50 -P "$P" --precision 3 --csv 2>/dev/null | tail -1)
			kill -INT $perf_pid
			wait $perf_pid 2>/dev/null || true
			t1=$(ticks $PROXY_PID) r1=$(ticks $REDIS_PID) c1=$(ctxsw $PROXY_PID)
			kill "$PROXY_PID"
			wait "$PROXY_PID" 2>/dev/null || true
			PROXY_PID=""
			# --csv: "test","rps","avg","min","p50","p95","p99","max"
			awk -F'","' -v b="$(basename "$bin")" -v t="$t" -v r="$round" -v n="$n" \
				-v dt=$((t1 - t0)) -v dr=$((r1 - r0)) -v dc=$((c1 - c0)) \
				-v sc="$(awk -F, '/raw_syscalls/{print $1}' "$TMP/perf")" \
				'{printf "%s\t%s\t%d\t%.1f\t%s\t%.2f\t%.2f\t%.2f\t%.2f\n", b, t, r, $2/1000, $7, dt*1e4/n, dr*1e4/n, dc/n, sc/n}' <<<"$out"
		done
	done
done
