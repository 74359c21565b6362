# bench/lib.sh: what the scenario scripts (cluster.sh, replicas.sh,
# routes.sh) share, sourced by them after they set SCRIPT_NAME, KEEP,
# REDPROXY_BIN and the CPU_* variables. Not run on its own.
#
# bench_init: checks the tools, makes $TMP (removed on exit unless KEEP=1),
# arms the cleanup that kills every pid in PIDS, builds benchtool (for
# freeport) and, unless REDPROXY_BIN names a binary, redproxy.

die() { echo "$SCRIPT_NAME: $*" >&2; exit 1; }
log() { echo "== $*" >&2; }

PIDS=()
# stop_all: kills every process started so far (PIDS) and waits for them.
stop_all() {
	local pid
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	PIDS=()
}
bench_cleanup() {
	stop_all
	if ((KEEP)); then log "kept $TMP"; else rm -rf "$TMP"; fi
}

bench_init() {
	local tool
	for tool in redis-server redis-cli redis-benchmark taskset go awk; do
		command -v "$tool" >/dev/null || die "$tool not found (Debian: redis-server, redis-tools)"
	done
	TMP=$(mktemp -d "${TMPDIR:-/tmp}/redproxy-${SCRIPT_NAME%.sh}.XXXXXX")
	trap bench_cleanup EXIT
	go -C "$REPO" build -o "$TMP/benchtool" ./bench/benchtool || die "go build ./bench/benchtool failed"
	if [[ -z $REDPROXY_BIN ]]; then
		go -C "$REPO" build -o "$TMP/redproxy" ./cmd/redproxy || die "go build ./cmd/redproxy failed"
		REDPROXY_BIN=$TMP/redproxy
	fi
}

freeport() { "$TMP/benchtool" freeport; }

# cpu_us PID...: user+system CPU time of the processes, in microseconds.
cpu_us() {
	local pid total=0 t
	for pid in "$@"; do
		t=$(awk '{print $14 + $15}' "/proc/$pid/stat")
		total=$((total + t))
	done
	echo $((total * 1000000 / $(getconf CLK_TCK)))
}

# wait_pong PORT: waits up to 10 s for PORT to answer PING.
wait_pong() {
	for _ in $(seq 200); do
		[[ $(redis-cli -p "$1" ping 2>/dev/null) == PONG ]] && return 0
		sleep 0.05
	done
	die "port $1 did not answer PING within 10 s (logs in $TMP)"
}

# calls PORT CMD: how many times the server at PORT ran CMD since its last
# CONFIG RESETSTAT.
calls() {
	redis-cli -p "$1" info commandstats | awk -F'[=,:]' -v c="cmdstat_$2" '$1 == c { print $3; found = 1 } END { if (!found) print 0 }'
}

# start_redis DIR ARGS...: starts a redis-server on a free port, pinned to
# CPU_REDIS, without persistence, logging to DIR/redis.log; sets REDIS_PORT
# and REDIS_PID and waits for PING.
start_redis() {
	local dir=$1
	shift
	mkdir -p "$dir"
	REDIS_PORT=$(freeport)
	taskset -c "$CPU_REDIS" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
		--dir "$dir" --logfile "$dir/redis.log" "$@" &
	REDIS_PID=$!
	PIDS+=("$REDIS_PID")
	wait_pong "$REDIS_PORT"
}

# start_proxy CONFIG LOG: starts redproxy with CONFIG, pinned to CPU_PROXY
# with GOMAXPROCS=REDPROXY_GOMAXPROCS; sets PROXY_PID. The caller waits
# for its port.
start_proxy() {
	GOMAXPROCS=$REDPROXY_GOMAXPROCS taskset -c "$CPU_PROXY" "$REDPROXY_BIN" --config "$1" >"$2" 2>&1 &
	PROXY_PID=$!
	PIDS+=("$PROXY_PID")
}

# preload PORT [all|even|odd]: writes the keys redis-benchmark's
# -r KEYSPACE names (key:%012d), each with a DATASIZE-byte value, to the
# server at PORT: all of them, or those whose number is even or odd.
preload() {
	local value
	value=$(printf '%*s' "$DATASIZE" '' | tr ' ' x)
	awk -v n="$KEYSPACE" -v v="$value" -v parity="${2:-all}" 'BEGIN {
		for (i = 0; i < n; i++) {
			if (parity == "even" && i % 2) continue
			if (parity == "odd" && !(i % 2)) continue
			k = sprintf("key:%012d", i)
			printf "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", length(k), k, length(v), v
		}
	}' | redis-cli -p "$1" --pipe >/dev/null
}

# bench_csv CSV: "req/s p99" from redis-benchmark --csv output (the line
# after the header; --cluster prints the node list before it).
bench_csv() {
	echo "$1" | awk -F, 'hdr { gsub(/"/, ""); print $2, $7; exit } /^"test"/ { hdr = 1 }'
}
