#!/usr/bin/env bash
# bench/cluster.sh: the cluster scenario (issue 12). Starts a Redis Cluster
# of PRIMARIES primaries (no replicas) on free loopback ports and redproxy in
# front of it (upstream.mode = "cluster"), then runs GET and SET at -P 1 and
# -P 16 interleaved: redis-benchmark --cluster straight to the nodes (a
# cluster-aware client, the ceiling) and plain redis-benchmark through
# redproxy (a client with no cluster support). Prints a Markdown table with
# throughput, p99 and CPU per request of the proxy and of all Redis nodes
# together (also written to bench/results/cluster.md). Also reachable as
# run.sh --scenario cluster.
#
# Usage: bench/cluster.sh [--quick] [--rounds N] [--keep]
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_DIR/.." && pwd)

ROUNDS=${ROUNDS:-3}
PRIMARIES=${PRIMARIES:-3}
N_P1=${N_P1:-100000}
N_P16=${N_P16:-1000000}
CLIENTS=${CLIENTS:-50}
KEYSPACE=${KEYSPACE:-100000}
DATASIZE=${DATASIZE:-64}
CPU_REDIS=${CPU_REDIS:-0}
CPU_CLIENT=${CPU_CLIENT:-0}
CPU_PROXY=${CPU_PROXY:-1}
REDPROXY_GOMAXPROCS=${REDPROXY_GOMAXPROCS:-1}
REDPROXY_BIN=${REDPROXY_BIN:-}
OUT=${OUT_CLUSTER:-$BENCH_DIR/results/cluster.md}
KEEP=0

SCRIPT_NAME=cluster.sh
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

while (($#)); do
	case $1 in
	--quick) ROUNDS=1 N_P1=20000 N_P16=200000 ;;
	--rounds) ROUNDS=${2:?--rounds needs N}; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown flag $1 (see --help)" ;;
	esac
	shift
done
bench_init

PORTS=() NODE_PIDS=() addrs=()
for ((i = 0; i < PRIMARIES; i++)); do
	start_redis "$TMP/node$i" --cluster-enabled yes --cluster-config-file "$TMP/node$i/nodes.conf"
	NODE_PIDS+=("$REDIS_PID") PORTS+=("$REDIS_PORT") addrs+=("127.0.0.1:$REDIS_PORT")
done
redis-cli --cluster create "${addrs[@]}" --cluster-yes >"$TMP/create.log" 2>&1 || { cat "$TMP/create.log" >&2; die "cluster create failed"; }
for _ in $(seq 200); do
	ok=1
	for port in "${PORTS[@]}"; do
		redis-cli -p "$port" cluster info | grep -q '^cluster_state:ok' || ok=0
	done
	((ok)) && break
	sleep 0.05
done
((ok)) || die "cluster never reached cluster_state:ok"
log "cluster of $PRIMARIES primaries on ports ${PORTS[*]} (cpu $CPU_REDIS)"

PROXY_PORT=$(freeport)
seeds=$(printf '"%s",' "${addrs[@]}")
cat >"$TMP/redproxy.toml" <<EOF
[server]
listen = "127.0.0.1:$PROXY_PORT"
admin = ""
log_level = "warn"

[upstream]
mode = "cluster"
seeds = [${seeds%,}]
EOF
start_proxy "$TMP/redproxy.toml" "$TMP/redproxy.log"
wait_pong "$PROXY_PORT"
log "redproxy pid $PROXY_PID port $PROXY_PORT (cpu $CPU_PROXY, GOMAXPROCS=$REDPROXY_GOMAXPROCS)"

# Every key the runs touch exists, so GET returns a value (through the
# proxy, which splits nothing here: one SET per key).
preload "$PROXY_PORT"

