#!/usr/bin/env bash
# Router events lost on the NATS side are repaired from the residency
# mirror (docs/router-events.md section 6, "Repairs"): a "cleared", then the
# pair's resident blocks, so that the router ends with the engine's view.
# kvsim is the engine (1000 batches/s, realistic workload, replay), kvtail
# the router (--index --expect-record): at the end its index must equal the
# engine's, no wrong block and none missing.  Before the repair the index
# lacked everything stored before the barrier until it was stored again
# (missing > 0).
#   a. a counted loss: the server is killed under load and comes back asking
#      for a token that kvtail has and kvbridge has not.  nats.c gives
#      kvbridge's connection up with its buffer (kvbridge_barriers_total
#      {cause="nats_lost"}); the token is then lifted (SIGHUP of
#      nats-server) and kvbridge gets in again: the barrier, then the
#      repair, while the engine's backlog is replayed.
#   b. nats.resync_on_reconnect: the server is killed -9 under load and
#      started again; what it had in flight is lost without a trace.
#      kvtail reconnects first (every 50 ms; kvbridge waits 3 s), then
#      kvbridge's reconnection is repaired (cause nats_reconnect).
source "$(dirname "$0")/lib.sh"

# conf FILE PORT MONITOR [TOKEN]: a nats-server configuration
conf() {
  {
    echo "listen: 127.0.0.1:$2"
    echo "http: 127.0.0.1:$3"
    [ -z "${4:-}" ] || echo "authorization { token: $4 }"
  } >"$1"
}

# connections MONITOR: clients connected to the server now
connections() {
  http_get "$1" /connz
  sed -n 's/.*"num_connections": *\([0-9]*\).*/\1/p' "$T/http.body" | head -n 1
}

