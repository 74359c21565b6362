#!/usr/bin/env bash
# bench/routes.sh: the routed scenario (issue 14). Starts two setups on free
# loopback ports: "one", redproxy in front of one redis-server; "two",
# redproxy in front of two redis-servers, [upstream] (a) and
# [upstreams.b], with a [[route]] sending the keys whose last digit is even
# (pattern "key:*[02468]") to b, which splits redis-benchmark's -r keys
# (key:__rand_int__) in halves. Both get the same KEYSPACE keys preloaded,
# then GET and SET at -P 1 and -P 16 run through each proxy, interleaved.
# Prints a Markdown table with throughput, the ratio two/one, p99, CPU per
# request of the proxy and of each Redis, and the GETs and SETs each Redis
# ran (INFO commandstats: the split) (also written to
# bench/results/routes.md). Also reachable as run.sh --scenario routes.
#
# Usage: bench/routes.sh [--quick] [--rounds N] [--keep]
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_DIR/.." && pwd)

ROUNDS=${ROUNDS:-3}
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
OUT=${OUT_ROUTES:-$BENCH_DIR/results/routes.md}
ROUTE_PATTERN='key:*[02468]'
KEEP=0

SCRIPT_NAME=routes.sh
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

while (($#)); do
	case $1 in
	--quick) ROUNDS=1 N_P1=20000 N_P16=200000 KEYSPACE=20000 ;;
	--rounds) ROUNDS=${2:?--rounds needs N}; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown flag $1 (see --help)" ;;
	esac
	shift
done
bench_init

# redis NAME: starts a redis-server; sets REDIS_PORT and REDIS_PID.
redis() { start_redis "$TMP/$1"; }

# proxy NAME CONFIG-TAIL: starts redproxy with [server] and CONFIG-TAIL;
# sets PROXY_PORT and PROXY_PID.
proxy() {
	PROXY_PORT=$(freeport)
	{
		printf '[server]\nlisten = "127.0.0.1:%s"\nadmin = ""\nlog_level = "warn"\n\n' "$PROXY_PORT"
		printf '%s\n' "$2"
	} >"$TMP/$1.toml"
	start_proxy "$TMP/$1.toml" "$TMP/$1.log"
	wait_pong "$PROXY_PORT"
}

redis one_a
ONE_A_PORT=$REDIS_PORT ONE_A_PID=$REDIS_PID
redis two_a
TWO_A_PORT=$REDIS_PORT TWO_A_PID=$REDIS_PID
redis two_b
TWO_B_PORT=$REDIS_PORT TWO_B_PID=$REDIS_PID
preload "$ONE_A_PORT" all
preload "$TWO_A_PORT" odd
preload "$TWO_B_PORT" even

proxy one "[upstream]
address = \"127.0.0.1:$ONE_A_PORT\""
ONE_PORT=$PROXY_PORT ONE_PID=$PROXY_PID
proxy two "[upstream]
address = \"127.0.0.1:$TWO_A_PORT\"

[upstreams.b]
address = \"127.0.0.1:$TWO_B_PORT\"

[[route]]
pattern = \"$ROUTE_PATTERN\"
upstream = \"b\""
TWO_PORT=$PROXY_PORT TWO_PID=$PROXY_PID
log "one: redproxy $ONE_PORT -> redis $ONE_A_PORT; two: redproxy $TWO_PORT -> a $TWO_A_PORT, b $TWO_B_PORT ($ROUTE_PATTERN)"

RECORDS=$TMP/records.tsv
: >"$RECORDS"
TESTS="get_p1 set_p1 get_p16 set_p16"

