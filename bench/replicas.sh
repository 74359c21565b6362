#!/usr/bin/env bash
# bench/replicas.sh: the replica-reads scenario (issue 14). For 0, 1 and 2
# replicas, starts a primary (and its replicas, --replicaof) on free
# loopback ports and redproxy in front of it (read_from = "primary" with 0
# replicas, "replica_preferred" otherwise), fills KEYSPACE keys on the
# primary, waits for the replicas to apply them, then runs GET at -P 16
# through redproxy. Prints a Markdown table with throughput, p99, how many
# GETs the primary and the replicas ran (INFO commandstats: the primary's
# stays flat with replicas) and CPU per request of the primary and of the
# replicas (also written to bench/results/replicas.md).
#
# Usage: bench/replicas.sh [--quick] [--rounds N] [--keep]
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_DIR/.." && pwd)

ROUNDS=${ROUNDS:-3}
N_P16=${N_P16:-1000000}
CLIENTS=${CLIENTS:-50}
KEYSPACE=${KEYSPACE:-100000}
DATASIZE=${DATASIZE:-64}
CPU_REDIS=${CPU_REDIS:-0}
CPU_CLIENT=${CPU_CLIENT:-0}
CPU_PROXY=${CPU_PROXY:-1}
REDPROXY_GOMAXPROCS=${REDPROXY_GOMAXPROCS:-1}
REDPROXY_BIN=${REDPROXY_BIN:-}
OUT=${OUT_REPLICAS:-$BENCH_DIR/results/replicas.md}
KEEP=0

SCRIPT_NAME=replicas.sh
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

while (($#)); do
	case $1 in
	--quick) ROUNDS=1 N_P16=200000 KEYSPACE=20000 ;;
	--rounds) ROUNDS=${2:?--rounds needs N}; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown flag $1 (see --help)" ;;
	esac
	shift
done
bench_init

RECORDS=$TMP/records.tsv
: >"$RECORDS"

# scenario REPLICAS: one primary with REPLICAS replicas and a proxy; records
# every round's figures.
scenario() {
	local nrep=$1 dir=$TMP/r$1 i port
	mkdir -p "$dir"
	local pport
	start_redis "$dir/primary" --repl-diskless-sync-delay 0
	pport=$REDIS_PORT
	local primary_pid=$REDIS_PID
	local rports=() rpids=()
	for ((i = 0; i < nrep; i++)); do
		start_redis "$dir/replica$i" --replicaof 127.0.0.1 "$pport"
		rpids+=("$REDIS_PID") rports+=("$REDIS_PORT")
	done
	preload "$pport"
	# Every replica online and at the primary's offset.
	local ok
	for _ in $(seq 400); do
		ok=1
		local off
		off=$(redis-cli -p "$pport" info replication | awk -F: '/^master_repl_offset/ { print $2+0 }')
		for port in "${rports[@]}"; do
			[[ $(redis-cli -p "$port" info replication | awk -F: '/^slave_repl_offset/ { print $2+0 }') == "$off" ]] || ok=0
		done
		((ok)) && break
		sleep 0.05
	done
	((ok)) || die "replicas never caught up with the primary"

	local readfrom=primary
	((nrep > 0)) && readfrom=replica_preferred
	local proxy_port
	proxy_port=$(freeport)
	cat >"$dir/redproxy.toml" <<EOF
[server]
listen = "127.0.0.1:$proxy_port"
admin = ""
log_level = "warn"

[upstream]
address = "127.0.0.1:$pport"
read_from = "$readfrom"
EOF
	start_proxy "$dir/redproxy.toml" "$dir/redproxy.log"
	local proxy_pid=$PROXY_PID
	wait_pong "$proxy_port"
	log "$nrep replica(s): primary $pport, replicas ${rports[*]:-none}, redproxy $proxy_port (read_from = $readfrom)"

	local round n
	for ((round = 0; round <= ROUNDS; round++)); do
		n=$N_P16
		((round == 0)) && n=$((N_P16 / 10)) # warm-up, not recorded
		for port in "$pport" "${rports[@]}"; do redis-cli -p "$port" config resetstat >/dev/null; done
		local p0 r0 x0 csv
		p0=$(cpu_us "$primary_pid") r0=0 x0=$(cpu_us "$proxy_pid")
		((nrep > 0)) && r0=$(cpu_us "${rpids[@]}")
		csv=$(taskset -c "$CPU_CLIENT" redis-benchmark -p "$proxy_port" -c "$CLIENTS" -n "$n" -r "$KEYSPACE" -d "$DATASIZE" -t get -P 16 --csv 2>"$TMP/bench.err") ||
			{ cat "$TMP/bench.err" >&2; die "redis-benchmark failed"; }
		local p1 r1=0 x1
		p1=$(cpu_us "$primary_pid") x1=$(cpu_us "$proxy_pid")
		((nrep > 0)) && r1=$(cpu_us "${rpids[@]}")
		local rps p99 pg rg=0
		read -r rps p99 < <(bench_csv "$csv")
		[[ -n $p99 ]] || die "no result from redis-benchmark: $csv"
		pg=$(calls "$pport" get)
		for port in "${rports[@]}"; do rg=$((rg + $(calls "$port" get))); done
		printf '   %d replica(s) round %s %10s req/s  p99 %7s ms  GETs primary %s replicas %s\n' "$nrep" "$round" "$rps" "$p99" "$pg" "$rg" >&2
		((round == 0)) && continue
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$nrep" "$n" "$rps" "$p99" "$pg" "$rg" $((p1 - p0)) $((r1 - r0)) $((x1 - x0)) >>"$RECORDS"
	done
	stop_all
}

