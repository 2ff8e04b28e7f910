#!/usr/bin/env bash
# A malformed engine stream does not stop kvbridge:
#   garbage:    payloads that are not msgpack batches (kvsim --malformed-at)
#               -> one "cleared" barrier each, right after the events of the
#               batches before it; the stream goes on (events after it arrive)
#   frames:     2-frame messages (--bad-frames-at) are dropped; the next seq
#               shows the gap, the replay endpoint has the real batch: 0 lost
#   frames-nr:  the same without a replay endpoint: a gap barrier each
# Always: event_id contiguous, nothing wrong in the index, clean exit.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# run_case TAG WITH_REPLAY KVSIM-ARGS...
run_case() {
  local tag=$1 with_replay=$2 p s
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
    --batches 1000 --rate 1000 --seed 12 --record "$T/$tag.rec" "$@" 2>"$T/sim-$tag.log" \
    || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
  wait_pid "$tpid" 30
  expect_eq "$tag: kvtail checks pass (exit code)" "$RC" 0
  for s in holes dups bad reorders wrong badtok; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  if kill -0 "$kpid" 2>/dev/null; then ok "$tag: kvbridge still running"; else bad "$tag: kvbridge died"; fi
  signal_pid "$kpid" TERM 15
  expect_eq "$tag: kvbridge exit code" "$RC" 0
}

# is_barrier TAG ID: message ID is a "cleared" for rank 0
is_barrier() {
  expect_eq "$1: message $2 is a barrier" "$(grep -m1 "\"event_id\":$2," "$T/tail-$1.log")" \
    "{\"worker_id\":7,\"event\":{\"event_id\":$2,\"data\":\"cleared\",\"dp_rank\":0}}"
}

# 1. garbage payloads at seq 300 and 700
run_case garbage 0 --malformed-at 300,700
want=$(rec_counts "$T/garbage.rec" live)
expect_eq "garbage: 998 good batches" "$(field batches "$want")" 998
expect_eq "garbage: stored = record" "$(tail_stat tail-garbage stored)" "$(field stored "$want")"
expect_eq "garbage: removed = record" "$(tail_stat tail-garbage removed)" "$(field removed "$want")"
expect_eq "garbage: cleared = workload's + start + 2 malformed barriers" \
  "$(tail_stat tail-garbage cleared)" "$(($(field cleared "$want") + 3))"
expect_eq "garbage: kvbridge log: malformed batch at 300 and 700" \
  "$(count_log "$T/kvb-garbage.log" 'seq [37]00: malformed batch (.*): publishing barrier')" 2
b1=$(($(field events "$(rec_counts "$T/garbage.rec" live "" 300)") + 1))
b2=$(($(field events "$(rec_counts "$T/garbage.rec" live "" 700)") + 2))
is_barrier garbage "$b1"
is_barrier garbage "$b2"
expect_ge "garbage: events published after the second barrier" \
  "$(($(tail_stat tail-garbage messages) - 1 - b2))" 100

# 2. 2-frame messages at 300 and 700, real batches in the replay buffer
run_case frames 1 --bad-frames-at 300,700
want=$(rec_counts "$T/frames.rec" delivered)
expect_eq "frames: stored = record (incl. replayed)" "$(tail_stat tail-frames stored)" "$(field stored "$want")"
expect_eq "frames: removed = record" "$(tail_stat tail-frames removed)" "$(field removed "$want")"
expect_eq "frames: cleared = workload's + start only (0 lost)" \
  "$(tail_stat tail-frames cleared)" "$(($(field cleared "$want") + 1))"
expect_eq "frames: missing = 0 (index equals the engine)" "$(tail_stat tail-frames missing)" 0
expect_eq "frames: kvbridge log: 2-frame message dropped" \
  "$(count_log "$T/kvb-frames.log" 'message with 2 frames (want 3): dropped')" 2
expect_eq "frames: kvbridge log: gaps filled" "$(count_log "$T/kvb-frames.log" 'gap filled up to seq [37]00')" 2

# 3. the same without a replay endpoint
run_case frames-nr 0 --bad-frames-at 300,700
want=$(rec_counts "$T/frames-nr.rec" live)
expect_eq "frames-nr: stored = record" "$(tail_stat tail-frames-nr stored)" "$(field stored "$want")"
expect_eq "frames-nr: cleared = workload's + start + 2 gap barriers" \
  "$(tail_stat tail-frames-nr cleared)" "$(($(field cleared "$want") + 3))"
expect_eq "frames-nr: kvbridge log: gap barriers" \
  "$(count_log "$T/kvb-frames-nr.log" 'seq gap: 1 missing before [37]01, publishing barrier')" 2

stop_pid "$NATS_PID" >/dev/null
finish
