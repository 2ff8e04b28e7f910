#!/usr/bin/env bash
# Seq gaps with a replay endpoint: batches dropped live (kvsim --drop-live) are
# fetched from the engine's replay ROUTER and applied in order, so nothing is
# lost: no barrier beyond the start barrier (cleared = the workload's own
# AllBlocksCleared + 1), every batch's router events arrive (counts = record),
# event_id contiguous, the index equals the engine's, and kvbridge logs each
# gap as filled.  Both replay reply layouts (old 3-frame, new 4-frame with
# topic), and gaps close together at full speed (a second gap found among the
# live batches held during a replay must be replayed too, not turned into a
# barrier: the engine still holds it).
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# run_case TAG TOPIC GAPS KVSIM-ARGS...: GAPS = the "gap filled" lines expected
# in kvbridge's log (N exactly, or N+ for at least N)
run_case() {
  local tag=$1 topic=$2 gaps=$3 p want s
  shift 3
  p=$(daemon_port 2)
  SOURCES="  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
    topic: \"$topic\"" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/$tag.yaml"
  # kvbridge first, then kvtail: kvtail's --timeout runs from its start, and a
  # slow kvbridge start (make check-valgrind-integration) must not use it up;
  # kvbridge publishes nothing before kvsim's first batch
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || { bad "$tag: kvbridge did not start"; return; }
  local kpid=$KVB_PID
  start_kvtail "tail-$tag" "$NP" --quiet --check --index --expect-record "$T/$tag.rec" --timeout 2500 \
    || { bad "$tag: kvtail not ready"; return; }
  local tpid=$TAIL_PID
  timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
    --topic "$topic" --wait-subscribers 1000 --linger 1000 --record "$T/$tag.rec" "$@" \
    2>"$T/sim-$tag.log" || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
  wait_pid "$tpid" 30
  expect_eq "$tag: kvtail checks pass (exit code)" "$RC" 0
  want=$(rec_counts "$T/$tag.rec" delivered)
  expect_eq "$tag: stored = record (live + replayed)" "$(tail_stat "tail-$tag" stored)" "$(field stored "$want")"
  expect_eq "$tag: removed = record" "$(tail_stat "tail-$tag" removed)" "$(field removed "$want")"
  expect_eq "$tag: cleared = workload's + 1 start barrier (no loss barrier)" \
    "$(tail_stat "tail-$tag" cleared)" "$(($(field cleared "$want") + 1))"
  for s in holes dups bad wrong badtok missing orphans unknown_removes; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  if [ "${gaps%+}" != "$gaps" ]; then
    expect_ge "$tag: kvbridge log: gaps filled" "$(count_log "$T/kvb-$tag.log" 'gap filled up to seq')" "${gaps%+}"
  else
    expect_eq "$tag: kvbridge log: gaps filled" "$(count_log "$T/kvb-$tag.log" 'gap filled up to seq')" "$gaps"
  fi
  expect_eq "$tag: kvbridge log: no barrier, no failed replay" \
    "$(count_log "$T/kvb-$tag.log" 'barrier\|not recovered\|cannot request')" 0
  expect_ge "$tag: engine served replay requests" \
    "$(sed -n 's/.*replay_requests=\([0-9]*\).*/\1/p' "$T/sim-$tag.log" | head -1)" "${gaps%+}"
  signal_pid "$kpid" TERM 15
  expect_eq "$tag: kvbridge exit code" "$RC" 0
}

# Spaced gaps at a steady rate: each one is replayed before the next.
run_case old "" 3 --replay-layout old --batches 1500 --rate 1500 --drop-live 200-210,600,900-902
run_case new "kv" 3 --replay-layout new --batches 1500 --rate 1500 --drop-live 200-210,600,900-902
expect_eq "new layout: replayed batches carry the topic, stream named after it" \
  "$(count_log "$T/kvb-new.log" "topic 'kv': gap filled")" 3

# Gaps two batches apart at full speed: 512 and 514 go missing while the replay
# of 500..510 is running (the live batches behind them are held).  The engine
# still has them, so the bridge must replay them as well: 0 lost.  (Twice: the
# later cluster hits a bridge that lags further behind the engine.)
run_case close "" 1+ --batches 6000 --rate 0 --lossless --drop-live 500-510,512,514,4000-4005,4007,4009

stop_pid "$NATS_PID" >/dev/null
finish
