#!/usr/bin/env bash
# bench/stampede.sh: the stampede scenario. Many clients read one cache key
# cache-aside through redproxy while the key keeps expiring; on a miss a
# client queries a slow "database" and writes the key back. Runs the same
# load with each stampede mode off and on and prints a Markdown table of
# database fetches, GETs that reached Redis and client latency (also written
# to bench/results/stampede.md). Also reachable as run.sh --scenario stampede.
#
# Usage: bench/stampede.sh [--quick] [--rounds N] [--keep]
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_DIR/.." && pwd)

ROUNDS=${ROUNDS:-3}
SCLIENTS=${SCLIENTS:-200}     # clients, one connection each
SDURATION=${SDURATION:-10s}   # per run
STTL=${STTL:-1s}              # TTL the clients give the key
SFILL=${SFILL:-50ms}          # one database query
STHINK=${STHINK:-10ms}        # pause between a client's requests
SRESP=${SRESP:-3}             # protocol the clients speak (2 or 3)
CPU_REDIS=${CPU_REDIS:-0}
CPU_CLIENT=${CPU_CLIENT:-0}
CPU_PROXY=${CPU_PROXY:-1}
REDPROXY_GOMAXPROCS=${REDPROXY_GOMAXPROCS:-1}
REDPROXY_BIN=${REDPROXY_BIN:-}
OUT=${OUT_STAMPEDE:-$BENCH_DIR/results/stampede.md}
KEEP=0

die() { echo "stampede.sh: $*" >&2; exit 1; }
log() { echo "== $*" >&2; }

while (($#)); do
	case $1 in
	--quick) ROUNDS=1 SDURATION=3s ;;
	--rounds) ROUNDS=${2:?--rounds needs N}; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown flag $1 (see --help)" ;;
	esac
	shift
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer"
for tool in redis-server redis-cli taskset go awk; do
	command -v "$tool" >/dev/null || die "$tool not found"
done
if (($(nproc) < 2)); then CPU_REDIS=0 CPU_CLIENT=0 CPU_PROXY=0; fi

# ---- processes and cleanup (every process is stopped by its PID) -----------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/redproxy-stampede.XXXXXX")
PIDS=()
stop_pid() {
	local pid=$1
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}
cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
	if ((KEEP)); then echo "stampede.sh: kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_pong() { # PORT PID NAME
	for _ in $(seq 200); do
		kill -0 "$2" 2>/dev/null || return 1
		[[ $(redis-cli -p "$1" ping 2>/dev/null) == PONG ]] && return 0
		sleep 0.05
	done
	return 1
}

log "building redproxy, benchtool and stampedetool"
mkdir -p "$TMP/bin"
go -C "$REPO" build -o "$TMP/bin/benchtool" ./bench/benchtool
go -C "$REPO" build -o "$TMP/bin/stampedetool" ./bench/stampedetool
if [[ -z $REDPROXY_BIN ]]; then
	go -C "$REPO" build -o "$TMP/bin/redproxy" ./cmd/redproxy
	REDPROXY_BIN=$TMP/bin/redproxy
fi
freeport() { "$TMP/bin/benchtool" freeport; }

REDIS_PORT=$(freeport)
mkdir -p "$TMP/redis"
taskset -c "$CPU_REDIS" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
	--dir "$TMP/redis" --logfile "$TMP/redis/redis.log" &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_pong "$REDIS_PORT" "$REDIS_PID" || die "redis-server did not start; see $TMP/redis/redis.log"

# ---- modes: the [stampede] section each run uses ---------------------------
MODES=(off coalesce hold refresh)
declare -A MODE_LABEL=(
	[off]="all off"
	[coalesce]="coalescing"
	[hold]="coalescing + miss hold"
	[refresh]="coalescing + miss hold + early refresh"
)
mode_config() {
	case $1 in
	off) printf '[stampede]\ncoalesce = false\n' ;;
	coalesce) printf '[stampede]\ncoalesce = true\n' ;;
	hold) printf '[stampede]\ncoalesce = true\n\n[[stampede.hold]]\npattern = "cache:*"\ntimeout = "2s"\n' ;;
	refresh) printf '[stampede]\ncoalesce = true\n\n[[stampede.hold]]\npattern = "cache:*"\ntimeout = "2s"\n\n[[stampede.early_refresh]]\npattern = "cache:*"\nbeta = 1.0\n' ;;
	esac
}

