#!/usr/bin/env bash
# LoRA adapters identified by id alone (TensorRT-LLM sends lora_id with
# lora_name nil): kvsim --lora-id-only, kvbridge with sources[].lora_names.
#   named:    lora_names maps both ids: every LoRA block's tokens_hash is
#             salted with its adapter's name (kvtail checks each one against
#             kvsim's record, which salts with the names); nothing counted
#   unmapped: lora_names maps id 1 only: id 2's stores are published
#             unsalted (the record says so: --lora-unmapped 2), each counted
#             in kvbridge_stores_unsalted_total{reason="unmapped_lora_id"},
#             id 2 logged once, id 1 never; nothing is lost
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
SEED=21

# run TAG LORA_NAMES [kvsim options]: kvbridge with that map, kvsim
# publishing 600 batches with LoRA ids only, kvtail checking the record
run() {
  local tag=$1 names=$2 p mp
  shift 2
  p=$(daemon_port)
  mp=$(daemon_port)
  SOURCES="  - endpoint: tcp://127.0.0.1:$p
    lora_names: $names" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/$tag.yaml"
  sed -i "s/^  listen: \"\"/  listen: \"127.0.0.1:$mp\"/" "$T/$tag.yaml"
  MP=$mp
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || bad "$tag: kvbridge did not start"
  KPID=$KVB_PID
  start_kvtail "tail-$tag" "$NP" --check --index --expect-record "$T/$tag.rec" --timeout 2500 ||
    bad "$tag: kvtail not ready"
  TPID=$TAIL_PID
  timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --lora-id-only "$@" --batches 600 \
    --rate 1000 --seed $SEED --wait-subscribers 1000 --linger 300 --record "$T/$tag.rec" \
    2>"$T/sim-$tag.log" || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
  wait_pid "$TPID" 30
  expect_eq "$tag: kvtail checks pass (exit code)" "$RC" 0
  local s
  for s in holes dups bad reorders wrong badtok missing; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  local want
  want=$(rec_counts "$T/$tag.rec" live)
  expect_eq "$tag: stored = record" "$(tail_stat "tail-$tag" stored)" "$(field stored "$want")"
}

# lora_stores RECORD NAME: the record's device-tier, group-0 stores of adapter NAME
lora_stores() {
  grep -o '{"type":"stored"[^}]*}' "$1" | grep '"tier":"device","group":0' |
    grep -c "\"lora\":\"$2\"" || true
}

run named '{1: adapter-a, 2: adapter-b}'
a=$(lora_stores "$T/named.rec" adapter-a)
b=$(lora_stores "$T/named.rec" adapter-b)
expect_ge "named: the workload has stores of both adapters" "$((a < b ? a : b))" 1
expect_eq "named: no store went out unsalted" \
  "$(metric "$MP" 'kvbridge_stores_unsalted_total{reason="unmapped_lora_id"}')" 0
expect_eq "named: nothing logged about LoRA ids" "$(count_log "$T/kvb-named.log" 'lora_id')" 0
signal_pid "$KPID" TERM 15
expect_eq "named: kvbridge exit code" "$RC" 0

# the same workload (same seed): id 2's stores, unsalted
run unmapped '{1: adapter-a}' --lora-unmapped 2
expect_eq "unmapped: the record salts adapter-a only" \
  "$(lora_stores "$T/unmapped.rec" adapter-a) $(lora_stores "$T/unmapped.rec" adapter-b)" "$a 0"
expect_eq "unmapped: every store of lora_id 2 counted" \
  "$(metric "$MP" 'kvbridge_stores_unsalted_total{reason="unmapped_lora_id"}')" "$b"
expect_eq "unmapped: lora_id 2 logged once" \
  "$(count_log "$T/kvb-unmapped.log" 'lora_id 2 without lora_name')" 1
expect_eq "unmapped: lora_id 1 never" "$(count_log "$T/kvb-unmapped.log" 'lora_id 1 ')" 0
signal_pid "$KPID" TERM 15
expect_eq "unmapped: kvbridge exit code" "$RC" 0

stop_pid "$NATS_PID" >/dev/null
finish
