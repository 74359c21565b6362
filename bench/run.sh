#!/usr/bin/env bash
# bench/run.sh: compare Redis directly, twemproxy and redproxy in one run.
#
# Starts its own redis-server, nutcracker (twemproxy) and redproxy on free
# loopback ports, pins them to cores, runs redis-benchmark against each target
# interleaved over several rounds, and prints a Markdown table (also written
# to bench/results/latest.md). See bench/README.md for the core layouts, the
# scenarios and the meaning of every column.
#
# Usage: bench/run.sh [--quick] [--rounds N] [--scenario NAME]
#                     [--layout split|shared|both] [--targets a,b]
#                     [--tests x,y] [--extra-proxy NAME=PATH] [--check] [--keep]
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/nutcracker.sh
source "$BENCH_DIR/nutcracker.sh"

# ---- settings (environment overrides; flags below override these) ---------
ROUNDS=${ROUNDS:-3}
N_P1_SET=${N_P1+set}
N_P1=${N_P1:-200000}      # requests per -P 1 run (~3-5 s on the reference machine)
N_P16=${N_P16:-2000000}   # requests per -P 16 run
CLIENTS=${CLIENTS:-50}
KEYSPACE_SET=${KEYSPACE+set} DATASIZE_SET=${DATASIZE+set} # --scenario large has its own defaults
KEYSPACE=${KEYSPACE:-100000}
DATASIZE=${DATASIZE:-64}
# Core layouts (taskset CPU lists for redis-server, redis-benchmark and the
# proxy under test); see README "Core layouts". CPU_REDIS, CPU_CLIENT and
# CPU_PROXY in the environment define a "custom" layout instead.
declare -A LAYOUT_CPUS=(
	[split]="0 0 1"  # Redis and the client share cpu0; the proxy has cpu1 alone
	[shared]="1 0 1" # the client has cpu0 alone; Redis and the proxy share cpu1
)
LAYOUT_ORDER="split shared"
LAYOUTS=()
LAYOUT=""
CPU_REDIS=${CPU_REDIS:-} CPU_CLIENT=${CPU_CLIENT:-} CPU_PROXY=${CPU_PROXY:-}
REDPROXY_GOMAXPROCS=${REDPROXY_GOMAXPROCS:-1}
MAX_OTHER=${MAX_OTHER:-0.2}     # cores other work may use during a run before it is repeated
RETRIES=${RETRIES:-} # default 3; 0 with --quick, a smoke test that should stay short
RETRY_PAUSE=${RETRY_PAUSE:-5}
REDPROXY_BIN=${REDPROXY_BIN:-}     # prebuilt binary; default: build ./cmd/redproxy
REDPROXY_ARGS=${REDPROXY_ARGS:-}   # extra flags for redproxy
OUT=${OUT:-$BENCH_DIR/results/latest.md}
IDLE_CONNS=${IDLE_CONNS:-10000,50000} # --scenario idle: connection counts
SCENARIO=passthrough
ONLY_TARGETS=""
ONLY_TESTS=""
CHECK=0
KEEP=0
EXTRA_SPECS=() # --extra-proxy NAME=PATH [ARGS]: more proxies benchmarked like redproxy

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
	cat <<EOF

Flags:
  --quick          1 round with small -n (smoke test, numbers are noisy)
  --rounds N       interleaved rounds (default $ROUNDS); medians are reported
  --scenario NAME  one of: $(declare -F | awk '$3 ~ /^scenario_/ {sub("scenario_", "", $3); printf "%s ", $3}')
  --layout L       split (default: Redis + client on cpu0, proxy alone on cpu1),
                   shared (client alone on cpu0, Redis + proxy on cpu1), or both
  --targets LIST   comma-separated subset of targets (e.g. direct,twemproxy)
  --tests LIST     comma-separated subset of tests (e.g. get_p16,set_p16)
  --extra-proxy 'NAME=PATH [ARGS]'
                   one more proxy target named NAME (passthrough, large,
                   mixed and idle scenarios; repeatable): PATH is a binary, or a directory
                   holding a Go main package (built), started as
                   PATH --listen ADDR --upstream ADDR [ARGS]
  --check          exit 1 when a goal listed under "Checks" is missed
  --keep           keep the temp dir (logs, configs, raw redis-benchmark output)
Environment: ROUNDS N_P1 N_P16 CLIENTS KEYSPACE DATASIZE CPU_REDIS CPU_CLIENT CPU_PROXY
  REDPROXY_GOMAXPROCS REDPROXY_BIN REDPROXY_ARGS MAX_OTHER RETRIES RETRY_PAUSE OUT
  IDLE_CONNS IDLE_PER_SOURCE IDLE_TIMEOUT IDLE_SETTLE (--scenario idle)
  N_SUITE (--scenario suite: requests per run, 50000)
EOF
}

die() { echo "run.sh: $*" >&2; exit 1; }
log() { echo "== $*" >&2; }

# ---- processes and cleanup -------------------------------------------------
TMP=""
PIDS=()
PROXY_PIDS=() # the proxies among PIDS: re-pinned when the layout changes
FG_PID=""

# run_fg CMD...: run CMD in the background and wait for it. bash runs a trap
# only after a foreground command finishes, but interrupts `wait` at once; and
# cleanup can stop CMD (benchtool passes the signal on to redis-benchmark).
run_fg() {
	"$@" &
	FG_PID=$!
	local rc=0
	wait "$FG_PID" || rc=$?
	FG_PID=""
	return "$rc"
}

cleanup() {
	local pid
	if [[ -n $FG_PID ]]; then
		kill "$FG_PID" 2>/dev/null || true
		wait "$FG_PID" 2>/dev/null || true
	fi
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		# Give each process a few seconds to exit cleanly, then force it.
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -9 "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [[ -n $TMP ]]; then
		if ((KEEP)); then echo "run.sh: kept $TMP" >&2; else rm -rf "$TMP"; fi
	fi
}
trap cleanup EXIT

# stop_proc PID: stop one process this script started (TERM, then KILL after
# 5 s) and forget it.
stop_proc() {
	local pid=$1 i
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	for i in "${!PIDS[@]}"; do
		[[ ${PIDS[i]} == "$pid" ]] && unset 'PIDS[i]'
	done
	for i in "${!PROXY_PIDS[@]}"; do
		[[ ${PROXY_PIDS[i]} == "$pid" ]] && unset 'PROXY_PIDS[i]'
	done
	return 0
}
trap 'exit 130' INT
trap 'exit 143' TERM

need() {
	command -v "$1" >/dev/null 2>&1 ||
		die "$1 not found; install with: apt-get install -y redis-server redis-tools nutcracker (and Go for redproxy)"
}

freeport() { "$TMP/bin/benchtool" freeport; }

# ---- core layouts ----------------------------------------------------------
# Every process is started under taskset with the first layout's CPUs; with
# several layouts, run_matrix re-pins the running Redis and proxies (every
# thread: taskset -a) before each layout's runs, and redis-benchmark is
# started on the layout's client CPU.
CURRENT_LAYOUT=""
set_layout() { # NAME
	CURRENT_LAYOUT=$1
	[[ $1 == custom ]] && return
	read -r CPU_REDIS CPU_CLIENT CPU_PROXY <<<"${LAYOUT_CPUS[$1]}"
}

apply_layout() { # NAME: set_layout, then move the running processes
	local pid
	set_layout "$1"
	if [[ -n $REDIS_PID ]]; then
		taskset -a -p -c "$CPU_REDIS" "$REDIS_PID" >/dev/null || die "taskset: cannot re-pin redis-server"
	fi
	for pid in "${PROXY_PIDS[@]}"; do
		taskset -a -p -c "$CPU_PROXY" "$pid" >/dev/null || die "taskset: cannot re-pin proxy pid $pid"
	done
}

layout_line() { # NAME: what runs where, for logs and reports
	local r c p
	if [[ $1 == custom ]]; then
		r=$CPU_REDIS c=$CPU_CLIENT p=$CPU_PROXY
	else
		read -r r c p <<<"${LAYOUT_CPUS[$1]}"
	fi
	echo "$1: redis-server cpu $r, redis-benchmark cpu $c, proxy under test cpu $p"
}

