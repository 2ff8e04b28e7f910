#!/usr/bin/env bash
# Seq gaps that cannot be filled: a "cleared" barrier is published right
# after the last event before the gap (its event_id is exactly 1 + the router
# events of the batches before the gap), event_id stays contiguous, and the
# index holds nothing the engine does not (kvtail --expect-record: wrong=0).
#   noreplay:  no replay_endpoint in the config, batches dropped live
#   forever:   replay endpoint, but the engine never buffered the batches
#   evicted:   replay endpoint with a 5-batch buffer: the reply starts later
#              than asked (part of the gap is gone), the rest is applied
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# run_case TAG WITH_REPLAY(0|1) KVSIM-ARGS...: leaves the outputs in $T
run_case() {
  local tag=$1 with_replay=$2 p
  shift 2
  p=$(daemon_port 2)
  if [ "$with_replay" = 1 ]; then
    SOURCES="  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))"
    set -- --replay "tcp://127.0.0.1:$((p + 1))" "$@"
  else
    SOURCES="  - endpoint: tcp://127.0.0.1:$p"
  fi
  NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/$tag.yaml"
  # kvbridge first, then kvtail: kvtail's --timeout runs from its start, and a
  # slow kvbridge start (make check-valgrind-integration) must not use it up;
  # kvbridge publishes nothing before kvsim's first batch
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || { bad "$tag: kvbridge did not start"; return; }
  local kpid=$KVB_PID
  start_kvtail "tail-$tag" "$NP" --check --index --expect-record "$T/$tag.rec" --timeout 2500 \
    || { bad "$tag: kvtail not ready"; return; }
  local tpid=$TAIL_PID
  timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --wait-subscribers 1000 --linger 1000 \
    --batches 1000 --rate 1000 --seed 3 --record "$T/$tag.rec" "$@" 2>"$T/sim-$tag.log" \
    || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
  wait_pid "$tpid" 30
  expect_eq "$tag: kvtail checks pass (exit code)" "$RC" 0
  local s
  for s in holes dups bad reorders wrong badtok; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  signal_pid "$kpid" TERM 15
  expect_eq "$tag: kvbridge exit code" "$RC" 0
}

# barrier_after TAG GAP_SEQ: the gap barrier is the message right after the
# events of the batches below GAP_SEQ (start barrier + those)
barrier_after() {
  local tag=$1 gap=$2 before id
  before=$(field events "$(rec_counts "$T/$tag.rec" delivered "" "$gap")")
  id=$((before + 1))
  expect_eq "$tag: message $id is the gap barrier" \
    "$(grep -m1 "\"event_id\":$id," "$T/tail-$tag.log")" \
    "{\"worker_id\":7,\"event\":{\"event_id\":$id,\"data\":\"cleared\",\"dp_rank\":0}}"
}

# 1. no replay endpoint: seq 400..409 never arrive
run_case noreplay 0 --drop-live 400-409
want=$(rec_counts "$T/noreplay.rec" live)
expect_eq "noreplay: 990 batches live" "$(field batches "$want")" 990
expect_eq "noreplay: cleared = workload's + start + 1 gap barrier" \
  "$(tail_stat tail-noreplay cleared)" "$(($(field cleared "$want") + 2))"
expect_eq "noreplay: stored = record's live batches" "$(tail_stat tail-noreplay stored)" "$(field stored "$want")"
expect_eq "noreplay: removed = record's live batches" "$(tail_stat tail-noreplay removed)" "$(field removed "$want")"
expect_eq "noreplay: kvbridge log: gap, barrier" \
  "$(count_log "$T/kvb-noreplay.log" 'seq gap: 10 missing before 410, publishing barrier')" 1
barrier_after noreplay 400

# 2. replay endpoint, but 400..404 were never buffered by the engine
run_case forever 1 --drop-forever 400-404
want=$(rec_counts "$T/forever.rec" delivered)
expect_eq "forever: cleared = workload's + start + 1 gap barrier" \
  "$(tail_stat tail-forever cleared)" "$(($(field cleared "$want") + 2))"
expect_eq "forever: stored = record's delivered batches" "$(tail_stat tail-forever stored)" "$(field stored "$want")"
expect_eq "forever: removed = record's delivered batches" "$(tail_stat tail-forever removed)" "$(field removed "$want")"
expect_eq "forever: kvbridge log: replay asked for 400..404" \
  "$(count_log "$T/kvb-forever.log" 'requesting seq 400..404')" 1
expect_eq "forever: kvbridge log: gap not recovered" \
  "$(count_log "$T/kvb-forever.log" 'not recovered\|replay skips')" 1
barrier_after forever 400

# 3. the engine's buffer (5 batches) lost the start of a 20-batch gap
run_case evicted 1 --replay-buffer 5 --drop-live 400-419
want=$(rec_counts "$T/evicted.rec" delivered)
expect_eq "evicted: cleared = workload's + start + 1 gap barrier" \
  "$(tail_stat tail-evicted cleared)" "$(($(field cleared "$want") + 2))"
expect_ge "evicted: kvbridge log: gap not (fully) recovered" \
  "$(count_log "$T/kvb-evicted.log" 'replay skips from 400 to\|gap before seq 420 not recovered')" 1
# what was published = everything but the evicted part of the gap
lost=$(($(field events "$(rec_counts "$T/evicted.rec" delivered "" 420)") - $(field events "$(rec_counts "$T/evicted.rec" delivered "" 400)")))
expect_le "evicted: published = record - part of the gap" \
  "$(tail_stat tail-evicted messages)" "$(($(field events "$want") + 2))"
expect_ge "evicted: published >= record - whole gap" \
  "$(tail_stat tail-evicted messages)" "$(($(field events "$want") + 2 - lost))"
barrier_after evicted 400

stop_pid "$NATS_PID" >/dev/null
finish