for nrep in 0 1 2; do scenario "$nrep"; done

mkdir -p "$(dirname "$OUT")"
{
	echo "# redproxy bench: replica reads"
	echo
	echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "- Redis (primary and replicas) on cpu $CPU_REDIS; redis-benchmark on cpu $CPU_CLIENT; redproxy on cpu $CPU_PROXY (GOMAXPROCS=$REDPROXY_GOMAXPROCS)"
	echo "- Versions: $(redis-server --version | awk '{print $3}'), redproxy $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)"
	echo "- Settings: $ROUNDS round(s), GET -P 16, -c $CLIENTS, -r $KEYSPACE, -d $DATASIZE, -n $N_P16; read_from = primary with 0 replicas, replica_preferred with 1 and 2"
	echo
	echo "| Replicas | req/s | p99 ms | GETs on the primary | GETs on the replicas | CPU µs/req primary | CPU µs/req replicas | CPU µs/req proxy |"
	echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
	awk -F'\t' '
		function median(a, n,   i, j, t) {
			for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		{
			k = $1; c[k]++; i = c[k]
			rps[k, i] = $3; p99[k, i] = $4; pg[k, i] = $5; rg[k, i] = $6
			pc[k, i] = $7 / $2; rc[k, i] = $8 / $2; xc[k, i] = $9 / $2
		}
		END {
			for (k = 0; k <= 2; k++) {
				n = c[k]; if (!n) continue
				for (i = 1; i <= n; i++) { a1[i] = rps[k, i]; a2[i] = p99[k, i]; a3[i] = pg[k, i]; a4[i] = rg[k, i]; a5[i] = pc[k, i]; a6[i] = rc[k, i]; a7[i] = xc[k, i] }
				printf "| %d | %.0f | %.3f | %d | %d | %.2f | %.2f | %.2f |\n", k, median(a1, n), median(a2, n), median(a3, n), median(a4, n), median(a5, n), median(a6, n), median(a7, n)
			}
		}' "$RECORDS"
	echo
	echo "Medians over rounds. GETs: INFO commandstats after each round (reset before it). CPU µs/req = CPU time the processes spent during the run ÷ requests."
} >"$OUT"
cat "$OUT"
log "wrote $OUT"
