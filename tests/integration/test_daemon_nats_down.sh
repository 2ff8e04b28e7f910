#!/usr/bin/env bash
# NATS down at start: kvbridge starts without a server (connect_timeout_ms 0:
# wait forever, buffer publishes), the engine publishes 1000 batches, then
# nats-server comes up and kvtail subscribes before kvbridge's next reconnect
# attempt (reconnect_wait_ms 1500).  kvtail must then get everything kvbridge
# read while NATS was down: event_id contiguous from 0, counts = record,
# index = engine.
source "$(dirname "$0")/lib.sh"

attempt() { # attempt N: returns 2 when kvbridge reached NATS before kvtail (inconclusive)
  local n=$1 np p s
  np=$(daemon_port)
  p=$(daemon_port)
  cat >"$T/down$n.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
nats:
  servers: [nats://127.0.0.1:$np]
  reconnect_wait_ms: 1500
  reconnect_wait_max_ms: 1500
$(kvb_format_yaml)
metrics:
  listen: ""
YAML
  start_kvbridge "kvb$n" "$T/down$n.yaml" || { bad "kvbridge did not start without NATS"; return 1; }
  local kpid=$KVB_PID
  expect_eq "kvbridge log: NATS not reachable, buffering" \
    "$(count_log "$T/kvb$n.log" 'NATS not reachable yet; retrying in the background')" 1
  timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --batches 1000 --rate 2000 --seed 50 \
    --wait-subscribers 1000 --linger 300 --record "$T/rec$n" 2>"$T/sim$n.log" || bad_log "kvsim failed" "$T/sim$n.log"
  sleep 0.3 # let kvbridge convert the last batches
  kill -0 "$kpid" 2>/dev/null && ok "kvbridge alive while NATS is down" || bad "kvbridge died without NATS"

  start_nats "$np" || { bad "nats-server did not start"; return 1; }
  local npid=$NATS_PID
  start_kvtail "tail$n" "$np" --check --index --expect-record "$T/rec$n" --timeout 4000 \
    || { bad "kvtail not ready"; return 1; }
  local tpid=$TAIL_PID
  if grep -q 'connected to NATS' "$T/kvb$n.log"; then
    echo "     (attempt $n: kvbridge reconnected before kvtail subscribed: inconclusive)"
    stop_pid "$tpid" >/dev/null; stop_pid "$kpid" >/dev/null; stop_pid "$npid" >/dev/null
    return 2
  fi
  if wait_log "$T/kvb$n.log" 'connected to NATS' 10; then ok "kvbridge connected once NATS came up"; else bad "kvbridge never connected"; fi
  wait_pid "$tpid" 30
  expect_eq "kvtail checks pass (exit code)" "$RC" 0
  local want
  want=$(rec_counts "$T/rec$n" live)
  expect_eq "all 1000 batches published live" "$(field batches "$want")" 1000
  expect_eq "messages = record events + start barrier (nothing lost in the reconnect buffer)" \
    "$(tail_stat "tail$n" messages)" "$(($(field events "$want") + 1))"
  expect_eq "stored = record" "$(tail_stat "tail$n" stored)" "$(field stored "$want")"
  expect_eq "removed = record" "$(tail_stat "tail$n" removed)" "$(field removed "$want")"
  expect_eq "first message: the start barrier, event_id 0" "$(grep -m1 '"event_id"' "$T/tail$n.log")" \
    '{"worker_id":7,"event":{"event_id":0,"data":"cleared","dp_rank":0}}'
  for s in holes dups bad reorders wrong badtok missing orphans; do
    expect_eq "kvtail $s" "$(tail_stat "tail$n" "$s")" 0
  done
  signal_pid "$kpid" TERM 15
  expect_eq "kvbridge exit code" "$RC" 0
  stop_pid "$npid" >/dev/null
  return 0
}

rc=0
attempt 1 || rc=$?
if [ "$rc" = 2 ]; then rc=0; attempt 2 || rc=$?; fi
[ "$rc" = 2 ] && bad "kvbridge reconnected before kvtail could subscribe, twice: no verdict"
finish
