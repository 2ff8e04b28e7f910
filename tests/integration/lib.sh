# shellcheck shell=bash
# Shared helpers for integration tests: free loopback ports, processes started
# and stopped by PID, bounded waits.  Source it from a test_*.sh script.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${KVB_BIN:-$ROOT/build}
T=$(mktemp -d /tmp/kvb-it.XXXXXX)
PIDS=()
PASS=0
FAIL=0
# nats.format the daemon tests run with (make integration-msgpack:
# dynamo-msgpack): honoured by kvbridge_config, kvb_format_yaml and start_kvtail
KVB_FORMAT=${KVB_FORMAT:-dynamo-json}

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
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
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

wait_log_count() { # wait_log_count FILE PATTERN N [SECONDS]: N matching lines
  local end=$((SECONDS + ${4:-10}))
  until [ "$(grep -c -- "$2" "$1" 2>/dev/null)" -ge "$3" ]; do
    [ $SECONDS -ge $end ] && return 1; sleep 0.05
  done
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
  # shellcheck disable=SC2034  # for the tests
  NATS_PID=$LAST_PID
  wait_port "$port" 10
}

# kvb_format_yaml: the line of the nats: mapping that selects $KVB_FORMAT
# (nothing for dynamo-json, the default), for configs written by hand
kvb_format_yaml() { [ "$KVB_FORMAT" = dynamo-json ] || echo "  format: $KVB_FORMAT"; }

# kvbridge_config FILE: write a config; variables: WORKER, BS, SOURCES (yaml
# lines for the sources list), NATS_URLS, EXTRA (more yaml); nats.format is
# $KVB_FORMAT
kvbridge_config() {
  cat >"$1" <<YAML
worker_id: ${WORKER:-7}
block_size: ${BS:-16}
forward_tiers: [device]
sources:
${SOURCES}
nats:
  servers: [${NATS_URLS}]
$(kvb_format_yaml)
metrics:
  listen: ""
${EXTRA:-}
YAML
}

# ---- HTTP (kvbridge's metrics listener) -----------------------------------

# http_get PORT PATH: status in HTTP_STATUS, body in $T/http.body (bounded: 5 s)
http_get() {
  HTTP_STATUS=000
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3 &&
     timeout 5 cat <&3) >"$T/http.raw" 2>/dev/null || true
  HTTP_STATUS=$(head -n 1 "$T/http.raw" | awk '{ print $2 }')
  [ -n "$HTTP_STATUS" ] || HTTP_STATUS=000
  tr -d '\r' <"$T/http.raw" | sed '1,/^$/d' >"$T/http.body"
}
# wait_route_interest MONITOR_PORT SUBJECT [SECONDS]: the nats-server whose
# monitoring port is given has a route carrying an interest in SUBJECT (a
# subscriber on another server of the cluster).  "Route connection created"
# in a log is not enough: two servers that dial each other close the
# duplicate routes, and until the surviving route has carried the
# subscriptions, what is published on this server reaches nobody.
wait_route_interest() {
  local end=$((SECONDS + ${3:-10}))
  until http_get "$1" '/routez?subs=1'; grep -qF "\"$2\"" "$T/http.body"; do
    if [ $SECONDS -ge $end ]; then
      echo "     routes of :$1: $(grep -E '"(num_routes|subscriptions)"' "$T/http.body" | tr -d ' \n')"
      return 1
    fi
    sleep 0.05
  done
}
# metric PORT SERIES [IF_ABSENT]: the series' value from /metrics (IF_ABSENT,
# default 0, when it is not there)
metric() {
  http_get "$1" /metrics
  awk -v k="$2" -v d="${3:-0}" '$1 == k { print $2; f = 1 } END { if (!f) print d }' "$T/http.body"
}

# ---- JetStream tests (test_rel_jetstream.sh, test_rel_cluster.sh) -----------

# shellcheck disable=SC2034  # for the tests
STREAM=namespace-dynamo-component-backend-kv-events