# kvb_yaml FILE NATS_PORT ENGINE_PORT METRICS_PORT [EXTRA nats: lines]
kvb_yaml() {
  cat >"$1" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$3
    replay_endpoint: tcp://127.0.0.1:$(($3 + 1))
nats:
  servers: [nats://127.0.0.1:$2]
$(kvb_format_yaml)
${5:-}
replay:
  timeout_ms: 5000
metrics:
  listen: 127.0.0.1:$4
YAML
}

# the router's index against the engine's, and the repair's counters
judge() { # judge PART TAIL METRICS_PORT CAUSE
  local part=$1 tl=$2 mp=$3 cause=$4
  expect_eq "$part: kvtail: index = engine (wrong)" "$(tail_stat "$tl" wrong)" 0
  expect_eq "$part: kvtail: tokens_hash (badtok)" "$(tail_stat "$tl" badtok)" 0
  expect_eq "$part: kvtail: index = engine (missing)" "$(tail_stat "$tl" missing)" 0
  expect_ge "$part: kvtail: blocks indexed at the end" "$(tail_stat "$tl" indexed)" 100
  expect_ge "$part: barriers{cause=$cause}" "$(metric "$mp" "kvbridge_barriers_total{cause=\"$cause\"}")" 1
  expect_ge "$part: repairs{cause=$cause}" "$(metric "$mp" "kvbridge_repairs_total{cause=\"$cause\"}")" 1
  expect_ge "$part: blocks published again" "$(metric "$mp" kvbridge_repaired_blocks_total)" 100
  expect_eq "$part: nothing owed" "$(metric "$mp" kvbridge_repair_missing_blocks)" 0
  expect_eq "$part: no mirror_full barrier" "$(metric "$mp" 'kvbridge_barriers_total{cause="mirror_full"}')" 0
}

# ---- a. a server that refuses kvbridge: the connection given up ----
np=$(daemon_port); mon=$(daemon_port); p=$(daemon_port 2); mp=$(daemon_port)
conf "$T/a.conf" "$np" "$mon"
start nats-a1 nats-server -c "$T/a.conf"
npid=$LAST_PID
wait_port "$np" 10 || { bad "a: nats-server did not start"; finish; exit 1; }
kvb_yaml "$T/a.yaml" "$np" "$p" "$mp" "  reconnect_wait_ms: 200
  reconnect_wait_max_ms: 500"
start_kvtail tail-a "$np" --server "nats://s3cret@127.0.0.1:$np" --reconnect-wait 100 \
  --index --expect-record "$T/rec-a" --timeout 12000 -q || { bad "a: kvtail not ready"; finish; exit 1; }
tpid=$TAIL_PID
start_kvbridge kvb-a "$T/a.yaml" || { bad "a: kvbridge did not start"; finish; exit 1; }
kpid=$KVB_PID
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
  --batches 5000 --rate 1000 --seed 31 --wait-subscribers 800 --linger 8000 \
  --mark-after 2000 --mark-file "$T/mark-a" --record "$T/rec-a" 2>"$T/sim-a.log" &
spid=$!; PIDS+=("$spid")
wait_file "$T/mark-a" 30 || bad "a: kvsim did not reach batch 2000"
kill -s KILL "$npid"; wait "$npid" 2>/dev/null || true
conf "$T/a.conf" "$np" "$mon" s3cret
start nats-a2 nats-server -c "$T/a.conf"
npid=$LAST_PID
wait_port "$np" 10 || bad "a: nats-server did not come back"
if wait_log "$T/kvb-a.log" "closed by the client library" 20; then
  ok "a: kvbridge refused: nats.c gave the connection up"
else
  bad_log "a: kvbridge was not refused" "$T/kvb-a.log"
fi
end=$((SECONDS + 20))
until [ "$(connections "$mon")" = 1 ] || [ $SECONDS -ge $end ]; do sleep 0.05; done
expect_eq "a: kvtail back on the server (the one connection)" "$(connections "$mon")" 1
conf "$T/a.conf" "$np" "$mon"
kill -s HUP "$npid"
wait_log "$T/kvb-a.log" "connected to NATS (new connection)" 20 || bad_log "a: kvbridge did not get in again" "$T/kvb-a.log"
wait_log "$T/kvb-a.log" "repairing from the residency mirror" 20 ||
  bad_log "a: no repair started" "$T/kvb-a.log"
wait_pid "$spid" 60
wait_pid "$tpid" 60
wait_log "$T/kvb-a.log" "repair done" 10 || bad_log "a: the repair did not end" "$T/kvb-a.log"
echo "     $(grep '^kvtail: messages=' "$T/tail-a.log" | cut -c1-200)"
judge a tail-a "$mp" nats_lost
signal_pid "$kpid" TERM 15
expect_eq "a: kvbridge exit code" "$RC" 0
stop_pid "$npid" >/dev/null

# ---- b. resync_on_reconnect: a server killed -9 under load ----
attempt() { # attempt N: 2 when kvbridge reconnected before kvtail (inconclusive)
  local n=$1 np mon p mp npid tpid kpid spid end
  np=$(daemon_port); mon=$(daemon_port); p=$(daemon_port 2); mp=$(daemon_port)
  conf "$T/b$n.conf" "$np" "$mon"
  start "nats-b$n" nats-server -c "$T/b$n.conf"
  npid=$LAST_PID
  wait_port "$np" 10 || { bad "b: nats-server did not start"; return 1; }
  kvb_yaml "$T/b$n.yaml" "$np" "$p" "$mp" "  resync_on_reconnect: true
  reconnect_wait_ms: 3000
  reconnect_wait_max_ms: 3000"
  start_kvtail "tail-b$n" "$np" --reconnect-wait 50 --index --expect-record "$T/rec-b$n" \
    --timeout 12000 -q || { bad "b: kvtail not ready"; return 1; }
  tpid=$TAIL_PID
  start_kvbridge "kvb-b$n" "$T/b$n.yaml" || { bad "b: kvbridge did not start"; return 1; }
  kpid=$KVB_PID
  "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
    --batches 5000 --rate 1000 --seed $((40 + n)) --wait-subscribers 800 --linger 8000 \
    --mark-after 2000 --mark-file "$T/mark-b$n" --record "$T/rec-b$n" 2>"$T/sim-b$n.log" &
  spid=$!; PIDS+=("$spid")
  wait_file "$T/mark-b$n" 30 || bad "b: kvsim did not reach batch 2000"
  kill -s KILL "$npid"; wait "$npid" 2>/dev/null || true
  start "nats-b${n}x" nats-server -c "$T/b$n.conf"
  npid=$LAST_PID
  wait_port "$np" 10 || { bad "b: nats-server did not come back"; return 1; }
  end=$((SECONDS + 10))
  until [ "$(connections "$mon")" = 1 ] || [ $SECONDS -ge $end ]; do sleep 0.02; done
  if [ "$(count_log "$T/kvb-b$n.log" 'reconnected to NATS')" != 0 ] || [ "$(connections "$mon")" != 1 ]; then
    echo "     (attempt $n: kvbridge reconnected before kvtail: inconclusive)"
    stop_pid "$spid" >/dev/null; stop_pid "$tpid" >/dev/null
    stop_pid "$kpid" >/dev/null; stop_pid "$npid" >/dev/null
    return 2
  fi
  ok "b: kvtail reconnected before kvbridge"
  wait_log "$T/kvb-b$n.log" "resynchronising the router" 20 ||
    bad_log "b: no resync after the reconnection" "$T/kvb-b$n.log"
  wait_pid "$spid" 60
  wait_pid "$tpid" 60
  wait_log "$T/kvb-b$n.log" "repair done" 10 || bad_log "b: the repair did not end" "$T/kvb-b$n.log"
  echo "     $(grep '^kvtail: messages=' "$T/tail-b$n.log" | cut -c1-200)"
  judge b "tail-b$n" "$mp" nats_reconnect
  signal_pid "$kpid" TERM 15
  expect_eq "b: kvbridge exit code" "$RC" 0
  stop_pid "$npid" >/dev/null
  return 0
}
for n in 1 2 3; do
  rc=0; attempt "$n" || rc=$?
  [ "$rc" = 2 ] || break
done
[ "$rc" = 2 ] && bad "b: kvbridge reconnected before kvtail three times"
finish