# run ROUND TEST TARGET: one redis-benchmark run through TARGET's proxy;
# records its figures unless ROUND is 0 (warm-up).
run() {
	local round=$1 test=$2 target=$3 cmd=${2%_p*} pipe=${2#*_p} n
	n=$N_P1
	((pipe > 1)) && n=$N_P16
	((round == 0)) && n=$((n / 10))
	local port pp pa pb=""
	if [[ $target == one ]]; then
		port=$ONE_PORT pp=$ONE_PID pa=$ONE_A_PID
		redis-cli -p "$ONE_A_PORT" config resetstat >/dev/null
	else
		port=$TWO_PORT pp=$TWO_PID pa=$TWO_A_PID pb=$TWO_B_PID
		redis-cli -p "$TWO_A_PORT" config resetstat >/dev/null
		redis-cli -p "$TWO_B_PORT" config resetstat >/dev/null
	fi
	local x0 a0 b0=0 csv
	x0=$(cpu_us "$pp") a0=$(cpu_us "$pa")
	[[ -n $pb ]] && b0=$(cpu_us "$pb")
	csv=$(taskset -c "$CPU_CLIENT" redis-benchmark -p "$port" -c "$CLIENTS" -n "$n" -r "$KEYSPACE" -d "$DATASIZE" -t "$cmd" -P "$pipe" --csv 2>"$TMP/bench.err") ||
		{ cat "$TMP/bench.err" >&2; die "redis-benchmark failed"; }
	local x1 a1 b1=0
	x1=$(cpu_us "$pp") a1=$(cpu_us "$pa")
	[[ -n $pb ]] && b1=$(cpu_us "$pb")
	local rps p99 ca cb=0
	read -r rps p99 < <(bench_csv "$csv")
	[[ -n $p99 ]] || die "no result from redis-benchmark: $csv"
	if [[ $target == one ]]; then
		ca=$(calls "$ONE_A_PORT" "$cmd")
	else
		ca=$(calls "$TWO_A_PORT" "$cmd") cb=$(calls "$TWO_B_PORT" "$cmd")
	fi
	printf '   round %s %-8s %-3s %10s req/s  p99 %7s ms  %s on a %s, on b %s\n' "$round" "$test" "$target" "$rps" "$p99" "${cmd^^}s" "$ca" "$cb" >&2
	((round == 0)) && return
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$test" "$target" "$n" "$rps" "$p99" "$ca" "$cb" $((x1 - x0)) $((a1 - a0)) $((b1 - b0)) >>"$RECORDS"
}

for ((round = 0; round <= ROUNDS; round++)); do
	for test in $TESTS; do
		# Alternate which target goes first so drift favours neither.
		if ((round % 2)); then
			run "$round" "$test" two
			run "$round" "$test" one
		else
			run "$round" "$test" one
			run "$round" "$test" two
		fi
	done
done

mkdir -p "$(dirname "$OUT")"
{
	echo "# redproxy bench: routes (two upstreams)"
	echo
	echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "- Redis (all) on cpu $CPU_REDIS; redis-benchmark on cpu $CPU_CLIENT; redproxy on cpu $CPU_PROXY (GOMAXPROCS=$REDPROXY_GOMAXPROCS)"
	echo "- Versions: $(redis-server --version | awk '{print $3}'), redproxy $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)"
	echo "- Settings: $ROUNDS round(s), -c $CLIENTS, -r $KEYSPACE, -d $DATASIZE, -n $N_P1 (-P 1) / $N_P16 (-P 16); one: one upstream; two: [upstream] a and [upstreams.b] with route \"$ROUTE_PATTERN\" -> b"
	echo
	echo "| Test | Upstreams | req/s | two/one | p99 ms | CPU µs/req proxy | CPU µs/req Redis a | CPU µs/req Redis b | commands on a | commands on b |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
	awk -F'\t' -v tests="$TESTS" '
		function median(a, n,   i, j, t) {
			for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		{
			k = $1 SUBSEP $2; c[k]++; i = c[k]
			rps[k, i] = $4; p99[k, i] = $5; ca[k, i] = $6; cb[k, i] = $7
			xc[k, i] = $8 / $3; ac[k, i] = $9 / $3; bc[k, i] = $10 / $3
		}
		END {
			nt = split(tests, ts, " ")
			for (t = 1; t <= nt; t++) {
				for (g = 1; g <= 2; g++) {
					tg = g == 1 ? "one" : "two"
					k = ts[t] SUBSEP tg; n = c[k]; if (!n) continue
					for (i = 1; i <= n; i++) { a1[i] = rps[k, i]; a2[i] = p99[k, i]; a3[i] = xc[k, i]; a4[i] = ac[k, i]; a5[i] = bc[k, i]; a6[i] = ca[k, i]; a7[i] = cb[k, i] }
					m[tg] = median(a1, n)
					ratio = tg == "two" && m["one"] ? sprintf("%.2f", m["two"] / m["one"]) : ""
					b = tg == "two"
					printf "| %s | %s | %.0f | %s | %.3f | %.2f | %.2f | %s | %d | %s |\n", ts[t], tg, m[tg], ratio, median(a2, n), median(a3, n), median(a4, n), b ? sprintf("%.2f", median(a5, n)) : "", median(a6, n), b ? sprintf("%d", median(a7, n)) : ""
				}
			}
		}' "$RECORDS"
	echo
	echo "Medians over rounds. two/one = req/s through the routed proxy ÷ req/s through the one-upstream proxy. Commands: GETs or SETs each Redis ran during the run (INFO commandstats, reset before it). CPU µs/req = CPU time the process spent during the run ÷ requests."
} >"$OUT"
cat "$OUT"
log "wrote $OUT"
