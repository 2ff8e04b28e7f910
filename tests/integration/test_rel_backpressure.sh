#!/usr/bin/env bash
# NATS outage with core NATS and a small NATS buffer: kvbridge keeps the
# router's view right.
#   Two clustered nats-servers A and B; kvtail listens on B, kvbridge
#   publishes to A with nats.reconnect_buffer_bytes 200 kB and a SUB queue
#   of 50 batches.  A is killed for ~2 s under 2000 batches/s.
#   1. The engine keeps 12000 batches for replay: kvbridge pauses reading
#      when the buffer is 3/4 full, the engine drops what the SUB cannot
#      queue, and once A is back the gap is filled by replay: no barrier
#      beyond the start barrier, event_ids strictly increasing.  What core
#      NATS itself lost in flight when A died is measured and reported.
#   2. The engine keeps only 100 batches: replay cannot fill the gap, so a
#      "cleared" barrier follows the outage and the index holds nothing wrong.
# The engine goes idle at batch 6000, during the outage, and stays idle
# until kvbridge has dealt with it: no later batch reveals the gap, so
# kvbridge must find it by itself (its check of quiet streams after a
# pause: docs/router-events.md section 6).  Then it publishes the rest.
# Timing is by conditions (a loaded machine stretches everything): A is
# killed once kvbridge published 1500 router events, and comes back once
# kvsim is idle at batch 6000 and kvbridge has paused, so that the outage
# always spans thousands of batches (more than the SUB queue, the kernel's
# socket buffers and the small replay buffer).
source "$(dirname "$0")/lib.sh"

