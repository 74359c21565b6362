#!/usr/bin/env bash
# bench/run.sh: compare Redis directly, twemproxy and redproxy in one run.
#
# Starts its own redis-server, nutcracker (twemproxy) and redproxy on free
# loopback ports, pins them to cores, runs redis-benchmark against each target
# interleaved over several rounds, and prints a Markdown table (also written
# to bench/results/latest.md). See bench/README.md for the layout and the
# meaning of every column.
#
# Usage: bench/run.sh [--quick] [--rounds N] [--scenario NAME]
#                     [--targets a,b] [--tests x,y] [--check] [--keep]
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_DIR/.." && pwd)

# ---- settings (environment overrides; flags below override these) ---------
ROUNDS=${ROUNDS:-3}
N_P1=${N_P1:-200000}      # requests per -P 1 run (~3-5 s on the reference machine)
N_P16=${N_P16:-2000000}   # requests per -P 16 run
CLIENTS=${CLIENTS:-50}
KEYSPACE=${KEYSPACE:-100000}
DATASIZE=${DATASIZE:-64}
CPU_REDIS=${CPU_REDIS:-0}     # redis-server (taskset CPU list)
CPU_CLIENT=${CPU_CLIENT:-0}   # redis-benchmark
CPU_PROXY=${CPU_PROXY:-1}     # the proxy under test, alone
REDPROXY_GOMAXPROCS=${REDPROXY_GOMAXPROCS:-1}
MAX_OTHER=${MAX_OTHER:-0.2}     # cores other work may use during a run before it is repeated
RETRIES=${RETRIES:-3}
RETRY_PAUSE=${RETRY_PAUSE:-5}
REDPROXY_BIN=${REDPROXY_BIN:-}     # prebuilt binary; default: build ./cmd/redproxy
REDPROXY_ARGS=${REDPROXY_ARGS:-}   # extra flags for redproxy
OUT=${OUT:-$BENCH_DIR/results/latest.md}
SCENARIO=passthrough
ONLY_TARGETS=""
ONLY_TESTS=""
CHECK=0
KEEP=0

usage() {
	sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
	cat <<EOF

Flags:
  --quick          1 round with small -n (smoke test, numbers are noisy)
  --rounds N       interleaved rounds (default $ROUNDS); medians are reported
  --scenario NAME  one of: $(declare -F | awk '$3 ~ /^scenario_/ {sub("scenario_", "", $3); printf "%s ", $3}')
  --targets LIST   comma-separated subset of targets (e.g. direct,twemproxy)
  --tests LIST     comma-separated subset of tests (e.g. get_p16,set_p16)
  --check          exit 1 when a goal listed under "Checks" is missed
  --keep           keep the temp dir (logs, configs, raw redis-benchmark output)
Environment: ROUNDS N_P1 N_P16 CLIENTS KEYSPACE DATASIZE CPU_REDIS CPU_CLIENT CPU_PROXY
  REDPROXY_GOMAXPROCS REDPROXY_BIN REDPROXY_ARGS MAX_OTHER RETRIES RETRY_PAUSE OUT
EOF
}

die() { echo "run.sh: $*" >&2; exit 1; }
log() { echo "== $*" >&2; }

# ---- processes and cleanup -------------------------------------------------
TMP=""
PIDS=()
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
trap 'exit 130' INT
trap 'exit 143' TERM

need() {
	command -v "$1" >/dev/null 2>&1 ||
		die "$1 not found; install with: apt-get install -y redis-server redis-tools nutcracker (and Go for redproxy)"
}

freeport() { "$TMP/bin/benchtool" freeport; }

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
	# One pool, hash/distribution left at their defaults; see README for why
	# server_connections is 1 and ejection is off.
	cat >"$TMP/twemproxy/nutcracker.yml" <<EOF
bench:
  listen: 127.0.0.1:$TWEM_PORT
  redis: true
  server_connections: 1
  preconnect: true
  auto_eject_hosts: false
  servers:
    - 127.0.0.1:$REDIS_PORT:1
