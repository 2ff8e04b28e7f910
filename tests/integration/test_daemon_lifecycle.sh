#!/usr/bin/env bash
# Engine starts and restarts.  Every case ends with kvtail's index
# equal to the engine's truth (kvsim --record): nothing wrong, nothing
# missing (the complete history, recovered from the engine's replay socket),
# no orphan store, event_id contiguous.
#   late-0.2, late-3, late-10: the engine binds 0.2 s, 3 s, 10 s after
#       kvbridge and publishes at once (its first batches go to nobody):
#       no event lost, no barrier but the start barrier
#   restart-below: the engine process restarts (sockets closed, bound again
#       after 300 ms, seq from 0, buffer empty) and the first seq kvbridge
#       sees of it is below the old stream's last (or the proof at
#       reconnect fails first): one restart barrier,
#       nothing of the old incarnation left, the new one complete
#   restart-above: the same, the new incarnation's first 200 batches not
#       seen live, so its first seq seen is above the old last (50): the
#       continuity proof fails (other bytes at seq 50): one restart barrier
#   restart-quiet: the engine process restarts (bound again after 1 s) and
#       publishes its new incarnation's first 400 batches at once, before
#       kvbridge's SUB is back (kept in its replay buffer), then nothing: the
#       proof runs as soon as the connection is up (no live batch to start
#       it): one restart barrier, the new incarnation from seq 0
#   late-kvbridge: kvbridge starts after the engine published 500 batches:
#       start barrier, then the complete history from seq 0
#   blip: the connection drops and comes back, no restart, batches lost
#       meanwhile: continuity proven, the gap filled, no barrier
#   clock: a TensorRT-LLM-style stream whose seq starts from a clock value,
#       the engine binds after kvbridge: nothing below it asked in vain
#       turns into a barrier
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# config TAG PORT: a source with a replay endpoint at PORT, PORT+1
config() {
  SOURCES="  - endpoint: tcp://127.0.0.1:$2
    replay_endpoint: tcp://127.0.0.1:$(($2 + 1))" NATS_URLS="nats://127.0.0.1:$NP" \
    kvbridge_config "$T/$1.yaml"
}

# check_index TAG RESTARTS: kvtail's verdict, and the counts: cleared = the
# workload's + 1 start barrier + RESTARTS restart barriers
check_index() {
  local tag=$1 restarts=$2 s want
  wait_pid "$TPID" 60
  expect_eq "$tag: kvtail checks pass (exit code)" "$RC" 0
  for s in holes dups bad reorders wrong badtok missing orphans; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  want=$(rec_counts "$T/$tag.rec" all)
  expect_eq "$tag: cleared = workload's + start + $restarts restart barrier(s)" \
    "$(tail_stat "tail-$tag" cleared)" "$(($(field cleared "$want") + 1 + restarts))"
  expect_eq "$tag: kvbridge log: no gap barrier" \
    "$(count_log "$T/kvb-$tag.log" 'not recovered.*publishing barrier\|seq gap.*publishing barrier')" 0
  signal_pid "$KPID" TERM 15
  expect_eq "$tag: kvbridge exit code" "$RC" 0
}

# engine_late TAG DELAY KVSIM-ARGS...: kvbridge and kvtail first, the engine
# DELAY seconds later
engine_late() {
  local tag=$1 delay=$2 p
  shift 2
  p=$(daemon_port 2)
  config "$tag" "$p"
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || { bad "$tag: kvbridge did not start"; return; }
  KPID=$KVB_PID
  # kvtail's --timeout also bounds the wait for the first message
  start_kvtail "tail-$tag" "$NP" --quiet --check --index --expect-record "$T/$tag.rec" \
    --timeout "$(awk -v d="$delay" 'BEGIN { print int(d * 1000) + 4000 }')" \
    || { bad "$tag: kvtail not ready"; return; }
  TPID=$TAIL_PID
  sleep "$delay" # the scenario: the engine binds this long after kvbridge
  timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
    --wait-subscribers 0 --linger 2000 --record "$T/$tag.rec" "$@" 2>"$T/sim-$tag.log" \
    || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
}

for d in 0.2 3 10; do
  engine_late "late-$d" "$d" --batches 800 --rate 1000 --seed 11
  check_index "late-$d" 0
