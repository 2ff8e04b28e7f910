#!/usr/bin/env bash
# kvbridge decides like Dynamo's relay (docs/router-events.md): kvsim's
# parity workloads through kvsim -> kvbridge -> nats-server -> kvtail.
#   hybrid:    group 1 full attention, group 0 sliding window / mamba /
#              full attention under the same hashes, removes without a kind,
#              a remove in a group no store named;
#   twogroups: one hash held in two full-attention groups (the remove goes
#              out with the last copy), stores that repeat a hash;
#   salted:    SGLang conversations, only each first turn salted (later
#              turns inherit the salt: their tokens_hash uses it), a
#              block hash under two salts (the next turn dropped);
#   remote:    vLLM 0.26+ maps with locality, ownership, medium names;
#   tierclear: GPU stores offloaded to CPU_PINNED, batches of their own with
#              TierBlocksCleared(medium GPU) (only the device tier emptied,
#              the host_pinned copies kept) or an AllBlocksCleared naming a
#              medium (dropped: ambiguous_scoped_clear), forward_tiers
#              device and host_pinned;
#   and each again with --report-full (kv_cache_report_mode: full: every
#   batch first stores the previous batch's blocks again).
# kvsim's record says, event by event, what a bridge that follows Dynamo's
# rules publishes (computed by kvsim from the rules, not from the daemon);
# kvtail's index (one copy per block, --index-set) must equal it, the
# published stores and removes must be the ones the record says, and
# kvbridge's kvbridge_events_dropped_total must count each reason the
# profile triggers.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
BATCHES=800

# rec_parity RECORD: the router events the record says go out (rec_counts:
# its "fwd" and "released"), and its drop reasons: "stored=N removed=N REASON=N ..."
rec_parity() {
  local c
  c=$(rec_counts "$1" all)
  printf 'stored=%s removed=%s' "$(field stored "$c")" "$(field removed "$c")"
  awk '{ n = split($0, ev, /\{"type":"/)
    for (i = 2; i <= n; i++)
      if (match(ev[i], /"drop":"[a-z_]*"/)) c[substr(ev[i], RSTART + 8, RLENGTH - 9)]++ }
    END { for (r in c) printf " %s=%d", r, c[r]; print "" }' "$1"
}