run_case() { # NAME REPLAY_BUFFER
  local name=$1 rbuf=$2 pa pb ca cb p mp ma
  pa=$(daemon_port); pb=$(daemon_port); ca=$(daemon_port); cb=$(daemon_port); p=$(daemon_port 2)
  mp=$(daemon_port); ma=$(daemon_port)
  local cl=(--cluster_name kvb --no_advertise)
  start "natsA-$name" nats-server -a 127.0.0.1 -p "$pa" -m "$ma" "${cl[@]}" -cluster "nats://127.0.0.1:$ca" -routes "nats://127.0.0.1:$cb"
  local apid=$LAST_PID
  start "natsB-$name" nats-server -a 127.0.0.1 -p "$pb" "${cl[@]}" -cluster "nats://127.0.0.1:$cb" -routes "nats://127.0.0.1:$ca"
  wait_port "$pa" 10 && wait_port "$pb" 10 || { bad "$name: nats cluster did not start"; return 1; }
  cat >"$T/$name.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
    rcvhwm: 50
nats:
  servers: [nats://127.0.0.1:$pa]
  reconnect_buffer_bytes: 200000
  reconnect_wait_ms: 300
  reconnect_wait_max_ms: 600
replay:
  timeout_ms: 3000
metrics:
  listen: 127.0.0.1:$mp
YAML
  start_kvtail "tail-$name" "$pb" --quiet --check --allow-start-offset --index --timeout 20000 \
    || { bad "$name: kvtail not ready"; return 1; }
  local tpid=$TAIL_PID
  # kvbridge publishes to A: A must know of kvtail's subscription on B
  wait_route_interest "$ma" namespace.dynamo.component.backend.kv_events 15 \
    || { bad "$name: kvtail's subscription did not reach A"; return 1; }
  start_kvbridge "kvb-$name" "$T/$name.yaml" || { bad "$name: kvbridge did not start"; return 1; }
  local kpid=$KVB_PID
  "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
    --replay-buffer "$rbuf" --batches 10000 --rate 2000 --workload prefill --seed 9 \
    --wait-subscribers 800 --linger 4000 --mark-after 6000 --mark-file "$T/mark-$name" \
    --hold-file "$T/go-$name" --record "$T/rec-$name" 2>"$T/sim-$name.log" &
  local spid=$!
  PIDS+=("$spid")
  wait_published "$mp" 1500 60 || bad "$name: kvbridge did not publish 1500 router events"
  stop_pid "$apid" KILL >/dev/null
  wait_log "$T/kvb-$name.log" "pausing the engine streams" 30 \
    && ok "$name: kvbridge paused reading while NATS was away" \
    || { bad_log "$name: no pause" "$T/kvb-$name.log"
         echo "     kvbridge: $(js_diag "$mp")"; }
  wait_file "$T/mark-$name" 30 || echo "     $name: kvsim did not reach batch 6000 in 30 s"
  start "natsA2-$name" nats-server -a 127.0.0.1 -p "$pa" "${cl[@]}" -cluster "nats://127.0.0.1:$ca" -routes "nats://127.0.0.1:$cb"
  wait_port "$pa" 10 || bad "$name: nats A did not come back"
  # the engine is idle: kvbridge asks it what it dropped, and deals with
  # the answer, before any later batch could tell
  wait_log "$T/kvb-$name.log" "asking for what the engine may have dropped" 30 \
    && ok "$name: idle engine: kvbridge asked what it dropped while paused" \
    || bad_log "$name: idle engine: kvbridge did not ask" "$T/kvb-$name.log"
  if [ "$name" = replay ]; then
    wait_log "$T/kvb-$name.log" "dropped while reading was paused, recovered" 30 \
      && ok "$name: idle engine: the dropped batches recovered" \
      || bad_log "$name: idle engine: not recovered" "$T/kvb-$name.log"
  else
    wait_log "$T/kvb-$name.log" "replay starts at" 30 \
      && ok "$name: idle engine: the loss found, barrier" \
      || bad_log "$name: idle engine: the loss not found" "$T/kvb-$name.log"
  fi
  touch "$T/go-$name"
  wait_pid "$spid" 40
  wait_pid "$tpid" 40
  kill -0 "$kpid" 2>/dev/null && ok "$name: kvbridge alive" || bad "$name: kvbridge died"
  wait_log "$T/kvb-$name.log" "reading again" 1 && ok "$name: reading resumed" \
    || bad_log "$name: never resumed" "$T/kvb-$name.log"
  local want holes msgs
  want=$(rec_counts "$T/rec-$name" all)
  # ids missing in the holes (kvtail's check line: "holes=N (M ids)")
  holes=$(sed -n 's/.*holes=[0-9]* (\([0-9]*\) ids).*/\1/p' "$T/tail-$name.err" | tail -1)
  msgs=$(tail_stat "tail-$name" messages)
  echo "     $name: engine events=$(field events "$want"), router events received=$msgs," \
       "event_ids missing (lost by core NATS when A died)=$holes"
  expect_eq "$name: no duplicates" "$(tail_stat "tail-$name" dups)" 0
  expect_eq "$name: no reordering" "$(tail_stat "tail-$name" reorders)" 0
  expect_eq "$name: no malformed message" "$(tail_stat "tail-$name" bad)" 0
  if [ "$name" = replay ]; then
    expect_eq "$name: replay never failed" "$(count_log "$T/kvb-$name.log" 'not recovered')" 0
    expect_eq "$name: only the start barrier" "$(tail_stat "tail-$name" cleared)" 1
    # everything the engine sent arrived but what core NATS dropped in flight
    # (the ids missing in event_id holes)
    expect_eq "$name: received + lost in flight = engine events + start barrier" \
      "$((msgs + holes))" "$(($(field events "$want") + 1))"
  else
    expect_ge "$name: barrier after the outage" "$(tail_stat "tail-$name" cleared)" 2
    expect_ge "$name: kvbridge says the gap was not recovered" \
      "$(count_log "$T/kvb-$name.log" 'not recovered\|replay starts at')" 1
  fi
  signal_pid "$kpid" TERM 15
  expect_eq "$name: kvbridge exit code" "$RC" 0
}

run_case replay 12000
run_case small 100
finish