# wait_pong PORT PID NAME: poll until PING through PORT answers PONG.
wait_pong() {
	local port=$1 pid=$2 name=$3
	for _ in $(seq 200); do
		kill -0 "$pid" 2>/dev/null || return 1
		[[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] && return 0
		sleep 0.05
	done
	die "$name on port $port did not answer PING within 10 s (logs in $TMP)"
}

REDIS_PORT="" REDIS_PID=""
start_redis() {
	REDIS_PORT=$(freeport)
	mkdir -p "$TMP/redis"
	taskset -c "$CPU_REDIS" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 \
		--save '' --appendonly no --dir "$TMP/redis" --logfile "$TMP/redis/redis.log" &
	REDIS_PID=$!
	PIDS+=("$REDIS_PID")
	wait_pong "$REDIS_PORT" "$REDIS_PID" redis-server || die "redis-server exited; see $TMP/redis/redis.log"
}

# preload writes every key redis-benchmark -r will touch (key:%012d), so GET
# returns a DATASIZE-byte value instead of nil in every run.
preload() {
	local value
	value=$(printf '%*s' "$DATASIZE" '' | tr ' ' x)
	awk -v n="$KEYSPACE" -v v="$value" 'BEGIN {
		for (i = 0; i < n; i++) {
			k = sprintf("key:%012d", i)
			printf "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", length(k), k, length(v), v
		}
	}' | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
	local n
	n=$(redis-cli -p "$REDIS_PORT" dbsize)
	[[ $n == "$KEYSPACE" ]] || die "preload: dbsize is $n, want $KEYSPACE"
}

TWEM_PORT="" TWEM_PID=""
start_twemproxy() {
	TWEM_PORT=$(freeport)
	local stats_port
	stats_port=$(freeport)
	mkdir -p "$TMP/twemproxy"
	nutcracker_yml "$TWEM_PORT" "$REDIS_PORT" >"$TMP/twemproxy/nutcracker.yml"
	taskset -c "$CPU_PROXY" nutcracker -c "$TMP/twemproxy/nutcracker.yml" \
		-s "$stats_port" -a 127.0.0.1 -p "$TMP/twemproxy/nutcracker.pid" \
		-o "$TMP/twemproxy/nutcracker.log" -v 4 &
	TWEM_PID=$!
	PIDS+=("$TWEM_PID")
	PROXY_PIDS+=("$TWEM_PID")
	wait_pong "$TWEM_PORT" "$TWEM_PID" twemproxy || die "nutcracker exited; see $TMP/twemproxy/nutcracker.log"
}

build_redproxy() {
	if [[ -n $REDPROXY_BIN ]]; then
		[[ -x $REDPROXY_BIN ]] || die "REDPROXY_BIN=$REDPROXY_BIN is not executable"
		return
	fi
	need go
	log "building redproxy"
	run_fg go -C "$REPO" build -o "$TMP/bin/redproxy" ./cmd/redproxy ||
		die "go build ./cmd/redproxy failed (to bench without it: --targets direct,twemproxy)"
	REDPROXY_BIN=$TMP/bin/redproxy
}

REDPROXY_PORT="" REDPROXY_PID=""
# start_redproxy tries --admin "" (admin endpoint off) first and falls back to
# a free loopback port if the binary rejects an empty address.
start_redproxy() {
	build_redproxy
	REDPROXY_PORT=$(freeport)
	mkdir -p "$TMP/redproxy"
	local admin attempt
	for attempt in off port; do
		if [[ $attempt == off ]]; then admin=""; else admin=127.0.0.1:$(freeport); fi
		# shellcheck disable=SC2086 # REDPROXY_ARGS is a word list on purpose
		GOMAXPROCS=$REDPROXY_GOMAXPROCS taskset -c "$CPU_PROXY" "$REDPROXY_BIN" \
			--listen "127.0.0.1:$REDPROXY_PORT" --upstream "127.0.0.1:$REDIS_PORT" \
			--admin "$admin" --log-level warn $REDPROXY_ARGS \
			>"$TMP/redproxy/$attempt.log" 2>&1 &
		REDPROXY_PID=$!
		PIDS+=("$REDPROXY_PID")
		if wait_pong "$REDPROXY_PORT" "$REDPROXY_PID" redproxy; then
			PROXY_PIDS+=("$REDPROXY_PID")
			return
		fi
		wait "$REDPROXY_PID" 2>/dev/null || true
		# Reaped: forget the PID so cleanup cannot hit a process that reuses it.
		unset "PIDS[${#PIDS[@]}-1]"
	done
	cat "$TMP/redproxy/"*.log >&2
	die "redproxy exited at startup (log above)"
}

# ---- extra proxies (--extra-proxy) -------------------------------------------
# A prototype (bench/spike/...) runs in the same interleaved rounds as the
# real proxies, pinned and re-pinned like them, with GOMAXPROCS as redproxy's.
EXTRA_NAMES=()
declare -A EXTRA_BIN=() EXTRA_ARGS=() EXTRA_SRC=()
prepare_extras() {
	local spec name rest path args out
	for spec in "${EXTRA_SPECS[@]}"; do
		[[ $spec == *=* ]] || die "--extra-proxy needs NAME=PATH, not $spec"
		name=${spec%%=*} rest=${spec#*=}
		[[ $name =~ ^[a-z][a-z0-9-]*$ ]] || die "--extra-proxy: name $name must be lower-case letters, digits and -"
		case $name in direct | twemproxy | redproxy) die "--extra-proxy: $name is taken" ;; esac
		read -r path args <<<"$rest"
		if [[ -d $path ]]; then
			need go
			out=$TMP/bin/extra-$(cd "$path" && pwd | cksum | cut -d' ' -f1)
			if [[ ! -x $out ]]; then
				log "building $path (--extra-proxy $name)"
				run_fg go -C "$path" build -o "$out" . || die "go build in $path failed"
			fi
		else
			[[ -x $path ]] || die "--extra-proxy $name: $path is neither a directory nor an executable"
			out=$path
		fi
		EXTRA_NAMES+=("$name")
		EXTRA_BIN[$name]=$out EXTRA_ARGS[$name]=$args EXTRA_SRC[$name]=$rest
	done
}

EXTRA_PORT="" EXTRA_PID=""
start_extra() { # NAME
	local name=$1
	EXTRA_PORT=$(freeport)
	mkdir -p "$TMP/$name"
	# shellcheck disable=SC2086 # EXTRA_ARGS is a word list on purpose
	GOMAXPROCS=$REDPROXY_GOMAXPROCS taskset -c "$CPU_PROXY" "${EXTRA_BIN[$name]}" \
		--listen "127.0.0.1:$EXTRA_PORT" --upstream "127.0.0.1:$REDIS_PORT" ${EXTRA_ARGS[$name]} \
		>>"$TMP/$name/log" 2>&1 &
	EXTRA_PID=$!
	PIDS+=("$EXTRA_PID")
	wait_pong "$EXTRA_PORT" "$EXTRA_PID" "$name" || { cat "$TMP/$name/log" >&2; die "$name exited at startup (log above)"; }
	PROXY_PIDS+=("$EXTRA_PID")
}

extras_line() {
	local name
	for name in "${EXTRA_NAMES[@]}"; do
		echo "- Extra proxy $name: ${EXTRA_SRC[$name]} (GOMAXPROCS=$REDPROXY_GOMAXPROCS, pinned like redproxy)"
	done
}

# ---- target and test registry ----------------------------------------------
# A target is a port to aim redis-benchmark at plus, for a proxy, the PID
# whose CPU is charged to the "proxy" column. A test is a redis-benchmark
# invocation and its request count. Scenarios register both, then call
# run_matrix and report.
TARGETS=()
declare -A TARGET_PORT=() TARGET_PID=()
TESTS=()
declare -A TEST_N=() TEST_ARGS=() TEST_LABEL=()
# TEST_SKIP[test]: targets that cannot run the test (comma-separated), left
# out of the matrix instead of failing the run.
declare -A TEST_SKIP=()