RECORDS=$TMP/records.tsv
: >"$RECORDS"
# run ROUND TEST TARGET N ARGS...
run() {
	local round=$1 test=$2 target=$3 n=$4
	shift 4
	local args=(-c "$CLIENTS" -n "$n" -r "$KEYSPACE" -d "$DATASIZE" --csv "$@")
	if [[ $target == direct ]]; then args=(--cluster -p "${PORTS[0]}" "${args[@]}"); else args=(-p "$PROXY_PORT" "${args[@]}"); fi
	local r0 p0 r1 p1 csv
	r0=$(cpu_us "${NODE_PIDS[@]}") p0=$(cpu_us "$PROXY_PID")
	csv=$(taskset -c "$CPU_CLIENT" redis-benchmark "${args[@]}" 2>"$TMP/bench.err") || { cat "$TMP/bench.err" >&2; die "redis-benchmark failed: $test $target"; }
	r1=$(cpu_us "${NODE_PIDS[@]}") p1=$(cpu_us "$PROXY_PID")
	local rps p99
	# --cluster prints the node list before the CSV: take the line after
	# the CSV header.
	read -r rps p99 < <(bench_csv "$csv")
	[[ -n $p99 ]] || die "no result from redis-benchmark: $test $target: $csv"
	printf '   round %s %-8s %-7s %10s req/s  p99 %7s ms\n' "$round" "$test" "$target" "$rps" "$p99" >&2
	[[ $round == w ]] && return
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$test" "$target" "$n" "$rps" "$p99" $((r1 - r0)) $((p1 - p0)) >>"$RECORDS"
}

tests=("get_p1|GET -P 1|$N_P1|-t get -P 1" "set_p1|SET -P 1|$N_P1|-t set -P 1"
	"get_p16|GET -P 16|$N_P16|-t get -P 16" "set_p16|SET -P 16|$N_P16|-t set -P 16")
targets=(direct redproxy)
log "warm-up (not recorded)"
for spec in "${tests[@]}"; do
	IFS='|' read -r name label n args <<<"$spec"
	# shellcheck disable=SC2086
	for t in "${targets[@]}"; do run w "$name" "$t" $((n / 10)) $args; done
done
for ((round = 1; round <= ROUNDS; round++)); do
	for spec in "${tests[@]}"; do
		IFS='|' read -r name label n args <<<"$spec"
		# Alternate which target goes first, so drift hits both alike.
		if ((round % 2)); then order=(direct redproxy); else order=(redproxy direct); fi
		# shellcheck disable=SC2086
		for t in "${order[@]}"; do run "$round" "$name" "$t" "$n" $args; done
	done
done

mkdir -p "$(dirname "$OUT")"
{
	echo "# redproxy bench: cluster"
	echo
	echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "- Cluster: $PRIMARIES primaries, no replicas, all on cpu $CPU_REDIS; redis-benchmark on cpu $CPU_CLIENT; redproxy on cpu $CPU_PROXY (GOMAXPROCS=$REDPROXY_GOMAXPROCS)"
	echo "- Versions: $(redis-server --version | awk '{print $3}'), redproxy $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)"
	echo "- Settings: $ROUNDS round(s), -c $CLIENTS, -r $KEYSPACE, -d $DATASIZE, -n $N_P1 at -P 1 and $N_P16 at -P 16"
	echo "- direct: redis-benchmark --cluster (a cluster-aware client) to the nodes; redproxy: plain redis-benchmark to redproxy"
	echo
	echo "| Test | Target | req/s | vs direct | p99 ms | CPU µs/req Redis (all nodes) | CPU µs/req proxy |"
	echo "|---|---|---:|---:|---:|---:|---:|"
	for spec in "${tests[@]}"; do
		IFS='|' read -r name label _ _ <<<"$spec"
		awk -F'\t' -v test="$name" -v label="$label" '
			function median(a, n,   i, j, t) {
				for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
				return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
			}
			$1 == test {
				k = $2; c[k]++
				rps[k, c[k]] = $4; p99[k, c[k]] = $5
				rcpu[k, c[k]] = $6 / $3; pcpu[k, c[k]] = $7 / $3
			}
			END {
				for (ti = 1; ti <= 2; ti++) {
					k = ti == 1 ? "direct" : "redproxy"
					n = c[k]; if (!n) continue
					for (i = 1; i <= n; i++) { a1[i] = rps[k, i]; a2[i] = p99[k, i]; a3[i] = rcpu[k, i]; a4[i] = pcpu[k, i] }
					m[k] = median(a1, n)
					pc = k == "direct" ? "–" : sprintf("%.2f", median(a4, n))
					printf "| %s | %s | %.0f | %.2f× | %.3f | %.2f | %s |\n", label, k, m[k], m[k] / (m["direct"] ? m["direct"] : m[k]), median(a2, n), median(a3, n), pc
				}
			}' "$RECORDS"
	done
	echo
	echo "Medians over rounds. CPU µs/req = CPU time the processes spent during the run ÷ requests."
} >"$OUT"
cat "$OUT"
log "wrote $OUT"
