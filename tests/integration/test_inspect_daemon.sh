#!/usr/bin/env bash
# kvbridge-inspect prints exactly the router events the daemon publishes.
# Every capture of tests/data (the folders with index.json and
# expected.jsonl), every payload of the fuzz corpus (tests/fuzz/regressions/
# fuzz_decode and the fuzz_decode seeds) and every frame sequence of the
# fuzz_frames seeds (tests/fuzz/mkseeds.sh: seqs that gap, go back, repeat,
# payloads above limits.max_payload_bytes) goes two ways:
#   kvsim --frames -> ZMQ -> kvbridge -> nats-server -> kvtail
#   kvbridge-inspect -c (the same configuration) --frames
# and the router events must be the same, byte for byte, in each format.
# (The fuzz_replay regressions are operation sequences for the replay rules,
# neither payloads nor frame sequences.)
#
# A frame sequence's first two bytes are fuzz_frames' configuration (block
# size, lora_salt, forward_tiers, small limits; the stream's dp_rank): the
# test writes them as a kvbridge configuration.  The cases of one
# configuration share a kvbridge: each has its topic (kvsim --frames sends a
# file on the topic of its name), mapped to a worker_id of its own, so that
# each case is its own stream with its own event_ids.  A last case (a sentinel
# batch) proves that everything before it has come through: one SUB, one
# loop, one NATS connection, in order.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

W0=1000          # case i: worker_id W0 + 1 + i
CHUNK=60         # cases per kvbridge (a source takes 64 topics)
MAX_PAYLOAD=65536 # a rejected frames record is 65537 bytes

byte() { printf '%b' "\\x$(printf %02x "$1")"; }
# abs_record SEQ FILE: a record at an absolute seq (code -128, 8 bytes big-endian)
abs_record() {
  local n i
  n=$(stat -c %s "$2")
  [ "$n" -le 65535 ] || { echo "payload $2 of $n bytes: too large for a frames record" >&2; return 1; }
  byte 128
  for i in 56 48 40 32 24 16 8 0; do byte $((($1 >> i) & 255)); done
  byte $((n & 255)); byte $((n >> 8)); cat "$2"
}