EOF
	taskset -c "$CPU_PROXY" nutcracker -c "$TMP/twemproxy/nutcracker.yml" \
		-s "$stats_port" -a 127.0.0.1 -p "$TMP/twemproxy/nutcracker.pid" \
		-o "$TMP/twemproxy/nutcracker.log" -v 4 &
	TWEM_PID=$!
	PIDS+=("$TWEM_PID")
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
			return
		fi
		wait "$REDPROXY_PID" 2>/dev/null || true
		# Reaped: forget the PID so cleanup cannot hit a process that reuses it.
		unset "PIDS[${#PIDS[@]}-1]"
	done
	cat "$TMP/redproxy/"*.log >&2
	die "redproxy exited at startup (log above)"
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
	local n=${4:-${TEST_N[$test]}} port=${TARGET_PORT[$target]} pid=${TARGET_PID[$target]}
	local base=$TMP/runs/r$round-$test-$target
	local pidargs=(-pid "redis=$REDIS_PID")
	[[ -n $pid ]] && pidargs+=(-pid "proxy=$pid")

	local attempt cmds_before cmds_after cpu rps p50 p99 kv other redis_cmds
	local client_us redis_us proxy_us wall_us busy_us
	for ((attempt = 0; ; attempt++)); do
		cmds_before=$(redis_commands)
		# shellcheck disable=SC2086 # TEST_ARGS is a word list on purpose
		run_fg taskset -c "$CPU_CLIENT" "$TMP/bin/benchtool" measure "${pidargs[@]}" -out "$base.csv" -- \
			redis-benchmark -p "$port" -c "$CLIENTS" -n "$n" -r "$KEYSPACE" -d "$DATASIZE" \
			--csv ${TEST_ARGS[$test]} >"$base.cpu" 2>"$base.err" ||
			{ cat "$base.err" >&2; die "redis-benchmark failed: $test against $target"; }
		cpu=$(<"$base.cpu")
		cmds_after=$(redis_commands)

		# CSV: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
		rps="" p50="" p99=""
		read -r rps p50 p99 < <(awk -F, 'NR == 2 { gsub(/"/, ""); print $2, $5, $7 }' "$base.csv")
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
		printf '   round %s %-9s %-10s %10s req/s  p99 %8s ms  other load %s cores\n' \
			"$round" "$test" "$target" "$rps" "$p99" "$other" >&2
		[[ $round == w ]] && return
		if ((attempt >= RETRIES)) || awk -v o="$other" -v m="$MAX_OTHER" 'BEGIN { exit !(o <= m) }'; then
			break
		fi
		log "other load $other > $MAX_OTHER cores: repeating in ${RETRY_PAUSE}s"
		run_fg sleep "$RETRY_PAUSE"
	done
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$test" "$target" "$n" \
		"$rps" "$p50" "$p99" "$client_us" "$redis_us" "$proxy_us" "$redis_cmds" "$wall_us" "$other" >>"$RECORDS"
}