# run_parity TAG WORKLOAD REASONS [kvsim options]: REASONS, the drop reasons
# the profile must trigger (each non-zero in the record and in kvbridge's
# counters); COUNTERS (environment): more kvbridge series that must be > 0;
# TIERS (environment): forward_tiers (default every tier)
run_parity() {
  local tag=$1 wl=$2 reasons=$3 p mp rc want r
  shift 3
  p=$(daemon_port)
  mp=$(daemon_port)
  cat >"$T/$tag.yaml" <<YAML
worker_id: 7
block_size: 16
forward_tiers: [${TIERS:-device, host_pinned, disk, external}]
sources:
  - endpoint: tcp://127.0.0.1:$p
nats:
  servers: [nats://127.0.0.1:$NP]
$(kvb_format_yaml)
metrics:
  listen: "127.0.0.1:$mp"
YAML
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || { bad "$tag: kvbridge did not start"; return; }
  local kvb_pid=$KVB_PID
  start_kvtail "tail-$tag" "$NP" --check --index --index-set --expect-record "$T/$tag.rec" \
    --timeout 2500 || { bad "$tag: kvtail not ready"; return; }
  local tail_pid=$TAIL_PID
  timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --workload "$wl" "$@" \
    --batches "$BATCHES" --rate 2000 --seed 9 --wait-subscribers 1000 --linger 500 \
    --record "$T/$tag.rec" 2>"$T/sim-$tag.log" || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
  # the counters before kvbridge stops (kvtail's quiet timeout is past the last batch)
  wait_pid "$tail_pid" 30; rc=$RC
  expect_eq "$tag: kvtail checks pass (exit code)" "$rc" 0
  want=$(rec_parity "$T/$tag.rec")
  echo "     | record: $want"
  expect_eq "$tag: published stores = the record's" "$(tail_stat "tail-$tag" stored)" \
    "$(field stored "$want")"
  expect_eq "$tag: published removes = the record's" "$(tail_stat "tail-$tag" removed)" \
    "$(field removed "$want")"
  local s
  for s in holes dups bad reorders wrong badtok missing orphans; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  expect_ge "$tag: blocks indexed and compared" "$(tail_stat "tail-$tag" indexed)" 20
  for r in $reasons; do
    expect_ge "$tag: the record drops events as $r" "$(field "$r" "$want")" 1
    expect_ge "$tag: kvbridge counts drops as $r" \
      "$(metric "$mp" "kvbridge_events_dropped_total{reason=\"$r\"}")" 1
  done
  for r in ${COUNTERS:-}; do
    expect_ge "$tag: kvbridge counts $r" "$(metric "$mp" "$r")" 1
  done
  signal_pid "$kvb_pid" TERM 15; rc=$RC
  expect_eq "$tag: kvbridge exit code after SIGTERM" "$rc" 0
}

HELD=kvbridge_blocks_held_total REPEATED=kvbridge_blocks_repeated_total
COUNTERS=$HELD run_parity hybrid hybrid "non_main_attention_kind non_main_attention_group unlearned_group_idx"
run_parity hybrid-map hybrid "non_main_attention_kind non_main_attention_group" --encoding map
COUNTERS=$HELD run_parity twogroups twogroups "duplicate_hash copies_remain"
run_parity salted salted "ambiguous_cache_namespace resident_repeat"
run_parity remote remote "non_local_locality unsupported_ownership unknown_ownership unknown_medium"

# --report-full: the repeats publish nothing, removes still release blocks
COUNTERS="$HELD $REPEATED" run_parity full-hybrid hybrid "resident_repeat non_main_attention_kind" --report-full
COUNTERS="$HELD $REPEATED" run_parity full-twogroups twogroups "resident_repeat" --report-full
COUNTERS=$REPEATED run_parity full-salted salted "resident_repeat" --report-full
w=$(rec_parity "$T/full-twogroups.rec")
expect_ge "full-twogroups: the record releases blocks with repeats" "$(field removed "$w")" 50
expect_ge "full-twogroups: removes held for a copy still there" "$(field copies_remain "$w")" 1

# salted: later turns carry no salt of their own, yet their tokens_hash is
# the salted one (kvtail compared every block's): the record has them
expect_ge "salted: stores whose parent chain carries the salt" \
  "$(grep -c '"parent":[0-9]' "$T/salted.rec" || true)" 100

# tierclear: the scoped clears go out as "cleared" naming the device tier,
# one per TierBlocksCleared of the record, and kvtail's index (the device
# tier emptied, host_pinned kept) equals the record's truth.  dynamo-json:
# in dynamo-msgpack a "cleared" always names a tier and "device" is every
# tier (Dynamo's AllBlocksCleared), so a device-scoped clear is not told
# apart there (tools/README.md).
TC="kvbridge_events_received_total{type=\"tier_cleared\"}"
KVB_FORMAT=dynamo-json TIERS="device, host_pinned" COUNTERS="$TC" \
  run_parity tierclear tierclear "ambiguous_scoped_clear"
want=$(grep -c '"type":"cleared","tier":"device","scoped":true' "$T/tierclear.rec" || true)
expect_ge "tierclear: the record has TierBlocksCleared batches" "$want" 3
expect_eq "tierclear: published scoped clears = the record's" \
  "$(grep -c '"storage_tier":"device","event":{"event_id":[0-9]*,"data":"cleared"' "$T/tail-tierclear.log" || true)" "$want"
expect_ge "tierclear: host_pinned stores published" \
  "$(grep -c '"storage_tier":"host_pinned","event":{"event_id":[0-9]*,"data":{"stored"' "$T/tail-tierclear.log" || true)" 100

stop_pid "$NATS_PID" >/dev/null
finish
