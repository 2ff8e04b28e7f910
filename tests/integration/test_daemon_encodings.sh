#!/usr/bin/env bash
# Every engine encoding end to end: kvsim (positional | map events, hashes as
# u64 | signed int | 32-byte bin) -> kvbridge -> nats-server -> kvtail.
# For each: every router event arrives, event_id contiguous from 0, the index
# equals the engine's (no wrong, no missing, no orphan), and the numbers of
# stored / removed / cleared router events equal what kvsim's record says
# after kvbridge's default filters (tier device, group 0) plus the start
# barrier.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

run_combo() { # run_combo ENCODING HASH
  local enc=$1 hash=$2 tag="$1-$2" p rc want
  p=$(daemon_port)
  WORKER=18446744073709551615 SOURCES="  - endpoint: tcp://127.0.0.1:$p" \
    NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/$tag.yaml"
  # kvbridge first, then kvtail: kvtail's --timeout runs from its start, and a
  # slow kvbridge start (make check-valgrind-integration) must not use it up;
  # kvbridge publishes nothing before kvsim's first batch
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || { bad "$tag: kvbridge did not start"; return; }
  local kvb_pid=$KVB_PID
  start_kvtail "tail-$tag" "$NP" --check --index --expect-record "$T/$tag.rec" --timeout 2500 \
    || { bad "$tag: kvtail not ready"; return; }
  local tail_pid=$TAIL_PID
  timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --encoding "$enc" --hash "$hash" \
    --batches 1500 --rate 3000 --seed 11 --wait-subscribers 1000 --linger 300 \
    --record "$T/$tag.rec" 2>"$T/sim-$tag.log" || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
  wait_pid "$tail_pid" 30; rc=$RC
  expect_eq "$tag: kvtail checks pass (exit code)" "$rc" 0
  want=$(rec_counts "$T/$tag.rec" live)
  expect_eq "$tag: all 1500 batches published live" "$(field batches "$want")" 1500
  expect_eq "$tag: stored events = record" "$(tail_stat "tail-$tag" stored)" "$(field stored "$want")"
  expect_eq "$tag: removed events = record" "$(tail_stat "tail-$tag" removed)" "$(field removed "$want")"
  expect_eq "$tag: cleared = record's AllBlocksCleared + 1 start barrier" \
    "$(tail_stat "tail-$tag" cleared)" "$(($(field cleared "$want") + 1))"
  expect_eq "$tag: messages = record events + 1" "$(tail_stat "tail-$tag" messages)" "$(($(field events "$want") + 1))"
  local s
  for s in holes dups bad reorders wrong badtok missing orphans; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  # the first message is the start barrier, byte for byte
  expect_eq "$tag: first message is the start barrier" "$(head -1 "$T/tail-$tag.log")" \
    '{"worker_id":18446744073709551615,"event":{"event_id":0,"data":"cleared","dp_rank":0}}'
  expect_eq "$tag: kvbridge logged no warning" "$(count_log "$T/kvb-$tag.log" ' warn:\| error:')" 0
  signal_pid "$kvb_pid" TERM 15; rc=$RC
  expect_eq "$tag: kvbridge exit code after SIGTERM" "$rc" 0
}

for enc in positional map; do
  for hash in uint int bin; do
    run_combo "$enc" "$hash"
  done
done

stop_pid "$NATS_PID" >/dev/null
finish
