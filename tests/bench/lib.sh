# shellcheck shell=bash
# Shared helpers of the benchmark scripts (run.sh, rss.sh, callgrind.sh):
# paths, a temp dir removed at exit, processes by PID, free loopback ports,
# bounded waits, kvsim captures.  Source it; it sets ROOT, B, BIN, OUT, T.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
B=${B:-build}
BIN=$ROOT/$B
[ "${B#/}" != "$B" ] && BIN=$B
OUT=$BIN/bench
mkdir -p "$OUT"
# The temp dir (captures, logs, the subscriber's shared memory) on tmpfs: a
# page fault on a file of a busy ext4 can wait for its journal for 100s of ms,
# which would show up as latency.
T=$(mktemp -d /dev/shm/kvb-bench.XXXXXX 2>/dev/null || mktemp -d /tmp/kvb-bench.XXXXXX)
PIDS=()
SUBJECT=namespace.dynamo.component.backend.kv_events
# shellcheck disable=SC2034 # used by run.sh, which sources this file
MP_SUBJECT=namespace.dynamo.component.backend.endpoint.generate.kv-events

cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "bench: $*" >&2; }

need() { # need FILE...: built binaries
  local b
  for b in "$@"; do [ -x "$BIN/$b" ] || { log "$BIN/$b missing"; exit 2; }; done
}

# A free port below the ephemeral range (no outgoing connection can take it
# between the choice and the bind).
free_port() {
  local lo p
  lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  [ "${lo:-0}" -gt 12000 ] || lo=32768
  for _ in $(seq 200); do
    p=$((10000 + RANDOM % (lo - 11000)))
    (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo $p; return 0; }
  done
  return 1
}
wait_port() { local end=$((SECONDS + ${2:-10}))
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do [ $SECONDS -ge $end ] && return 1; sleep 0.05; done; }
wait_file() { local end=$((SECONDS + ${2:-10}))
  until [ -e "$1" ]; do [ $SECONDS -ge $end ] && return 1; sleep 0.05; done; }
wait_log() { local end=$((SECONDS + ${3:-10}))
  until grep -q -- "$2" "$1" 2>/dev/null; do [ $SECONDS -ge $end ] && return 1; sleep 0.05; done; }

# stop PID: TERM, wait up to 10 s, then KILL
stop() {
  local pid=$1 end=$((SECONDS + 10))
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $end ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
    sleep 0.05
  done
  wait "$pid" 2>/dev/null || true
}

field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

start_nats() { # sets NATS_PORT NATS_URL NATS_PID
  NATS_PORT=$(free_port)
  nats-server -a 127.0.0.1 -p "$NATS_PORT" >"$T/nats.log" 2>&1 &
  NATS_PID=$!; PIDS+=("$NATS_PID")
  wait_port "$NATS_PORT" 10 || { log "nats-server did not start"; cat "$T/nats.log" >&2; exit 1; }
  NATS_URL=nats://127.0.0.1:$NATS_PORT
}

# capture MIX SKIP COUNT: kvsim --workload MIX at full speed (lossless), its
# batches SKIP.. SKIP+COUNT-1 into $T/MIX.cap (up to 3 attempts)
capture() {
  local mix=$1 skip=$2 count=$3 port pid attempt
  for attempt in 1 2 3; do
    port=$(free_port)
    "$BIN/bench/capture" --endpoint "tcp://127.0.0.1:$port" --skip "$skip" --count "$count" \
      --out "$T/$mix.cap" --timeout-ms 30000 2>"$T/capture-$mix.log" &
    pid=$!; PIDS+=("$pid")
    timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$port" --workload "$mix" --rate 0 \
      --lossless --batches $((skip + count)) --wait-subscribers 300 --linger 0 \
      2>"$T/kvsim-$mix.log" || true
    if wait "$pid"; then return 0; fi
    log "capture of $mix failed (attempt $attempt): $(tail -1 "$T/capture-$mix.log")"
  done
  return 1
}

# the usual captures: decode past its first 64 batches (no removes yet),
# realistic past its first 5000 (kvsim's cache fills up, then evictions are
# steady)
capture_mix() {
  case $1 in
    decode) capture decode 100 20000 ;;
    prefill) capture prefill 0 4000 ;;
    realistic) capture realistic 5000 20000 ;;
    *) log "unknown mix $1"; return 2 ;;
  esac
}

# write_config FILE ZMQ_PORT: the kvbridge configuration of the benchmarks
# write_config FILE ZMQ_PORT [FORMAT]
write_config() {
  cat >"$1" <<YAML
worker_id: 7
block_size: 16
forward_tiers: [device]
sources:
  - endpoint: "tcp://127.0.0.1:$2"
nats:
  servers: ["$NATS_URL"]
  format: ${3:-dynamo-json}
metrics:
  listen: ""
log:
  level: info
YAML
}

# start_sub NAME CAP: count-sub on $T/shm.NAME; sets SUB_PID, SHM
start_sub() {
  SHM=$T/shm.$1
  rm -f "$T/sub.ready"
  "$BIN/bench/count-sub" --server "$NATS_URL" --subject "${3:-$SUBJECT}" --shm "$SHM" \
    --cap "$2" --ready-file "$T/sub.ready" ${4:+"$4"} >"$T/sub.$1.log" 2>&1 &
  SUB_PID=$!; PIDS+=("$SUB_PID")
  wait_file "$T/sub.ready" 15 || { log "count-sub did not start"; return 1; }
}

# start_kvbridge NAME ZMQ_PORT: sets BRIDGE_PID
start_kvbridge() { # start_kvbridge NAME ZMQ_PORT [FORMAT]
  write_config "$T/kvbridge.$1.yaml" "$2" "${3:-}"
  "$BIN/kvbridge" -c "$T/kvbridge.$1.yaml" >"$T/kvbridge.$1.log" 2>&1 &
  BRIDGE_PID=$!; PIDS+=("$BRIDGE_PID")
  wait_log "$T/kvbridge.$1.log" "running:" 15 || { log "kvbridge did not start"; return 1; }
}

# start_forwarder NAME ZMQ_PORT [args]: sets BRIDGE_PID
start_forwarder() {
  local name=$1 port=$2; shift 2
  "$BIN/bench/forwarder" --endpoint "tcp://127.0.0.1:$port" --server "$NATS_URL" \
    --subject "$SUBJECT" "$@" >"$T/forwarder.$name.log" 2>&1 &
  BRIDGE_PID=$!; PIDS+=("$BRIDGE_PID")
  wait_log "$T/forwarder.$name.log" "running" 15 || { log "forwarder did not start"; return 1; }
}

# machine_busy: % of all CPUs busy (and % at nice > 0) over the next second,
# before anything of ours runs: other people's work skews every number
machine_busy() {
  local a b
  read -ra a </proc/stat; sleep 1; read -ra b </proc/stat
  awk -v u="$((b[1] - a[1]))" -v n="$((b[2] - a[2]))" -v s="$((b[3] - a[3]))" \
      -v i="$((b[4] - a[4]))" -v w="$((b[5] - a[5]))" -v q="$((b[6] + b[7] - a[6] - a[7]))" \
      -v st="$((b[8] - a[8]))" 'BEGIN {
    t = u + n + s + i + w + q + st; if (t <= 0) t = 1
    printf "%.0f%% busy (%.0f%% niced)\n", 100 * (t - i - w) / t, 100 * n / t }'
}

# version: the commit, "+dirty" when src/ or include/ differ from it
version() {
  echo "$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src include 2>/dev/null || echo '+dirty')"
}
