# Shared helpers for integration tests: free loopback ports, processes started
# and stopped by PID, bounded waits.  Source it from a test_*.sh script.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$ROOT/build
T=$(mktemp -d /tmp/kvb-it.XXXXXX)
PIDS=()
PASS=0
FAIL=0

cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

ok()  { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
finish() { echo "$(basename "$0" .sh): $PASS passed, $FAIL failed"; [ "$FAIL" = 0 ]; }

# A free TCP port on 127.0.0.1 (and, with an argument N, N consecutive ones).
free_port() {
  local n=${1:-1} p i busy
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 30000)); busy=0
    for i in $(seq 0 $((n - 1))); do
      if (exec 3<>/dev/tcp/127.0.0.1/$((p + i))) 2>/dev/null; then busy=1; break; fi
    done
    [ $busy = 0 ] && { echo $p; return 0; }
  done
  return 1
}

wait_port() { # wait_port PORT [SECONDS]
  local end=$((SECONDS + ${2:-10}))
  until (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null; do
    [ $SECONDS -ge $end ] && return 1; sleep 0.05
  done
}

wait_file() { # wait_file PATH [SECONDS]
  local end=$((SECONDS + ${2:-10}))
  until [ -e "$1" ]; do [ $SECONDS -ge $end ] && return 1; sleep 0.05; done
}

wait_log() { # wait_log FILE PATTERN [SECONDS]
  local end=$((SECONDS + ${3:-10}))
  until grep -q -- "$2" "$1" 2>/dev/null; do [ $SECONDS -ge $end ] && return 1; sleep 0.05; done
}

# start NAME CMD...: run in the background, output to $T/NAME.log; PID in $LAST_PID
start() {
  local name=$1; shift
  "$@" >"$T/$name.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

stop_pid() { # stop_pid PID [SIGNAL] [SECONDS]: signal, wait bounded, then KILL; echoes exit code
  local pid=$1 sig=${2:-TERM} end=$((SECONDS + ${3:-10})) rc
  kill -s "$sig" "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $end ]; then kill -s KILL "$pid" 2>/dev/null || true; break; fi
    sleep 0.05
  done
  rc=0; wait "$pid" 2>/dev/null || rc=$?
  echo "$rc"
}

# start_nats PORT [extra args]: nats-server on 127.0.0.1:PORT
start_nats() {
  local port=$1; shift
  start "nats-$port" nats-server -a 127.0.0.1 -p "$port" "$@"
  NATS_PID=$LAST_PID
  wait_port "$port" 10
}

# kvbridge_config FILE: write a config; variables: WORKER, BS, SOURCES (yaml
# lines for the sources list), NATS_URLS, EXTRA (more yaml)
kvbridge_config() {
  cat >"$1" <<YAML
worker_id: ${WORKER:-7}
block_size: ${BS:-16}
forward_tiers: [device]
sources:
${SOURCES}
nats:
  servers: [${NATS_URLS}]
metrics:
  listen: ""
${EXTRA:-}
YAML
}