# run_matrix: every round runs every test against every target. Targets are
# interleaved test by test and the starting target rotates each round, so
# slow drift (thermal, noisy neighbours, Redis memory growth) and position
# effects hit all targets alike.
run_matrix() {
	mkdir -p "$TMP/runs"
	local round test target i nt=${#TARGETS[@]}
	# Warm-up (connections, Go heap growth, caches), a tenth of each run.
	log "warm-up (not recorded)"
	for test in "${TESTS[@]}"; do
		for target in "${TARGETS[@]}"; do
			bench_once w "$test" "$target" $(((TEST_N[$test] + 9) / 10))
		done
	done
	for ((round = 1; round <= ROUNDS; round++)); do
		log "round $round/$ROUNDS"
		for test in "${TESTS[@]}"; do
			for ((i = 0; i < nt; i++)); do
				bench_once "$round" "$test" "${TARGETS[(i + round - 1) % nt]}"
			done
		done
	done
}

# ---- report ----------------------------------------------------------------
machine_line() {
	local model
	model=$(lscpu 2>/dev/null | awk -F: '/^Model name/ {gsub(/^ +/, "", $2); print $2; exit}')
	echo "$(nproc) CPUs, ${model:-unknown model}, $(uname -sr)"
}

# report: medians over rounds per (test, target), ratios against the
# direct and twemproxy medians of the same test, then the issue's goals.
report() {
	local labels="" t
	for t in "${TESTS[@]}"; do labels+="$t=${TEST_LABEL[$t]};"; done
	{
		echo "# redproxy bench: $SCENARIO"
		echo
		echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "- Machine: $(machine_line)"
		echo "- Versions: $(redis-server --version | awk '{print $1, $2, $3}'), $(nutcracker -V 2>&1 | head -1 | sed 's/This is //')," \
			"redproxy $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown), $(go version 2>/dev/null | awk '{print $3}')"
		echo "- Settings: $ROUNDS round(s), -c $CLIENTS, -r $KEYSPACE, -d $DATASIZE, -n $N_P1 at -P 1 and $N_P16 at -P 16 (preloaded keyspace)"
		echo "- Layout (taskset CPU lists): redis-server $CPU_REDIS, redis-benchmark $CPU_CLIENT, proxy under test $CPU_PROXY; redproxy GOMAXPROCS=$REDPROXY_GOMAXPROCS"
		awk -F'\t' -v max="$MAX_OTHER" '{ n++; s += $13; if ($13 > m) m = $13; if ($13 > max) bad = bad sprintf(" r%s/%s/%s=%.2f", $1, $2, $3, $13) }
			END { printf "- Other load (CPU used by processes outside the bench during runs): mean %.2f, max %.2f cores\n", s / n, m
			      if (bad != "") print "- WARNING: runs still disturbed after retries (other load > " max " cores):" bad }' "$RECORDS"
		echo
		awk -F'\t' -v order="${TESTS[*]}" -v targets="${TARGETS[*]}" -v labels="$labels" -v check_out="$TMP/check" '
		function median(key,   n, i, j, a, tmp) {
			n = split(vals[key], a, " ")
			for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { tmp = a[j]; a[j] = a[j-1]; a[j-1] = tmp }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		function add(key, v) { vals[key] = (key in vals) ? vals[key] " " v : v }
		function ratio(a, b) { return (b > 0) ? sprintf("%.2f×", a / b) : "–" }
		{
			k = $2 SUBSEP $3; seen[k] = 1
			add(k SUBSEP "rps", $5); add(k SUBSEP "p50", $6); add(k SUBSEP "p99", $7)
			add(k SUBSEP "client", $8 / $4); add(k SUBSEP "redis", $9 / $4)
			add(k SUBSEP "proxy", $10 / $4); add(k SUBSEP "cmds", $11 / $4)
		}
		END {
			split(labels, lp, ";"); for (i in lp) if (split(lp[i], kv, "=") == 2) label[kv[1]] = kv[2]
			nt = split(order, tests, " "); ng = split(targets, tg, " ")
			print "| Test | Target | req/s | vs direct | vs twemproxy | p50 ms | p99 ms | CPU µs/req client | CPU µs/req Redis | CPU µs/req proxy | Redis cmds/req |"
			print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
			for (i = 1; i <= nt; i++) {
				t = tests[i]
				d = ((t SUBSEP "direct") in seen) ? median(t SUBSEP "direct" SUBSEP "rps") : 0
				w = ((t SUBSEP "twemproxy") in seen) ? median(t SUBSEP "twemproxy" SUBSEP "rps") : 0
				for (j = 1; j <= ng; j++) {
					k = t SUBSEP tg[j]
					if (!(k in seen)) continue
					r = median(k SUBSEP "rps")
					proxy = (tg[j] == "direct") ? "–" : sprintf("%.2f", median(k SUBSEP "proxy"))
					printf "| %s | %s | %.0f | %s | %s | %.3f | %.3f | %.2f | %.2f | %s | %.2f |\n",
						label[t], tg[j], r, ratio(r, d), ratio(r, w),
						median(k SUBSEP "p50"), median(k SUBSEP "p99"),
						median(k SUBSEP "client"), median(k SUBSEP "redis"), proxy, median(k SUBSEP "cmds")
					if (tg[j] == "redproxy") { rp[t] = r; rpcpu[t] = median(k SUBSEP "proxy") }
				}
			}
			# The foundation issue goals: >= twemproxy at -P 1, >= 1.5x at -P 16,
			# <= 2 us proxy CPU per pipelined request.
			nc = 0
			for (i = 1; i <= nt; i++) {
				t = tests[i]
				if (!(t in rp) || !((t SUBSEP "twemproxy") in seen)) continue
				w = median(t SUBSEP "twemproxy" SUBSEP "rps")
				if (t ~ /_p1$/) { goal = 1.0 } else if (t ~ /_p16$/) { goal = 1.5 } else continue
				ok = rp[t] >= goal * w
				checks[++nc] = sprintf("- %s %s: redproxy %.2f× twemproxy throughput (goal ≥ %.1f×)", ok ? "PASS" : "FAIL", label[t], rp[t] / w, goal)
				if (!ok) failed = 1
				if (t ~ /_p16$/) {
					ok = rpcpu[t] <= 2.0
					checks[++nc] = sprintf("- %s %s: redproxy %.2f µs CPU per request (goal ≤ 2.00)", ok ? "PASS" : "FAIL", label[t], rpcpu[t])
					if (!ok) failed = 1
				}
			}
			if (nc) { print ""; print "Checks (issue 2, Done when):"; print ""; for (i = 1; i <= nc; i++) print checks[i] }
			print failed ? "fail" : "ok" > check_out
		}' "$RECORDS"
		echo
		echo "Medians over rounds. Ratios compare req/s with the same test's direct and twemproxy rows. CPU µs/req = CPU time the process spent during the run ÷ requests."
	} >"$TMP/report.md"
	mkdir -p "$(dirname "$OUT")"
	cp "$TMP/report.md" "$OUT"
	{
		printf "round\ttest\ttarget\trequests\trps\tp50_ms\tp99_ms\tclient_cpu_us\tredis_cpu_us\tproxy_cpu_us\tredis_cmds\twall_us\tother_load_cores\n"
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
	((${#TARGETS[@]})) || die "no targets selected"

	local spec name label n args
	for spec in "get_p1|GET -P 1|$N_P1|-t get -P 1" "set_p1|SET -P 1|$N_P1|-t set -P 1" \
		"get_p16|GET -P 16|$N_P16|-t get -P 16" "set_p16|SET -P 16|$N_P16|-t set -P 16"; do
		IFS='|' read -r name label n args <<<"$spec"
		# shellcheck disable=SC2086
		if selected "$ONLY_TESTS" "$name"; then add_test "$name" "$label" "$n" $args; fi
	done
	((${#TESTS[@]})) || die "no tests selected"

	run_matrix
	report
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
	local spec name label n args
	for spec in "hot_get|GET -P 16, -r $hot|$N_P16|-t get -P 16 -r $hot" \
		"ping|PING -P 16|$N_P16|-t ping_mbulk -P 16" \
		"cold_get|GET -P 16, -r $cold|$N_P16|-t get -P 16 -r $cold" \
		"cold_get_nopipe|GET -P 1, -r $cold|$N_P1|-t get -P 1 -r $cold"; do
		IFS='|' read -r name label n args <<<"$spec"
		# shellcheck disable=SC2086
		if selected "$ONLY_TESTS" "$name"; then add_test "$name" "$label" "$n" $args; fi
	done
	((${#TESTS[@]})) || die "no tests selected"

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
	# Checks against issue 6's goals, from the medians over rounds.
	awk -F'\t' '
	function median(key,   n, i, j, a, tmp) {
		n = split(vals[key], a, " ")
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { tmp = a[j]; a[j] = a[j-1]; a[j-1] = tmp }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{ k = $2 SUBSEP $3; seen[k] = 1; vals[k SUBSEP "rps"] = vals[k SUBSEP "rps"] " " $5; vals[k SUBSEP "p99"] = vals[k SUBSEP "p99"] " " $7 }
	function have(t, g) { return (t SUBSEP g) in seen }
	function m(t, g, c) { return median(t SUBSEP g SUBSEP c) }
	function check(ok, text) { print "- " (ok ? "PASS" : "FAIL") " " text }
	END {
		print ""; print "Checks (issue 6, Done when):"; print ""
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
	}' "$RECORDS" >>"$extra"
	cat "$extra" >>"$OUT"
	cat "$extra"
}

# ---- main ------------------------------------------------------------------
while (($#)); do
	case $1 in
	--quick) ROUNDS=1 N_P1=20000 N_P16=200000 ;;
	--rounds) ROUNDS=${2:?--rounds needs N}; shift ;;
	--scenario) SCENARIO=${2:?--scenario needs NAME}; shift ;;
	--targets) ONLY_TARGETS=${2:?--targets needs a list}; shift ;;
	--tests) ONLY_TESTS=${2:?--tests needs a list}; shift ;;
	--check) CHECK=1 ;;
	--keep) KEEP=1 ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; exit 2 ;;
	esac
	shift
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer"
declare -F "scenario_$SCENARIO" >/dev/null || die "unknown scenario $SCENARIO (see --help)"

for tool in redis-server redis-cli redis-benchmark nutcracker taskset go awk; do need "$tool"; done
if (($(nproc) < 2)); then
	log "only one CPU: everything shares cpu0, so proxy numbers include contention"
	CPU_REDIS=0 CPU_CLIENT=0 CPU_PROXY=0
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/redproxy-bench.XXXXXX")
RECORDS=$TMP/records.tsv
: >"$RECORDS"
run_fg go -C "$REPO" build -o "$TMP/bin/benchtool" ./bench/benchtool || die "go build ./bench/benchtool failed"

"scenario_$SCENARIO"