# js_build: compile js_check.c (reads a stream back) to $T/js_check
js_build() {
  # shellcheck disable=SC2046
  gcc -O1 -o "$T/js_check" "$ROOT/tests/integration/js_check.c" $(pkg-config --cflags --libs libnats) \
    2>"$T/gcc.log" && ok "js_check built" || { bad_log "js_check did not build" "$T/gcc.log"; return 1; }
}
# ---- a three-node JetStream cluster -----------------------------------------
# js_cluster NAME: nats-servers n1..n3 with JetStream (stores in $T/jsI),
# clustered as NAME; their client, cluster and monitoring ports in JS_PP, JS_CP
# and JS_MP, their PIDs in JS_PID (indexes 1..3).  Returns once all listen.
js_cluster() {
  local i
  declare -g -a JS_CP JS_PP JS_MP JS_PID
  JS_CLUSTER=$1
  for i in 1 2 3; do JS_CP[i]=$(daemon_port); JS_PP[i]=$(daemon_port); JS_MP[i]=$(daemon_port); done
  JS_ROUTES="nats://127.0.0.1:${JS_CP[1]},nats://127.0.0.1:${JS_CP[2]},nats://127.0.0.1:${JS_CP[3]}"
  for i in 1 2 3; do node_start "$i"; done
  for i in 1 2 3; do wait_port "${JS_PP[$i]}" 10 || { bad "node n$i did not start"; return 1; }; done
}
# node_start I [TAG]: (re)start node nI on its store; its log is nI[TAG].log
node_start() {
  start "n$1${2:-}" nats-server -a 127.0.0.1 -p "${JS_PP[$1]}" -m "${JS_MP[$1]}" -n "n$1" -js \
    -sd "$T/js$1" --cluster_name "$JS_CLUSTER" -cluster "nats://127.0.0.1:${JS_CP[$1]}" \
    -routes "$JS_ROUTES"
  # shellcheck disable=SC2034  # read by the tests that use the cluster
  JS_PID[$1]=$LAST_PID
}
# leader_of NAME: the stream leader in js_check's output $T/NAME.out
leader_of() { sed -n 's/^cluster: leader=\([^ ]*\).*/\1/p' "$T/$1.out"; }
# kvbridge_node: the node (1..3) kvbridge is connected to, by the servers'
# /connz; nothing when none says so
kvbridge_node() {
  local i
  for i in 1 2 3; do
    http_get "${JS_MP[$i]}" '/connz?limit=1000'
    tr -d ' \n' <"$T/http.body" | grep -q '"name":"kvbridge"' && { echo "$i"; return 0; }
  done
}