# run_mode ROUND MODE: one redproxy with MODE's config, one load run.
RECORDS=$TMP/records.tsv
: >"$RECORDS"
run_mode() {
	local round=$1 mode=$2 port admin pid line
	mode_config "$mode" >"$TMP/$mode.toml"
	port=$(freeport)
	admin=$(freeport)
	GOMAXPROCS=$REDPROXY_GOMAXPROCS taskset -c "$CPU_PROXY" "$REDPROXY_BIN" --config "$TMP/$mode.toml" \
		--listen "127.0.0.1:$port" --upstream "127.0.0.1:$REDIS_PORT" --admin "127.0.0.1:$admin" \
		--local-tier off --log-level warn >"$TMP/redproxy-$mode-$round.log" 2>&1 &
	pid=$!
	PIDS+=("$pid")
	wait_pong "$port" "$pid" || { cat "$TMP/redproxy-$mode-$round.log" >&2; die "redproxy ($mode) did not start"; }
	line=$(taskset -c "$CPU_CLIENT" "$TMP/bin/stampedetool" -addr "127.0.0.1:$port" -redis "127.0.0.1:$REDIS_PORT" \
		-clients "$SCLIENTS" -duration "$SDURATION" -ttl "$STTL" -fill "$SFILL" -think "$STHINK" -resp "$SRESP") ||
		die "stampedetool failed against redproxy ($mode)"
	stop_pid "$pid"
	unset "PIDS[${#PIDS[@]}-1]"
	printf '   round %s %-9s %s\n' "$round" "$mode" "$line" >&2
	printf '%s\t%s\t%s\n' "$round" "$mode" "$line" >>"$RECORDS"
}

for ((round = 1; round <= ROUNDS; round++)); do
	log "round $round/$ROUNDS"
	# Rotate the starting mode so drift hits every mode alike.
	for ((i = 0; i < ${#MODES[@]}; i++)); do
		run_mode "$round" "${MODES[(i + round - 1) % ${#MODES[@]}]}"
	done
done

# ---- report: medians over rounds per mode ----------------------------------
labels=""
for m in "${MODES[@]}"; do labels+="$m=${MODE_LABEL[$m]};"; done
{
	echo "# redproxy bench: stampede"
	echo
	echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "- Machine: $(nproc) CPUs, $(lscpu 2>/dev/null | awk -F: '/^Model name/ {gsub(/^ +/, "", $2); print $2; exit}'), $(uname -sr)"
	echo "- Versions: $(redis-server --version | awk '{print $1, $2, $3}'), redproxy $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown), $(go version | awk '{print $3}')"
	echo "- Load: $SCLIENTS clients (one connection each) read one key cache-aside for $SDURATION per run; on a miss a client queries the database ($SFILL) and SETs the key with a $STTL TTL; $STHINK between a client's requests; clients speak RESP$SRESP; $ROUNDS round(s), medians"
	echo "- Layout (taskset CPU lists): redis-server $CPU_REDIS, clients $CPU_CLIENT, redproxy $CPU_PROXY (GOMAXPROCS=$REDPROXY_GOMAXPROCS)"
	echo
	awk -F'\t' -v order="${MODES[*]}" -v labels="$labels" '
	function median(key,   n, i, j, a, tmp) {
		n = split(vals[key], a, " ")
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { tmp = a[j]; a[j] = a[j-1]; a[j-1] = tmp }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{
		n = split($3, kvs, " ")
		for (i = 1; i <= n; i++) {
			split(kvs[i], kv, "=")
			k = $2 SUBSEP kv[1]
			vals[k] = (k in vals) ? vals[k] " " kv[2] : kv[2]
		}
	}
	END {
		split(labels, lp, ";"); for (i in lp) if (split(lp[i], kv, "=") == 2) label[kv[1]] = kv[2]
		nm = split(order, modes, " ")
		print "| Mode | database fetches | per expiry | GETs reaching Redis | per request | requests | p50 ms | p99 ms | max ms |"
		print "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
		for (i = 1; i <= nm; i++) {
			m = modes[i]
			req = median(m SUBSEP "requests"); db = median(m SUBSEP "db_fetches"); gets = median(m SUBSEP "redis_gets")
			nexp = median(m SUBSEP "expiries")
			printf "| %s | %d | %.1f | %d | %.3f | %d | %.3f | %.3f | %.3f |\n", label[m], db, db / (nexp > 0 ? nexp : 1),
				gets, gets / (req > 0 ? req : 1), req,
				median(m SUBSEP "p50_ms"), median(m SUBSEP "p99_ms"), median(m SUBSEP "max_ms")
		}
	}' "$RECORDS"
	echo
	echo "A request is one cache-aside read as the application sees it, including the database query when it missed. \"per expiry\" divides database fetches by the number of TTL periods in a run."
} >"$TMP/report.md"
mkdir -p "$(dirname "$OUT")"
cp "$TMP/report.md" "$OUT"
{
	printf "round\tmode\tresult\n"
	cat "$RECORDS"
} >"${OUT%.md}-rounds.tsv"
cat "$TMP/report.md"
log "wrote $OUT and ${OUT%.md}-rounds.tsv"