mkdir -p "$T/src" "$T/seeds"
bash tests/fuzz/mkseeds.sh "$T/seeds" >/dev/null
# every case as a frames file named GROUP_NAME, GROUP = its two header bytes
ncase=0
add_payload() { # add_payload NAME FILE: one batch at seq 0, configuration 06 00
  { byte 6; byte 0; abs_record 0 "$2"; } >"$T/src/06-00_$1" || bad "$1: not a frames case"
  ncase=$((ncase + 1))
}
for d in tests/data/*/; do
  [ -f "$d/index.json" ] && [ -f "$d/expected.jsonl" ] || continue
  name=$(basename "$d")
  # block_size 16, lora_salt, device tier (as test_inspect.sh); the batches
  # at their seqs, in the index's order
  paste -d' ' <(grep -o '"seq": *[0-9]*' "$d/index.json" | grep -o '[0-9]*$') \
    <(grep -o '"file": *"[^"]*"' "$d/index.json" | sed 's/.*"\([^"]*\)"$/\1/') >"$T/$name.idx"
  { byte 6; byte 0; while read -r seq file; do abs_record "$seq" "$d/$file" || exit 1; done <"$T/$name.idx"; } \
    >"$T/src/06-00_capture-$name" || bad "capture $name: not a frames case"
  ncase=$((ncase + 1))
done
for f in tests/fuzz/regressions/fuzz_decode/*; do add_payload "regress-$(basename "$f")" "$f"; done
for f in "$T"/seeds/fuzz_decode/*; do add_payload "seed-$(basename "$f")" "$f"; done
for f in "$T"/seeds/fuzz_frames/*; do
  g=$(od -An -tx1 -N2 "$f" | tr -d ' \n' | sed 's/^\(..\)\(..\)$/\1-\2/')
  cp "$f" "$T/src/${g}_frames-$(basename "$f")"
  ncase=$((ncase + 1))
done
expect_ge "cases" "$ncase" 100
{ byte 6; byte 0; abs_record 0 tests/data/vllm-main/000000.msgpack; } >"$T/sentinel"

# config FILE GROUP PORT FORMAT CASE...: fuzz_frames' configuration bytes as YAML
config() {
  local file=$1 g=$2 port=$3 fmt=$4 b0 b1 i=0 c; shift 4
  b0=$((16#${g%-*})); b1=$((16#${g#*-}))
  local bs=(auto 1 16 4)
  {
    echo "worker_id: $W0"
    echo "block_size: ${bs[b0 & 3]}"
    echo "lora_salt: $([ $((b0 & 4)) = 0 ] && echo false || echo true)"
    if [ $((b0 & 8)) = 0 ]; then echo "forward_tiers: [device]"
    else echo "forward_tiers: [device, host_pinned, disk, external]"; fi
    echo "limits:"
    echo "  max_payload_bytes: $MAX_PAYLOAD"
    [ $((b0 & 16)) = 0 ] || printf '  max_events_per_batch: 4\n  max_hashes_per_event: 6\n  max_tokens_per_event: 64\n  max_depth: 6\n'
    echo "sources:"
    echo "  - endpoint: \"tcp://127.0.0.1:$port\""
    echo "    dp_rank: $((b1 % 4))"
    echo "    topics:"
    for c in "$@"; do echo "      \"$(basename "$c")\": $((W0 + 1 + i))"; i=$((i + 1)); done
    echo "nats:"
    echo "  servers: [\"nats://127.0.0.1:$NP\"]"
    [ "$fmt" = dynamo-json ] || echo "  format: $fmt"
    echo "metrics: {listen: \"\"}"
  } >"$file"
}

# run_chunk GROUP FORMAT CASE...: the cases (the sentinel last) through both ways
run_chunk() {
  local g=$1 fmt=$2 tag i=0 n w c want; shift 2
  local cases=("$@" "$T/run/sentinel-$g")
  tag="$g-$fmt-$(basename "$1")"
  cp "$T/sentinel" "$T/run/sentinel-$g"
  local zp; zp=$(daemon_port)
  config "$T/$tag.yaml" "$g" "$zp" "$fmt" "${cases[@]}"
  # what inspect prints, case by case (dynamo-json lines: what kvtail prints
  # for each router event, whatever the format)
  for c in "${cases[@]}"; do
    "$BIN/kvbridge-inspect" -c "$T/$tag.yaml" --format dynamo-json --worker-id $((W0 + 1 + i)) \
      --frames "$c" >"$T/want-$tag-$i" 2>"$T/inspect-$tag-$i.err" ||
      bad_log "$(basename "$c"): kvbridge-inspect failed" "$T/inspect-$tag-$i.err"
    i=$((i + 1))
  done
  want=$(cat "$T"/want-"$tag"-* | wc -l)
  # the sentinel comes last: the count reached, everything before it is in
  # (a router event too many elsewhere shows as the sentinel's missing)
  KVB_FORMAT=$fmt start_kvtail "tail-$tag" "$NP" --count "$want" || { bad "$tag: kvtail not ready"; return; }
  local tpid=$TAIL_PID
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || { bad "$tag: kvbridge did not start"; return; }
  local kpid=$KVB_PID
  local args=()
  for c in "${cases[@]}"; do args+=(--frames "$c"); done
  start "sim-$tag" "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$zp" --linger 60000 "${args[@]}"
  local spid=$LAST_PID
  # (then TERM, not KILL: kvtail prints what it received before it exits)
  local end=$((SECONDS + 30))
  while kill -0 "$tpid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.05; done
  signal_pid "$tpid" TERM
  if [ "$RC" != 0 ]; then
    bad "$tag: kvtail did not receive $want router events in 30 s (exit $RC)"
    tail -n 3 "$T/sim-$tag.log" "$T/kvb-$tag.log" "$T/tail-$tag.err" 2>/dev/null | sed 's/^/     | /'
  fi
  stop_pid "$spid" >/dev/null
  stop_pid "$kpid" >/dev/null
  i=0
  for c in "${cases[@]}"; do
    w=$((W0 + 1 + i))
    grep "^{\"worker_id\":$w," "$T/tail-$tag.log" >"$T/got-$tag-$i" || true
    n=$(wc -l <"$T/want-$tag-$i")
    if cmp -s "$T/got-$tag-$i" "$T/want-$tag-$i"; then
      ok "$fmt $(basename "$c"): $n router events, the same"
    else
      bad "$fmt $(basename "$c"): the daemon published other router events than inspect printed"
      diff "$T/want-$tag-$i" "$T/got-$tag-$i" | head -n 6 | sed 's/^/     | /' || true
    fi
    i=$((i + 1))
  done
  expect_eq "$tag: router events received" "$(grep -c '^{' "$T/tail-$tag.log" || true)" "$want"
}

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
mkdir -p "$T/run"
for fmt in dynamo-json dynamo-msgpack; do
  for g in $(find "$T/src" -type f -printf '%f\n' | sed 's/_.*//' | sort -u); do
    mapfile -t all < <(find "$T/src" -type f -name "${g}_*" | sort)
    k=0
    while [ "$k" -lt "${#all[@]}" ]; do
      chunk=()
      for c in "${all[@]:k:CHUNK}"; do
        b=$(basename "$c"); cp "$c" "$T/run/${b#*_}"; chunk+=("$T/run/${b#*_}")
      done
      run_chunk "$g" "$fmt" "${chunk[@]}"
      k=$((k + CHUNK))
    done
  done
done
stop_pid "$NATS_PID" >/dev/null
finish