# published MPORT: router events kvbridge handed to the sink so far
published() {
  http_get "$1" /metrics
  awk '$1 ~ /^kvbridge_router_events_published_total/ { n += $2 } END { print n + 0 }' "$T/http.body"
}
# js_diag MPORT: kvbridge's view of NATS and its JetStream window, one line
# (what a wait that timed out prints): reading paused, NATS buffer, in-flight
# window, acks and ack failures, resends, stalls, engine seq
js_diag() {
  http_get "$1" /metrics
  awk '$1 ~ /^kvbridge_router_events_published_total/ { pub += $2; next }
    $1 ~ /^kvbridge_(reading_paused|nats_connected|nats_pending_bytes|jetstream_pending|jetstream_acks_total|jetstream_resends_total|jetstream_ack_failures_total|jetstream_stalled|jetstream_stalls_total|source_last_seq|replays_failed_total|barriers_total)/ {
      k = $1; sub(/^kvbridge_/, "", k); gsub(/source="[^"]*",?|topic="",?|\{\}/, "", k)
      if ($2 != 0 || k !~ /total/) printf "%s=%s ", k, $2 }
    END { printf "published=%d\n", pub }' "$T/http.body"
}
# settle MPORT WANT: wait (bounded, SETTLE_S s) until kvbridge published WANT router
# events and JetStream acknowledged every one; on a timeout, print what kvbridge
# says (js_diag)
settle() {
  local end=$((SECONDS + ${SETTLE_S:-30}))
  until [ "$(published "$1")" -ge "$2" ] && [ "$(metric "$1" kvbridge_jetstream_pending)" = 0 ]; do
    [ $SECONDS -ge $end ] && {
      echo "     (not settled in ${SETTLE_S:-30} s: published $(published "$1") of $2)"
      echo "     kvbridge: $(js_diag "$1")"
      return 1; }
    sleep 0.2
  done
}
# wait_published MPORT N [SECONDS]: until kvbridge published N router events
wait_published() {
  local end=$((SECONDS + ${3:-30}))
  until [ "$(published "$1")" -ge "$2" ]; do
    [ $SECONDS -ge $end ] && { echo "     (published $(published "$1") of $2 in ${3:-30} s)"; return 1; }
    sleep 0.1
  done
}
# js_stat NAME FIELD: FIELD=N from js_check's "jscheck:" line in $T/NAME.out;
# -1 when there is none (js_check failed), so that sums stay numbers
js_stat() {
  local v
  v=$(grep '^jscheck:' "$T/$1.out" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p")
  echo "${v:--1}"
}

# ---- helpers for the daemon tests (test_daemon_*.sh) ------------------------

# daemon_port [N]: like free_port, but below the kernel's ephemeral range
# (ip_local_port_range), so that no outgoing connection (nor a TCP
# self-connect of a ZMQ socket retrying a port nobody listens on yet) can take
# the port between the choice and the bind
# shellcheck disable=SC2120  # the tests pass N; lib.sh itself takes one port
daemon_port() {
  local n=${1:-1} lo p i busy
  lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  [ "${lo:-0}" -gt $((10000 + n + 1000)) ] || lo=32768
  for _ in $(seq 200); do
    p=$((10000 + RANDOM % (lo - 10000 - n))); busy=0
    for i in $(seq 0 $((n - 1))); do
      if (exec 3<>/dev/tcp/127.0.0.1/$((p + i))) 2>/dev/null; then busy=1; break; fi
    done
    [ $busy = 0 ] && { echo $p; return 0; }
  done
  return 1
}

# expect_eq WHAT ACTUAL EXPECTED (and _le, _ge, _lt): compare numbers, print both
expect_eq() { if [ "$2" = "$3" ]; then ok "$1 ($2)"; else bad "$1: got '$2', want '$3'"; fi; }
expect_le() { if [ -n "$2" ] && [ "$2" -le "$3" ]; then ok "$1 ($2 <= $3)"; else bad "$1: got '$2', want <= $3"; fi; }
expect_ge() { if [ -n "$2" ] && [ "$2" -ge "$3" ]; then ok "$1 ($2 >= $3)"; else bad "$1: got '$2', want >= $3"; fi; }
expect_lt() { if [ -n "$2" ] && [ "$2" -lt "$3" ]; then ok "$1 ($2 < $3)"; else bad "$1: got '$2', want < $3"; fi; }

# wait_pid PID [SECONDS]: wait (bounded) for a child to exit on its own, KILL
# it after SECONDS; its exit code goes to RC (137 when it had to be killed).
# Call it directly, not in $(...): a subshell cannot wait for our children.
# shellcheck disable=SC2034  # RC: the result, for the caller
wait_pid() {
  local pid=$1 end=$((SECONDS + ${2:-20}))
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $end ]; then kill -s KILL "$pid" 2>/dev/null || true; break; fi
    sleep 0.05
  done
  RC=0; wait "$pid" 2>/dev/null || RC=$?
}

# signal_pid PID SIGNAL [SECONDS]: like stop_pid, but the exit code goes to RC
signal_pid() {
  kill -s "$2" "$1" 2>/dev/null || true
  wait_pid "$1" "${3:-10}"
}

# count_log FILE PATTERN: number of lines matching (0 when none or no file:
# start() creates FILE in the background, and a wait loop must not see "")
count_log() { local n; n=$(grep -c -- "$2" "$1" 2>/dev/null) || true; echo "${n:-0}"; }

# start_kvtail NAME NATS_PORT [kvtail options]: returns once subscribed (ready
# file written); PID in TAIL_PID; reads $KVB_FORMAT (--format).  Its stdout (the messages unless --quiet,
# then the "kvtail: messages=..." line) goes to $T/NAME.log, its stderr (the
# summary and check reports) to $T/NAME.err: kept apart, so that a report
# written between two flushes of stdout cannot split a message line.
start_kvtail() {
  local name=$1 port=$2; shift 2
  rm -f "$T/$name.ready"
  "$BIN/kvtail" --server "nats://127.0.0.1:$port" --ready-file "$T/$name.ready" \
    --format "$KVB_FORMAT" "$@" \
    >"$T/$name.log" 2>"$T/$name.err" &
  TAIL_PID=$!
  PIDS+=("$TAIL_PID")
  wait_file "$T/$name.ready" 15 || { tail -n 3 "$T/$name.err" | sed 's/^/     | /'; return 1; }
}

# start_kvbridge NAME CONFIG: returns once kvbridge says it is running; PID in KVB_PID
start_kvbridge() {
  start "$1" "$BIN/kvbridge" -c "$2"
  # shellcheck disable=SC2034  # for the tests
  KVB_PID=$LAST_PID
  wait_log "$T/$1.log" "running:" 15 || { tail -n 3 "$T/$1.log" | sed 's/^/     | /'; return 1; }
}