add_target() { # NAME PORT [PROXY_PID]
	TARGETS+=("$1")
	TARGET_PORT[$1]=$2
	TARGET_PID[$1]=${3:-}
}

add_test() { # NAME LABEL N redis-benchmark-args...
	local name=$1 label=$2 n=$3
	shift 3
	TESTS+=("$name")
	TEST_LABEL[$name]=$label
	TEST_N[$name]=$n
	TEST_ARGS[$name]="$*"
}

# selected LIST NAME: is NAME in the comma-separated LIST (empty = all)?
selected() { [[ -z $1 || ",$1," == *",$2,"* ]]; }

# add_tests SPEC...: adds each test "name|label|n|redis-benchmark args" that
# --tests selects; at least one must be.
add_tests() {
	local spec name label n args
	for spec in "$@"; do
		IFS='|' read -r name label n args <<<"$spec"
		# shellcheck disable=SC2086
		if selected "$ONLY_TESTS" "$name"; then add_test "$name" "$label" "$n" $args; fi
	done
	((${#TESTS[@]})) || die "no tests selected"
}

redis_commands() {
	redis-cli -p "$REDIS_PORT" info stats | awk -F: '/^total_commands_processed:/ {print $2+0}'
}

RECORDS=""
# bench_once ROUND TEST TARGET [N]: one redis-benchmark run, one record line.
# ROUND "w" is a warm-up run: measured the same way but not recorded. A run
# during which other work on the machine used more than MAX_OTHER cores is
# repeated (after RETRY_PAUSE seconds) up to RETRIES times; the last attempt
# is kept either way and the report lists it as disturbed.
bench_once() {
	local round=$1 test=$2 target=$3
	[[ -n ${TEST_SKIP[$test]:-} ]] && selected "${TEST_SKIP[$test]}" "$target" && return
	local n=${4:-${TEST_N[$test]}} port=${TARGET_PORT[$target]} pid=${TARGET_PID[$target]}
	local base=$TMP/runs/r$round-$CURRENT_LAYOUT-$test-$target
	local pidargs=(-pid "redis=$REDIS_PID")
	[[ -n $pid ]] && pidargs+=(-pid "proxy=$pid")

	local attempt cmds_before cmds_after cpu rps p50 p99 kv other redis_cmds
	local client_us redis_us proxy_us wall_us busy_us
	# A test whose arguments start with @mixed:T1,T2 runs those
	# redis-benchmark tests at once, sharing the clients and requests
	# (benchtool mixed); its record is the combined row.
	local args=${TEST_ARGS[$test]} bench=(redis-benchmark)
	if [[ $args == @mixed:* ]]; then
		local tests=${args%% *}
		bench=("$TMP/bin/benchtool" mixed -tests "${tests#@mixed:}" -- redis-benchmark)
		args=${args#"$tests"}
	fi
	for ((attempt = 0; ; attempt++)); do
		cmds_before=$(redis_commands)
		# shellcheck disable=SC2086 # args is a word list on purpose
		run_fg taskset -c "$CPU_CLIENT" "$TMP/bin/benchtool" measure "${pidargs[@]}" -out "$base.csv" -- \
			"${bench[@]}" -p "$port" -c "$CLIENTS" -n "$n" -r "$KEYSPACE" -d "$DATASIZE" \
			--csv $args >"$base.cpu" 2>"$base.err" ||
			{ cat "$base.err" >&2; die "redis-benchmark failed: $test against $target"; }
		cpu=$(<"$base.cpu")
		cmds_after=$(redis_commands)

		# CSV: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
		# The last row is the test's: redis-benchmark's LRANGE tests first
		# fill the list with an LPUSH row of their own.
		rps="" p50="" p99=""
		read -r rps p50 p99 < <(awk -F, 'NR > 1 { gsub(/"/, ""); last = $2 " " $5 " " $7 } END { if (last != "") print last }' "$base.csv")
		[[ -n $p99 ]] || { cat "$base.csv" "$base.err" >&2; die "no result from redis-benchmark: $test against $target"; }

		client_us=0 redis_us=0 proxy_us=0 wall_us=1 busy_us=0
		for kv in $cpu; do
			case $kv in
			client_us=*) client_us=${kv#*=} ;;
			redis_us=*) redis_us=${kv#*=} ;;
			proxy_us=*) proxy_us=${kv#*=} ;;
			wall_us=*) wall_us=${kv#*=} ;;
			busy_us=*) busy_us=${kv#*=} ;;
			esac
		done
		# INFO itself is one command; do not charge it to the run.
		redis_cmds=$((cmds_after - cmds_before - 1))
		# CPU the rest of the machine used meanwhile, in cores (other
		# sessions, builds, tests). Well above 0 means the run shared cores.
		other=$(awk -v b="$busy_us" -v c="$client_us" -v r="$redis_us" -v p="$proxy_us" -v w="$wall_us" \
			'BEGIN { o = (b - c - r - p) / w; printf "%.2f", o < 0 ? 0 : o }')
		printf '   round %s %-6s %-15s %-17s %10s req/s  p99 %8s ms  other load %s cores\n' \
			"$round" "$CURRENT_LAYOUT" "$test" "$target" "$rps" "$p99" "$other" >&2
		[[ $round == w ]] && return
		if ((attempt >= RETRIES)) || awk -v o="$other" -v m="$MAX_OTHER" 'BEGIN { exit !(o <= m) }'; then
			break
		fi
		log "other load $other > $MAX_OTHER cores: repeating in ${RETRY_PAUSE}s"
		run_fg sleep "$RETRY_PAUSE"
	done
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$test" "$target" "$n" \
		"$rps" "$p50" "$p99" "$client_us" "$redis_us" "$proxy_us" "$redis_cmds" "$wall_us" "$other" "$CURRENT_LAYOUT" >>"$RECORDS"
}

# run_matrix: every round runs every test against every target in every
# layout. Targets are interleaved test by test and the starting target (and
# layout) rotates each round, so slow drift (thermal, noisy neighbours,
# Redis memory growth) and position effects hit all targets alike.
run_matrix() {
	mkdir -p "$TMP/runs"
	local round test target layout i l nt=${#TARGETS[@]} nl=${#LAYOUTS[@]}
	# Warm-up (connections, Go heap growth, caches), a tenth of each run,
	# in the first layout.
	apply_layout "${LAYOUTS[0]}"
	log "warm-up (not recorded)"
	for test in "${TESTS[@]}"; do
		for target in "${TARGETS[@]}"; do
			bench_once w "$test" "$target" $(((TEST_N[$test] + 9) / 10))
		done
	done
	for ((round = 1; round <= ROUNDS; round++)); do
		for ((l = 0; l < nl; l++)); do
			layout=${LAYOUTS[(l + round - 1) % nl]}
			apply_layout "$layout"
			log "round $round/$ROUNDS, layout $(layout_line "$layout")"
			for test in "${TESTS[@]}"; do
				for ((i = 0; i < nt; i++)); do
					bench_once "$round" "$test" "${TARGETS[(i + round - 1) % nt]}"
				done
			done
		done
	done
}

# ---- report ----------------------------------------------------------------
versions_line() {
	echo "$(redis-server --version | awk '{print $1, $2, $3}'), $(nutcracker -V 2>&1 | head -1 | sed 's/This is //')," \
		"redproxy $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown), $(go version 2>/dev/null | awk '{print $3}')"
}

machine_line() {
	local model
	model=$(lscpu 2>/dev/null | awk -F: '/^Model name/ {gsub(/^ +/, "", $2); print $2; exit}')
	echo "$(nproc) CPUs, ${model:-unknown model}, $(uname -sr)"
}

# report: medians over rounds per (layout, test, target), ratios against the
# direct and twemproxy medians of the same layout and test, then the issue's
# goals.
report() {
	local labels="" t l
	for t in "${TESTS[@]}"; do labels+="$t=${TEST_LABEL[$t]};"; done
	{
		echo "# redproxy bench: $SCENARIO"
		echo
		echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "- Machine: $(machine_line)"
		echo "- Versions: $(versions_line)"
		echo "- Settings: $ROUNDS round(s), -c $CLIENTS, -r $KEYSPACE, -d $DATASIZE, -n $N_P1 at -P 1 and $N_P16 at -P 16 (preloaded keyspace)"
		for l in "${LAYOUTS[@]}"; do
			echo "- Layout $(layout_line "$l"); redproxy GOMAXPROCS=$REDPROXY_GOMAXPROCS"
		done
		extras_line
		awk -F'\t' -v max="$MAX_OTHER" '{ n++; s += $13; if ($13 > m) m = $13; if ($13 > max) bad = bad sprintf(" r%s/%s/%s/%s=%.2f", $1, $14, $2, $3, $13) }
			END { printf "- Other load (CPU used by processes outside the bench during runs): mean %.2f, max %.2f cores\n", s / n, m
			      if (bad != "") print "- WARNING: runs still disturbed after retries (other load > " max " cores):" bad }' "$RECORDS"
		echo
		awk -F'\t' -v order="${TESTS[*]}" -v targets="${TARGETS[*]}" -v layouts="${LAYOUTS[*]}" -v labels="$labels" -v check_out="$TMP/check" '
		function median(key,   n, i, j, a, tmp) {
			n = split(vals[key], a, " ")
			for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { tmp = a[j]; a[j] = a[j-1]; a[j-1] = tmp }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		function add(key, v) { vals[key] = (key in vals) ? vals[key] " " v : v }
		function ratio(a, b) { return (b > 0) ? sprintf("%.2f×", a / b) : "–" }
		function have(l, t, g) { return (l SUBSEP t SUBSEP g) in seen }
		function m(l, t, g, c) { return median(l SUBSEP t SUBSEP g SUBSEP c) }
		function check(ok, text) { checks[++nc] = "- " (ok ? "PASS" : "FAIL") " " text; if (!ok) failed = 1 }
		{
			k = $14 SUBSEP $2 SUBSEP $3; seen[k] = 1
			add(k SUBSEP "rps", $5); add(k SUBSEP "p50", $6); add(k SUBSEP "p99", $7)
			add(k SUBSEP "client", $8 / $4); add(k SUBSEP "redis", $9 / $4)
			add(k SUBSEP "proxy", $10 / $4); add(k SUBSEP "server", ($9 + $10) / $4); add(k SUBSEP "cmds", $11 / $4)
		}
		END {
			split(labels, lp, ";"); for (i in lp) if (split(lp[i], kv, "=") == 2) label[kv[1]] = kv[2]
			nt = split(order, tests, " "); ng = split(targets, tg, " "); nl = split(layouts, ly, " ")
			print "| Layout | Test | Target | req/s | vs direct | vs twemproxy | p50 ms | p99 ms | CPU µs/req client | CPU µs/req Redis | CPU µs/req proxy | CPU µs/req proxy+Redis | Redis cmds/req |"
			print "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
			for (h = 1; h <= nl; h++) for (i = 1; i <= nt; i++) {
				l = ly[h]; t = tests[i]
				d = have(l, t, "direct") ? m(l, t, "direct", "rps") : 0
				w = have(l, t, "twemproxy") ? m(l, t, "twemproxy", "rps") : 0
				for (j = 1; j <= ng; j++) {
					if (!have(l, t, tg[j])) continue
					r = m(l, t, tg[j], "rps")
					proxy = (tg[j] == "direct") ? "–" : sprintf("%.2f", m(l, t, tg[j], "proxy"))
					printf "| %s | %s | %s | %.0f | %s | %s | %.3f | %.3f | %.2f | %.2f | %s | %.2f | %.2f |\n",
						l, label[t], tg[j], r, ratio(r, d), ratio(r, w),
						m(l, t, tg[j], "p50"), m(l, t, tg[j], "p99"),
						m(l, t, tg[j], "client"), m(l, t, tg[j], "redis"), proxy,
						m(l, t, tg[j], "server"), m(l, t, tg[j], "cmds")
				}
			}
			# Issue 10 goals, redproxy against twemproxy in the same run: at
			# -P 1, at least as fast, p99 no higher and no more proxy + Redis
			# CPU per request, in every layout; at -P 16, 1.5x the throughput
			# in the shared layout (in the split one cpu0 caps both, see
			# README) and at most 1 us of proxy CPU per request.
			nc = 0
			for (h = 1; h <= nl; h++) for (i = 1; i <= nt; i++) {
				l = ly[h]; t = tests[i]
				if (!have(l, t, "redproxy") || !have(l, t, "twemproxy")) continue
				r = m(l, t, "redproxy", "rps"); w = m(l, t, "twemproxy", "rps")
				name = l " " label[t]
				if (t ~ /_p1$/) {
					check(r >= w, sprintf("%s: redproxy %.2f× twemproxy throughput (goal ≥ 1.0×)", name, r / w))
					a = m(l, t, "redproxy", "p99"); b = m(l, t, "twemproxy", "p99")
					check(a <= b, sprintf("%s: p99 redproxy %.3f ms, twemproxy %.3f ms (goal ≤)", name, a, b))
					a = m(l, t, "redproxy", "server"); b = m(l, t, "twemproxy", "server")
					check(a <= b, sprintf("%s: proxy + Redis CPU redproxy %.2f µs/req, twemproxy %.2f (goal ≤)", name, a, b))
				} else if (t ~ /_p16$/) {
					if (l == "shared") check(r >= 1.5 * w, sprintf("%s: redproxy %.2f× twemproxy throughput (goal ≥ 1.5×)", name, r / w))
					a = m(l, t, "redproxy", "proxy")
					check(a <= 1.0, sprintf("%s: redproxy %.2f µs proxy CPU per request (goal ≤ 1.00)", name, a))
				}
			}
			if (nc) { print ""; print "Checks (issue 10, Done when):"; print ""; for (i = 1; i <= nc; i++) print checks[i] }
			print failed ? "fail" : "ok" > check_out
		}' "$RECORDS"
		echo
		echo "Medians over rounds. Ratios compare req/s with the same layout and test's direct and twemproxy rows. CPU µs/req = CPU time the process spent during the run ÷ requests; proxy+Redis is the server side's total (Redis alone for direct)."
	} >"$TMP/report.md"
	mkdir -p "$(dirname "$OUT")"
	cp "$TMP/report.md" "$OUT"
	{
		printf "round\ttest\ttarget\trequests\trps\tp50_ms\tp99_ms\tclient_cpu_us\tredis_cpu_us\tproxy_cpu_us\tredis_cmds\twall_us\tother_load_cores\tlayout\n"
		cat "$RECORDS"
	} >"${OUT%.md}-rounds.tsv"
	cat "$TMP/report.md"
	echo >&2
	log "wrote $OUT and ${OUT%.md}-rounds.tsv"
	if ((CHECK)) && [[ $(cat "$TMP/check" 2>/dev/null) == fail ]]; then
		die "a goal under Checks was missed"
	fi
}

# ---- scenarios -------------------------------------------------------------
# A scenario starts what it needs, registers targets and tests, runs them and
# reports. Add one by writing scenario_NAME; it becomes --scenario NAME.

# passthrough: the foundation comparison (issue 2): plain GET/SET forwarded
# by each proxy to the same Redis.
scenario_passthrough() {
	passthrough_targets
	add_tests "get_p1|GET -P 1|$N_P1|-t get -P 1" "set_p1|SET -P 1|$N_P1|-t set -P 1" \
		"get_p16|GET -P 16|$N_P16|-t get -P 16" "set_p16|SET -P 16|$N_P16|-t set -P 16"

	run_matrix
	report
}

# mixed: GET and SET at once, half the clients each, at -P 1 and -P 16:
# reads and writes share the proxy's upstream connections, as an
# application's do (a read goes to a connection with no write pending, or
# to the spare one, docs/ARCHITECTURE.md), which the one-command runs do not
# show. The test names carry no _p1/_p16 suffix: the issue 10 checks are
# about single-command runs.
scenario_mixed() {
	passthrough_targets
	add_tests "mixed_1|GET+SET at once -P 1|$N_P1|@mixed:get,set -P 1" \
		"mixed_16|GET+SET at once -P 16|$N_P16|@mixed:get,set -P 16"
	run_matrix
	report
}

# large: GET and SET of large values (cached HTML, serialized objects) at
# -P 1, forwarded as in passthrough: 100,000-byte values over 1,000 keys and
# 20,000 requests a run unless DATASIZE, KEYSPACE or N_P1 say otherwise. The
# test names carry no _p1 suffix, so the issue 10 checks (about 64-byte
# values) are not applied to them.
scenario_large() {
	[[ -n $DATASIZE_SET ]] || DATASIZE=100000
	[[ -n $KEYSPACE_SET ]] || KEYSPACE=1000
	[[ -n $N_P1_SET ]] || N_P1=20000
	passthrough_targets
	add_tests "get_large|GET -P 1, $DATASIZE bytes|$N_P1|-t get -P 1" "set_large|SET -P 1, $DATASIZE bytes|$N_P1|-t set -P 1"
	run_matrix
	report
}

# suite: redis-benchmark's default test list, one test per run, at -P 1:
# what `redis-benchmark -p PORT` with no arguments runs, the first thing a
# user points at a proxy. N_SUITE requests per run (50,000). twemproxy does
# not take inline commands, so it sits out PING_INLINE. The LRANGE tests
# fill their list first (an LPUSH of as many requests), so their CPU and
# Redis cmds/req columns count two commands per request.
scenario_suite() {
	local n=${N_SUITE:-50000} t specs=()
	passthrough_targets
	for t in ping_inline ping_mbulk set get incr lpush rpush lpop rpop sadd hset spop zadd zpopmin lrange_100 lrange_300 lrange_500 lrange_600 mset; do
		specs+=("$t|${t^^}|$n|-t $t -P 1")
	done
	TEST_SKIP[ping_inline]=twemproxy
	add_tests "${specs[@]}"
	run_matrix
	report
}

# passthrough_targets starts Redis (preloaded) and the targets passthrough
# and large compare.
passthrough_targets() {
	start_redis
	log "redis-server pid $REDIS_PID port $REDIS_PORT (cpu $CPU_REDIS); preloading $KEYSPACE keys"
	preload
	if selected "$ONLY_TARGETS" direct; then add_target direct "$REDIS_PORT"; fi
	if selected "$ONLY_TARGETS" twemproxy; then
		start_twemproxy
		log "twemproxy pid $TWEM_PID port $TWEM_PORT (cpu $CPU_PROXY)"
		add_target twemproxy "$TWEM_PORT" "$TWEM_PID"
	fi
	if selected "$ONLY_TARGETS" redproxy; then
		start_redproxy
		log "redproxy pid $REDPROXY_PID port $REDPROXY_PORT (cpu $CPU_PROXY, GOMAXPROCS=$REDPROXY_GOMAXPROCS)"
		add_target redproxy "$REDPROXY_PORT" "$REDPROXY_PID"
	fi
	local name
	for name in "${EXTRA_NAMES[@]}"; do
		selected "$ONLY_TARGETS" "$name" || continue
		start_extra "$name"
		log "$name pid $EXTRA_PID port $EXTRA_PORT (cpu $CPU_PROXY)"
		add_target "$name" "$EXTRA_PORT" "$EXTRA_PID"
	done
	((${#TARGETS[@]})) || die "no targets selected"
}

# stampede: many clients, one cache key that keeps expiring, a slow fill,
# with each stampede mode off and on (issue 5). It is not a redis-benchmark
# run, so it lives in its own script, bench/stampede.sh, and writes its own
# table (bench/results/stampede.md); rounds and the CPU layout carry over.
scenario_stampede() {
	local args=(--rounds "$ROUNDS")
	((KEEP)) && args+=(--keep)
	export CPU_REDIS CPU_CLIENT CPU_PROXY REDPROXY_GOMAXPROCS REDPROXY_BIN
	run_fg "$BENCH_DIR/stampede.sh" "${args[@]}"
}

# cluster: redproxy in front of a Redis Cluster (issue 12) against a
# cluster-aware redis-benchmark straight to the nodes. It needs a cluster,
# not one redis-server, so it lives in bench/cluster.sh with its own table
# (bench/results/cluster.md); rounds and the CPU layout carry over.
scenario_cluster() {
	local args=(--rounds "$ROUNDS")
	((KEEP)) && args+=(--keep)
	export CPU_REDIS CPU_CLIENT CPU_PROXY REDPROXY_GOMAXPROCS REDPROXY_BIN N_P1 N_P16 CLIENTS KEYSPACE DATASIZE
	run_fg "$BENCH_DIR/cluster.sh" "${args[@]}"
}

# replicas: reads from replicas (issue 14), GET -P 16 through redproxy
# with 0, 1 and 2 replicas. It needs a primary and replicas, so it lives
# in bench/replicas.sh with its own table (bench/results/replicas.md);
# rounds and the CPU layout carry over.
scenario_replicas() {
	local args=(--rounds "$ROUNDS")
	((KEEP)) && args+=(--keep)
	export CPU_REDIS CPU_CLIENT CPU_PROXY REDPROXY_GOMAXPROCS REDPROXY_BIN N_P16 CLIENTS KEYSPACE DATASIZE
	run_fg "$BENCH_DIR/replicas.sh" "${args[@]}"
}

# routes: named upstreams and a [[route]] (issue 14), GET and SET at -P 1
# and -P 16 through redproxy with one upstream and with the keys split over
# two by a route. It needs its own servers and proxies, so it lives in
# bench/routes.sh with its own table (bench/results/routes.md); rounds and
# the CPU layout carry over.
scenario_routes() {
	local args=(--rounds "$ROUNDS")
	((KEEP)) && args+=(--keep)
	export CPU_REDIS CPU_CLIENT CPU_PROXY REDPROXY_GOMAXPROCS REDPROXY_BIN N_P1 N_P16 CLIENTS KEYSPACE DATASIZE
	run_fg "$BENCH_DIR/routes.sh" "${args[@]}"
}

# hotkeys: the local tier (issue 6). GET on a hot keyspace (-r 100, preloaded)
# through redproxy with the tier on, against redproxy's own PING (answered by
# the proxy itself: the ceiling of its front end) and twemproxy; then GET on a
# keyspace that is not hot (-r 1000000) with the tier on and off. After the
# interleaved rounds, one more hot GET run per target counts the GETs that
# reached Redis with INFO commandstats, and redproxy's memory is read.
scenario_hotkeys() {
	local hot=100 cold=1000000
	KEYSPACE=$cold
	[[ $OUT == "$BENCH_DIR/results/latest.md" ]] && OUT=$BENCH_DIR/results/hotkeys.md
	start_redis
	log "redis-server pid $REDIS_PID port $REDIS_PORT (cpu $CPU_REDIS); preloading $KEYSPACE keys"
	preload
	if selected "$ONLY_TARGETS" direct; then add_target direct "$REDIS_PORT"; fi
	if selected "$ONLY_TARGETS" twemproxy; then
		start_twemproxy
		add_target twemproxy "$TWEM_PORT" "$TWEM_PID"
	fi
	local tier_admin="" tier_pid="" notier_pid="" saved_args=$REDPROXY_ARGS
	if selected "$ONLY_TARGETS" redproxy; then
		tier_admin=127.0.0.1:$(freeport)
		REDPROXY_ARGS="$saved_args --local-tier=on --admin $tier_admin"
		start_redproxy
		tier_pid=$REDPROXY_PID
		log "redproxy (tier on) pid $tier_pid port $REDPROXY_PORT admin $tier_admin"
		add_target redproxy "$REDPROXY_PORT" "$REDPROXY_PID"
	fi
	if selected "$ONLY_TARGETS" redproxy-notier; then
		REDPROXY_ARGS="$saved_args --local-tier=off"
		start_redproxy
		notier_pid=$REDPROXY_PID
		log "redproxy (tier off) pid $notier_pid port $REDPROXY_PORT"
		add_target redproxy-notier "$REDPROXY_PORT" "$REDPROXY_PID"
	fi
	REDPROXY_ARGS=$saved_args
	((${#TARGETS[@]})) || die "no targets selected"

	# Test names avoid the _p1/_p16 suffixes that report() checks against
	# the foundation's goals; this scenario has its own checks below.
	add_tests "hot_get|GET -P 16, -r $hot|$N_P16|-t get -P 16 -r $hot" \
		"ping|PING -P 16|$N_P16|-t ping_mbulk -P 16" \
		"cold_get|GET -P 16, -r $cold|$N_P16|-t get -P 16 -r $cold" \
		"cold_get_nopipe|GET -P 1, -r $cold|$N_P1|-t get -P 1 -r $cold"

	run_matrix
	report

	# Counting runs: GETs that reached Redis per hot GET, by commandstats.
	local target port gets hits_before hits_after extra=$TMP/tier.md
	{
		echo
		echo "## Local tier"
		echo
		echo "One more hot GET run per target ($N_P16 requests, -P 16, -r $hot) after the rounds and a warm-up"
		echo "of a tenth of that, with Redis's \`INFO commandstats\` reset in between:"
		echo
		echo "| Target | GETs reaching Redis | per request | served without Redis |"
		echo "|---|---:|---:|---:|"
	} >"$extra"
	for target in "${TARGETS[@]}"; do
		[[ $target == redproxy-notier ]] && continue
		port=${TARGET_PORT[$target]}
		# The cold runs before moved the tier's attention elsewhere: warm
		# it up on the hot keys again (a tenth of a run), then count.
		run_fg taskset -c "$CPU_CLIENT" redis-benchmark -p "$port" -c "$CLIENTS" -n $((N_P16 / 10)) -r "$hot" -d "$DATASIZE" \
			-P 16 -t get -q >/dev/null 2>&1 || die "warm-up failed against $target"
		redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
		run_fg taskset -c "$CPU_CLIENT" redis-benchmark -p "$port" -c "$CLIENTS" -n "$N_P16" -r "$hot" -d "$DATASIZE" \
			-P 16 -t get -q >/dev/null 2>&1 || die "counting run failed against $target"
		gets=$(redis-cli -p "$REDIS_PORT" info commandstats | awk -F'[=,:]' '/^cmdstat_get:/ {print $3}')
		gets=${gets:-0}
		awk -v t="$target" -v g="$gets" -v n="$N_P16" 'BEGIN { printf "| %s | %d | %.5f | %.2f %% |\n", t, g, g / n, 100 * (1 - g / n) }' >>"$extra"
	done
	if [[ -n $tier_pid ]]; then
		local metrics rss_on rss_off="–"
		metrics=$(curl -s "http://$tier_admin/metrics" 2>/dev/null || true)
		rss_on=$(awk '/^VmRSS:/ {printf "%.1f MiB", $2 / 1024}' "/proc/$tier_pid/status")
		[[ -n $notier_pid ]] && rss_off=$(awk '/^VmRSS:/ {printf "%.1f MiB", $2 / 1024}' "/proc/$notier_pid/status")
		{
			echo
			echo "Memory after all runs: redproxy with the tier $rss_on RSS (tier off: $rss_off);" \
				"$(awk '/^redproxy_localcache_bytes / {printf "%d", $2}' <<<"$metrics") bytes charged to the tier for" \
				"$(awk '/^redproxy_localcache_entries / {printf "%d", $2}' <<<"$metrics") entries" \
				"(budget $(awk '/^redproxy_localcache_max_bytes / {printf "%d", $2}' <<<"$metrics")); hits" \
				"$(awk '/^redproxy_localcache_hits_total / {printf "%d", $2}' <<<"$metrics"), fills" \
				"$(awk '/^redproxy_localcache_fills_total\{result="stored"\}/ {printf "%d", $2}' <<<"$metrics")."
		} >>"$extra"
	fi
	# Checks against issue 6's goals, from the medians over rounds, per
	# layout (the counting runs above used the last layout of the rounds).
	awk -F'\t' -v layouts="${LAYOUTS[*]}" '
	function median(key,   n, i, j, a, tmp) {
		n = split(vals[key], a, " ")
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { tmp = a[j]; a[j] = a[j-1]; a[j-1] = tmp }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{ k = $14 SUBSEP $2 SUBSEP $3; seen[k] = 1; vals[k SUBSEP "rps"] = vals[k SUBSEP "rps"] " " $5; vals[k SUBSEP "p99"] = vals[k SUBSEP "p99"] " " $7 }
	function have(t, g) { return (L SUBSEP t SUBSEP g) in seen }
	function m(t, g, c) { return median(L SUBSEP t SUBSEP g SUBSEP c) }
	function check(ok, text) { print "- " (ok ? "PASS" : "FAIL") " " L " " text }
	END {
		print ""; print "Checks (issue 6, Done when):"; print ""
		nl = split(layouts, ly, " ")
		for (h = 1; h <= nl; h++) { L = ly[h]
		if (have("hot_get", "redproxy") && have("ping", "redproxy")) {
			r = m("hot_get", "redproxy", "rps") / m("ping", "redproxy", "rps")
			check(r >= 0.9, sprintf("hot GET through the tier: %.2f× redproxy'"'"'s own PING throughput (goal ≥ 0.90×)", r))
		}
		if (have("hot_get", "redproxy") && have("hot_get", "twemproxy")) {
			r = m("hot_get", "redproxy", "rps") / m("hot_get", "twemproxy", "rps")
			check(r >= 2, sprintf("hot GET: redproxy %.2f× twemproxy throughput (goal ≥ 2×)", r))
			a = m("hot_get", "redproxy", "p99"); b = m("hot_get", "twemproxy", "p99")
			check(a < b, sprintf("hot GET p99: redproxy %.3f ms, twemproxy %.3f ms (goal: below)", a, b))
		}
		split("cold_get cold_get_nopipe", cold, " ")
		for (i = 1; i <= 2; i++) if (have(cold[i], "redproxy") && have(cold[i], "redproxy-notier")) {
			r = m(cold[i], "redproxy", "rps") / m(cold[i], "redproxy-notier", "rps")
			check(r >= 0.9, sprintf("%s (not hot): tier on %.2f× tier off (goal: not worse; runs vary ±10 %%, so ≥ 0.90×)", cold[i], r))
		}
		}
	}' "$RECORDS" >>"$extra"
	cat "$extra" >>"$OUT"
	cat "$extra"
}

# tier: what the local tier costs when it cannot help (issue 10): SET at
# -P 16 and GET over a keyspace that is not hot (-r KEYSPACE, 100,000 keys by
# default) at -P 1 and -P 16, redproxy with the tier on and off, interleaved
# in the same run. Add direct or twemproxy with --targets for reference.
scenario_tier() {
	[[ $OUT == "$BENCH_DIR/results/latest.md" ]] && OUT=$BENCH_DIR/results/tier.md
	local targets=${ONLY_TARGETS:-redproxy-tier-on,redproxy-tier-off} saved_args=$REDPROXY_ARGS
	start_redis
	log "redis-server pid $REDIS_PID port $REDIS_PORT (cpu $CPU_REDIS); preloading $KEYSPACE keys"
	preload
	if selected "$targets" direct; then add_target direct "$REDIS_PORT"; fi
	if selected "$targets" twemproxy; then
		start_twemproxy
		add_target twemproxy "$TWEM_PORT" "$TWEM_PID"
	fi
	local tier
	for tier in on off; do
		selected "$targets" "redproxy-tier-$tier" || continue
		REDPROXY_ARGS="$saved_args --local-tier=$tier"
		start_redproxy
		log "redproxy (tier $tier) pid $REDPROXY_PID port $REDPROXY_PORT"
		add_target "redproxy-tier-$tier" "$REDPROXY_PORT" "$REDPROXY_PID"
	done
	REDPROXY_ARGS=$saved_args
	((${#TARGETS[@]})) || die "no targets selected"

	add_tests "set_p16|SET -P 16|$N_P16|-t set -P 16" \
		"get_p1|GET -P 1, -r $KEYSPACE|$N_P1|-t get -P 1" \
		"get_p16|GET -P 16, -r $KEYSPACE|$N_P16|-t get -P 16"

	run_matrix
	report

	# Tier on against tier off, per layout and test, from the medians.
	local labels="" t extra=$TMP/tier.md
	for t in "${TESTS[@]}"; do labels+="$t=${TEST_LABEL[$t]};"; done
	awk -F'\t' -v order="${TESTS[*]}" -v layouts="${LAYOUTS[*]}" -v labels="$labels" -v check_out="$TMP/check-tier" '
	function median(key,   n, i, j, a, tmp) {
		n = split(vals[key], a, " ")
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { tmp = a[j]; a[j] = a[j-1]; a[j-1] = tmp }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	function add(key, v) { vals[key] = (key in vals) ? vals[key] " " v : v }
	function m(l, t, g, c) { return median(l SUBSEP t SUBSEP g SUBSEP c) }
	{
		k = $14 SUBSEP $2 SUBSEP $3; seen[k] = 1
		add(k SUBSEP "rps", $5); add(k SUBSEP "p99", $7); add(k SUBSEP "proxy", $10 / $4)
	}
	END {
		split(labels, lp, ";"); for (i in lp) if (split(lp[i], kv, "=") == 2) label[kv[1]] = kv[2]
		nt = split(order, tests, " "); nl = split(layouts, ly, " ")
		print ""; print "## Local tier on vs off"; print ""
		print "| Layout | Test | req/s tier on | req/s tier off | on ÷ off | p99 ms on | p99 ms off | proxy CPU µs/req on | off |"
		print "|---|---|---:|---:|---:|---:|---:|---:|---:|"
		for (h = 1; h <= nl; h++) for (i = 1; i <= nt; i++) {
			l = ly[h]; t = tests[i]; on = l SUBSEP t SUBSEP "redproxy-tier-on"; off = l SUBSEP t SUBSEP "redproxy-tier-off"
			if (!(on in seen) || !(off in seen)) continue
			a = m(l, t, "redproxy-tier-on", "rps"); b = m(l, t, "redproxy-tier-off", "rps")
			printf "| %s | %s | %.0f | %.0f | %.2f× | %.3f | %.3f | %.2f | %.2f |\n", l, label[t], a, b, a / b,
				m(l, t, "redproxy-tier-on", "p99"), m(l, t, "redproxy-tier-off", "p99"),
				m(l, t, "redproxy-tier-on", "proxy"), m(l, t, "redproxy-tier-off", "proxy")
			ok = a >= 0.95 * b; if (!ok) failed = 1
			checks[++nc] = sprintf("- %s %s %s: tier on %.2f× tier off (goal ≥ 0.95×: the tier costs at most 5 %%)", ok ? "PASS" : "FAIL", l, label[t], a / b)
		}
		if (nc) { print ""; print "Checks (issue 10, local tier):"; print ""; for (i = 1; i <= nc; i++) print checks[i] }
		print failed ? "fail" : "ok" > check_out
	}' "$RECORDS" >"$extra"
	cat "$extra" >>"$OUT"
	cat "$extra"
	if ((CHECK)) && [[ $(cat "$TMP/check-tier" 2>/dev/null) == fail ]]; then
		die "a goal under Checks was missed"
	fi
}

# idle: memory per idle client connection (issue 10). For each count in
# IDLE_CONNS and each proxy, a fresh proxy is started, `benchtool idle` opens
# that many connections, sends one GET on each and reads the reply, and the
# proxy's VmRSS is read before and after (settled); then every connection is
# checked with PING, closed with QUIT, and the proxy is stopped.
scenario_idle() {
	[[ $OUT == "$BENCH_DIR/results/latest.md" ]] && OUT=$BENCH_DIR/results/idle.md
	local counts=${IDLE_CONNS//,/ } per_source=${IDLE_PER_SOURCE:-5000} timeout=${IDLE_TIMEOUT:-120s}
	# redproxy parks a client idle for server.idle_park_after (2 s): the
	# reading after the connections open waits past that.
	local settle=${IDLE_SETTLE:-5s}
	local n max=0
	for n in $counts; do
		[[ $n =~ ^[1-9][0-9]*$ ]] || die "IDLE_CONNS: $n is not a positive count"
		if ((n > max)); then max=$n; fi
	done
	# Every connection is a file descriptor in the client and in the proxy,
	# and children inherit this shell's limit; 1,024 spare cover the rest of
	# what they open. Raising the hard limit needs CAP_SYS_RESOURCE; without
	# it, counts that do not fit are reported as not run.
	local want=$((max + 1024)) hard
	hard=$(ulimit -Hn)
	if [[ $hard != unlimited ]] && ((hard < want)); then
		ulimit -Hn "$want" 2>/dev/null && hard=$want ||
			log "hard fd limit is $hard and cannot be raised (no CAP_SYS_RESOURCE): counts above $((hard - 1024)) will not run"
	fi
	[[ $hard == unlimited ]] || ((want <= hard)) || want=$hard
	ulimit -n "$want" || die "ulimit -n $want failed"
	log "fd limit (ulimit -n) $(ulimit -n), hard $(ulimit -Hn)"
	local fdmax=$(($(ulimit -n) - 1024))

	start_redis
	log "redis-server pid $REDIS_PID port $REDIS_PORT (cpu $CPU_REDIS); preloading $KEYSPACE keys"
	preload
	local targets=() target
	selected "$ONLY_TARGETS" twemproxy && targets+=(twemproxy)
	if selected "$ONLY_TARGETS" redproxy; then
		targets+=(redproxy)
		build_redproxy
		# max_clients (10,000 by default) is a config file setting.
		mkdir -p "$TMP/redproxy"
		printf '[server]\nmax_clients = %d\n' $((max + 1000)) >"$TMP/redproxy/idle.toml"
	fi
	for target in "${EXTRA_NAMES[@]}"; do
		selected "$ONLY_TARGETS" "$target" && targets+=("$target")
	done
	((${#targets[@]})) || die "no targets selected (idle runs twemproxy, redproxy and --extra-proxy targets)"

	local rec=$TMP/idle.tsv round i nt=${#targets[@]} pid port line saved_args=$REDPROXY_ARGS
	: >"$rec"
	for ((round = 1; round <= ROUNDS; round++)); do
		for n in $counts; do
			for ((i = 0; i < nt; i++)); do
				target=${targets[(i + round - 1) % nt]}
				if ((n > fdmax)); then
					log "round $round: $n connections to $target not run: fd limit $(ulimit -n)"
					printf '%s\t%s\t%s\tskip\n' "$round" "$n" "$target" >>"$rec"
					continue
				fi
				if [[ $target == twemproxy ]]; then
					start_twemproxy
					pid=$TWEM_PID port=$TWEM_PORT
				elif [[ -n ${EXTRA_BIN[$target]:-} ]]; then
					start_extra "$target"
					pid=$EXTRA_PID port=$EXTRA_PORT
				else
					REDPROXY_ARGS="$saved_args --config $TMP/redproxy/idle.toml"
					start_redproxy
					REDPROXY_ARGS=$saved_args
					pid=$REDPROXY_PID port=$REDPROXY_PORT
				fi
				# run_fg, not $(...): cleanup must be able to stop it.
				run_fg taskset -c "$CPU_CLIENT" "$TMP/bin/benchtool" idle -addr "127.0.0.1:$port" -pid "$pid" \
					-conns "$n" -keyspace "$KEYSPACE" -per-source "$per_source" -timeout "$timeout" -settle "$settle" >"$TMP/idle.out" ||
					die "benchtool idle failed: $n connections to $target (logs in $TMP with --keep)"
				line=$(<"$TMP/idle.out")
				stop_proc "$pid"
				printf '   round %s %6d idle connections  %-10s %s\n' "$round" "$n" "$target" "$line" >&2
				printf '%s\t%s\t%s\t%s\n' "$round" "$n" "$target" "$line" >>"$rec"
			done
		done
	done

	{
		echo "# redproxy bench: idle"
		echo
		echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "- Machine: $(machine_line)"
		echo "- Versions: $(versions_line)"
		echo "- Settings: $ROUNDS round(s); each connection sends one GET (preloaded $DATASIZE-byte values, -r $KEYSPACE) and then stays idle; $per_source connections per source address (127.0.0.1, .2, ...); fd limit $(ulimit -n)"
		echo "- Layout $(layout_line "${LAYOUTS[0]}") (benchtool idle runs on the client cpu); redproxy GOMAXPROCS=$REDPROXY_GOMAXPROCS, max_clients $((max + 1000))"
		extras_line
		echo
		awk -F'\t' -v counts="$counts" -v targets="${targets[*]}" -v fdlimit="$(ulimit -n)" -v check_out="$TMP/check" '
		function median(key,   n, i, j, a, tmp) {
			n = split(vals[key], a, " ")
			for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { tmp = a[j]; a[j] = a[j-1]; a[j-1] = tmp }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		function add(key, v) { vals[key] = (key in vals) ? vals[key] " " v : v }
		function m(n, g, c) { return median(n SUBSEP g SUBSEP c) }
		{
			k = $2 SUBSEP $3
			if ($4 == "skip") { skipped[k] = 1; next }
			seen[k] = 1
			split($4, kvs, " "); for (i in kvs) { split(kvs[i], kv, "="); f[kv[1]] = kv[2] }
			add(k SUBSEP "before", f["rss_before_kb"]); add(k SUBSEP "after", f["rss_after_kb"])
			add(k SUBSEP "added", f["rss_after_kb"] - f["rss_before_kb"]); add(k SUBSEP "open", f["open_ms"])
			add(k SUBSEP "alive", f["alive"])
		}
		END {
			nc = split(counts, cs, " "); ng = split(targets, tg, " ")
			print "| Connections | Target | RSS before MiB | RSS after MiB | added MiB | KiB per connection | vs twemproxy | open + GET s | answering PING at the end |"
			print "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
			for (i = 1; i <= nc; i++) for (j = 1; j <= ng; j++) {
				n = cs[i]; g = tg[j]; k = n SUBSEP g
				if (!(k in seen)) { printf "| %d | %s | not run: fd limit %d | | | | | | |\n", n, g, fdlimit; continue }
				per = m(n, g, "added") / n
				w = ((n SUBSEP "twemproxy") in seen) ? m(n, "twemproxy", "added") / n : 0
				printf "| %d | %s | %.1f | %.1f | %.1f | %.2f | %s | %.2f | %d |\n", n, g, m(n, g, "before") / 1024, m(n, g, "after") / 1024,
					m(n, g, "added") / 1024, per, (w > 0 ? sprintf("%.1f×", per / w) : "–"), m(n, g, "open") / 1000, m(n, g, "alive")
			}
			# Issue 10: 10,000 idle clients add at most 2 KB each to redproxy,
			# and every count works (each connection still answers).
			for (i = 1; i <= nc; i++) {
				n = cs[i]; k = n SUBSEP "redproxy"
				if (!(k in seen) && !(k in skipped)) continue
				if (!(k in seen)) { lines[++nl] = sprintf("- NOT RUN %d connections: the fd limit is %d; raise the hard limit (needs CAP_SYS_RESOURCE) and rerun", n, fdlimit); failed = 1; continue }
				a = m(n, "redproxy", "alive"); ok = a == n; if (!ok) failed = 1
				lines[++nl] = sprintf("- %s %d connections: %d answered PING after idling (goal: all)", ok ? "PASS" : "FAIL", n, a)
				if (n == 10000) {
					per = m(n, "redproxy", "added") / n; ok = per <= 2; if (!ok) failed = 1
					lines[++nl] = sprintf("- %s 10000 connections: redproxy %.2f KiB RSS each (goal ≤ 2)", ok ? "PASS" : "FAIL", per)
				}
			}
			if (nl) { print ""; print "Checks (issue 10, idle connections):"; print ""; for (i = 1; i <= nl; i++) print lines[i] }
			print failed ? "fail" : "ok" > check_out
		}' "$rec"
		echo
		echo "Medians over rounds. RSS is the proxy's VmRSS (/proc/PID/status), read after a warm-up connection and again once the connections are open, each after a $settle pause (IDLE_SETTLE) and once two readings 250 ms apart agree within 1 %. KiB per connection = (after - before) ÷ connections."
	} >"$TMP/report.md"
	mkdir -p "$(dirname "$OUT")"
	cp "$TMP/report.md" "$OUT"
	cat "$TMP/report.md"
	echo >&2
	log "wrote $OUT"
	if ((CHECK)) && [[ $(cat "$TMP/check" 2>/dev/null) == fail ]]; then
		die "a goal under Checks was missed"
	fi
}

# ---- main ------------------------------------------------------------------
while (($#)); do
	case $1 in
	--quick) ROUNDS=1 N_P1=20000 N_P16=200000 N_SUITE=${N_SUITE:-10000} RETRIES=${RETRIES:-0} ;;
	--rounds) ROUNDS=${2:?--rounds needs N}; shift ;;
	--scenario) SCENARIO=${2:?--scenario needs NAME}; shift ;;
	--layout) LAYOUT=${2:?--layout needs split, shared or both}; shift ;;
	--targets) ONLY_TARGETS=${2:?--targets needs a list}; shift ;;
	--tests) ONLY_TESTS=${2:?--tests needs a list}; shift ;;
	--check) CHECK=1 ;;
	--keep) KEEP=1 ;;
	--extra-proxy) EXTRA_SPECS+=("${2:?--extra-proxy needs NAME=PATH}"); shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; exit 2 ;;
	esac
	shift
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer"
RETRIES=${RETRIES:-3}
declare -F "scenario_$SCENARIO" >/dev/null || die "unknown scenario $SCENARIO (see --help)"

for tool in redis-server redis-cli redis-benchmark nutcracker taskset go awk; do need "$tool"; done

# Layouts: --layout wins; without it, CPU_* in the environment make a
# "custom" layout (unset ones as in split), else split as before.
case $LAYOUT in
both) read -r -a LAYOUTS <<<"$LAYOUT_ORDER" ;;
split | shared) LAYOUTS=("$LAYOUT") ;;
"")
	if [[ -n $CPU_REDIS$CPU_CLIENT$CPU_PROXY ]]; then
		CPU_REDIS=${CPU_REDIS:-0} CPU_CLIENT=${CPU_CLIENT:-0} CPU_PROXY=${CPU_PROXY:-1}
		LAYOUTS=(custom)
	else
		LAYOUTS=(split)
	fi
	;;
*) die "--layout must be split, shared or both, not $LAYOUT" ;;
esac
if [[ -n $LAYOUT && -n $CPU_REDIS$CPU_CLIENT$CPU_PROXY ]]; then
	log "--layout $LAYOUT given: CPU_REDIS, CPU_CLIENT and CPU_PROXY from the environment are ignored"
fi
if (($(nproc) < 2)); then
	log "only one CPU: everything shares cpu0, so proxy numbers include contention"
	LAYOUT_CPUS=([split]="0 0 0" [shared]="0 0 0")
	CPU_REDIS=0 CPU_CLIENT=0 CPU_PROXY=0
fi
set_layout "${LAYOUTS[0]}"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/redproxy-bench.XXXXXX")
RECORDS=$TMP/records.tsv
: >"$RECORDS"
run_fg go -C "$REPO" build -o "$TMP/bin/benchtool" ./bench/benchtool || die "go build ./bench/benchtool failed"
prepare_extras

"scenario_$SCENARIO"