done

engine_late restart-below 0 --batches 1500 --rate 1000 --seed 12 --restart-at 900 --restart-close 300
check_index restart-below 1
# (by the proof at reconnect, or by the seq going back when the new
# incarnation's first live batch comes before the proof's answer)
expect_eq "restart-below: kvbridge log: restart detected" \
  "$(count_log "$T/kvb-restart-below.log" 'seq went back from 900 to .*: engine restart\|engine reconnected and seq 900 .*: engine restart')" 1
expect_ge "restart-below: kvbridge log: the new stream's start asked" \
  "$(count_log "$T/kvb-restart-below.log" 'stream starts at a later seq')" 1

# (the first incarnation lasts 50 ms: kvsim waits 1.5 s before it, so that
# kvbridge, retrying the connection every 250 ms at most, is connected by
# then even on a loaded machine; without it kvbridge sometimes saw only the
# second incarnation, and no restart)
engine_late restart-above 0 --batches 800 --rate 1000 --seed 13 --restart-at 50 --restart-close 300 \
  --restart-drop-live 200 --wait-subscribers 1500
check_index restart-above 1
expect_eq "restart-above: kvbridge log: continuity not proven, restart" \
  "$(count_log "$T/kvb-restart-above.log" 'engine reconnected and seq .*: engine restart')" 1

engine_late restart-quiet 0 --batches 100000 --rate 1000 --seed 17 --restart-at 300 \
  --restart-close 1000 --restart-quiet 400 --wait-subscribers 1500 --linger 3000
check_index restart-quiet 1
expect_eq "restart-quiet: kvbridge log: the new incarnation asked at reconnect" \
  "$(count_log "$T/kvb-restart-quiet.log" 'the new incarnation: asking the engine for seq 0 on')" 1

engine_late blip 0 --batches 1200 --rate 1000 --seed 14 --blip-at 400 --blip-ms 300 --drop-live 401-450
check_index blip 0
expect_eq "blip: kvbridge log: continuity proven" \
  "$(count_log "$T/kvb-blip.log" 'is the same batch, the stream continues')" 1
expect_eq "blip: kvbridge log: no restart" "$(count_log "$T/kvb-blip.log" 'engine restart')" 0

engine_late clock 0.5 --batches 600 --rate 1000 --seed 15 --seq-start 1764500000000000000
check_index clock 0

# kvbridge after the engine published 500 batches
p=$(daemon_port 2)
config late-kvbridge "$p"
rm -f "$T/mark"
start sim-late-kvbridge timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" \
  --replay "tcp://127.0.0.1:$((p + 1))" --wait-subscribers 0 --batches 1500 --rate 500 --seed 16 \
  --linger 2000 --mark-after 500 --mark-file "$T/mark" --record "$T/late-kvbridge.rec"
SPID=$LAST_PID
wait_file "$T/mark" 20 || bad "late-kvbridge: the engine did not publish 500 batches"
start_kvtail tail-late-kvbridge "$NP" --quiet --check --index --expect-record "$T/late-kvbridge.rec" \
  --timeout 3000 || bad "late-kvbridge: kvtail not ready"
TPID=$TAIL_PID
start_kvbridge kvb-late-kvbridge "$T/late-kvbridge.yaml" || bad "late-kvbridge: kvbridge did not start"
KPID=$KVB_PID
wait_pid "$SPID" 60
expect_eq "late-kvbridge: kvsim exit code" "$RC" 0
check_index late-kvbridge 0
expect_eq "late-kvbridge: kvbridge log: history from seq 0 asked" \
  "$(count_log "$T/kvb-late-kvbridge.log" 'stream starts at a later seq: asking the engine for seq 0\.\.')" 1
# the start log names what was applied: the range asked, all of it held
asked=$(sed -n 's/.*stream starts at a later seq: asking the engine for seq 0\.\.\([0-9]*\) .*/\1/p' \
  "$T/kvb-late-kvbridge.log" | head -1)
expect_eq "late-kvbridge: kvbridge log: seq 0..${asked:-?} applied from the engine's buffer" \
  "$(count_log "$T/kvb-late-kvbridge.log" "stream start: seq 0\.\.${asked:-x} applied from the engine's buffer")" 1

stop_pid "$NATS_PID" >/dev/null
finish