# tail_stat NAME FIELD: FIELD=N from kvtail's final "kvtail: messages=..." line
tail_stat() {
  grep '^kvtail: messages=' "$T/$1.log" 2>/dev/null | tail -1 | tr ' ' '\n' | sed -n "s/^$2=//p"
}

# expect_tail_clean NAME [STAT...]: kvtail NAME found none of the problems
# (default: holes dups bad reorders wrong badtok), each checked to be 0
expect_tail_clean() {
  local name=$1 s; shift
  [ $# -gt 0 ] || set -- holes dups bad reorders wrong badtok
  for s in "$@"; do
    expect_eq "kvtail $s" "$(tail_stat "$name" "$s")" 0
  done
}

# REC_PUBLISHED: an awk function, rec_published(E): 1 when the record's event E
# (its text after '{"type":"') goes out as a router event: by the record's own
# word when it has one (a parity workload's "fwd" on a store, "released" on a
# remove: tools/README.md), else by kvbridge's default filters (tier device,
# group 0; an empty remove publishes nothing).  Not for "cleared".
# shellcheck disable=SC2016
REC_PUBLISHED='function rec_published(e) {
  if (e ~ /^stored"/ && index(e, "\"fwd\":")) return index(e, "\"fwd\":true") > 0
  if (e ~ /^removed"/ && index(e, "\"released\":")) return !index(e, "\"released\":[]")
  if (!index(e, "\"tier\":\"device\",\"group\":0")) return 0
  return e ~ /^stored"/ || (e ~ /^removed"/ && !index(e, "\"hashes\":[]"))
}
'

# rec_counts RECORD [MODE] [RANK] [SEQ_BELOW]: the router events a correct bridge
# publishes for the batches of a kvsim --record file (rec_published() above),
# barriers not included.  MODE: live (batches published live), delivered (live or
# replayable: default), all.  RANK: only that rank.  SEQ_BELOW: only batches
# of the first incarnation with seq < SEQ_BELOW.  Prints
#   stored=N removed=N cleared=N events=N batches=N restarts=N
rec_counts() {
  [ -f "$1" ] || { echo "stored=-1 removed=-1 cleared=-1 events=-1 batches=-1 restarts=-1"; return 0; }
  awk -v mode="${2:-delivered}" -v rank="${3:-}" -v below="${4:-}" "$REC_PUBLISHED"'
  /^\{"restart":true/ { if (rank == "" || index($0, "\"rank\":" rank ",")) { restarts++; if (below != "") stop = 1 } next }
  {
    if (stop) next
    if (rank != "" && !index($0, "\"rank\":" rank ",")) next
    if (below != "") { s = $0; sub(/^\{"seq":/, "", s); sub(/,.*/, "", s); if (s + 0 >= below + 0) next }
    live = index($0, "\"live\":true") > 0; rep = index($0, "\"replay\":true") > 0
    if (mode == "live" && !live) next
    if (mode == "delivered" && !live && !rep) next
    batches++
    n = split($0, ev, /\{"type":"/)
    for (i = 2; i <= n; i++) {
      e = ev[i]
      if (e ~ /^cleared"/) { cleared++; continue }
      if (rec_published(e)) { if (e ~ /^stored"/) stored++; else removed++ }
    }
  }
  END { printf "stored=%d removed=%d cleared=%d events=%d batches=%d restarts=%d\n",
        stored, removed, cleared, stored + removed + cleared, batches, restarts }' "$1"
}

# rec_cumulative RECORD: after each batch (in record order), the number of
# router events published so far for it (rec_published() and the record's
# "cleared"; start barrier not included)
rec_cumulative() {
  [ -f "$1" ] || return 0
  awk "$REC_PUBLISHED"'/^\{"restart":true/ { next }
  { n = split($0, ev, /\{"type":"/)
    for (i = 2; i <= n; i++) {
      e = ev[i]
      if (e ~ /^cleared"/ || rec_published(e)) c++
    }
    print c + 0 }' "$1"
}

# field NAME "a=1 b=2": the value of NAME
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# cpu_ticks PID: utime + stime of a process, in clock ticks
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# bad_log WHAT FILE: bad WHAT, with the last lines of FILE (a tool's output)
bad_log() { bad "$1"; tail -n 3 "$2" 2>/dev/null | sed 's/^/     | /' || true; }
