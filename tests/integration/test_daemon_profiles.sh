#!/usr/bin/env bash
# kvsim's multimodal and EAGLE profiles end to end, in dynamo-json and
# dynamo-msgpack: kvsim -> kvbridge -> nats-server -> kvtail.
#   multimodal: vLLM BlockStored events whose extra_keys carry multimodal
#               identifiers (bare digests, [identifier, offset] pairs, opaque
#               identifiers), LoRA names, cache salts, digests;
#   eagle:      SGLang BlockStored events whose token_ids are bigram pairs.
# kvsim's record carries the router's tokens_hash computed by kvsim itself
# (docs/router-events.md section 3, duplicated in tools/kvsim.c as the oracle, checked
# against that file's known answers by kvsim --oracle-selftest); kvtail
# --expect-record compares every indexed block's tokens_hash with it: no
# wrong block, no bad tokens_hash, nothing missing, the counts as recorded.
# dynamo-msgpack: one envelope per engine batch (every batch of these
# profiles publishes a stored event; the start barrier rides with the first).
# Runs both formats whatever KVB_FORMAT says.
# multimodal with an image token (Qwen-VL style): kvsim --image-token-id puts
# runs of it in every block and its record hashes blocks with mm hashes by pad
# substitution; kvbridge gets the same sources[].image_token_id. A bridge
# without the key publishes tokens plus mm hashes: kvtail's badtok catches it.
# multimodal with image and video tokens: kvsim --video-token-id adds a video
# of two timestamp-split runs to every block and records Dynamo's
# modality-aware rule; kvbridge gets sources[].video_token_id too.  The same
# run against a bridge given only image_token_id must fail kvtail's badtok.
source "$(dirname "$0")/lib.sh"

# the oracle itself first: the known answers of docs/router-events.md section 3.4
check "kvsim's tokens_hash oracle gives the known answers" "$BIN/kvsim" --oracle-selftest

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
BATCHES=1200

run_profile() { # run_profile FORMAT WORKLOAD ENCODING [IMAGE_TOKEN_ID [VIDEO_TOKEN_ID [nokey]]]
  local KVB_FORMAT=$1 wl=$2 enc=$3 img=${4:-} vid=${5:-} nokey=${6:-}
  local tag="$1-$2-$3${4:+-img}${5:+-vid}${6:+-nokey}" p rc want
  local sim_img=() src_img=""
  if [ -n "$img" ]; then
    sim_img=(--image-token-id "$img")
    src_img="
    image_token_id: $img"
  fi
  if [ -n "$vid" ]; then
    sim_img+=(--video-token-id "$vid")
    [ -n "$nokey" ] || src_img="$src_img
    video_token_id: $vid"
  fi
  p=$(daemon_port 2)
  SOURCES="  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))$src_img" NATS_URLS="nats://127.0.0.1:$NP" \
    kvbridge_config "$T/$tag.yaml"
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || { bad "$tag: kvbridge did not start"; return; }
  local kvb_pid=$KVB_PID
  start_kvtail "tail-$tag" "$NP" --check --index --expect-record "$T/$tag.rec" --timeout 2500 \
    || { bad "$tag: kvtail not ready"; return; }
  local tail_pid=$TAIL_PID
  # a high rate: several batches reach kvbridge within one turn of its loop.
  # The replay endpoint: under load kvbridge may see the engine's connection
  # drop (kvsim closing) before it has read the last queued batches; it then
  # proves their continuity with the engine instead of publishing a restart
  # barrier (reported to the lead: the batches arrive with the drop)
  timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
    --workload "$wl" --encoding "$enc" "${sim_img[@]}" --batches "$BATCHES" --rate 6000 --lossless --seed 5 \
    --wait-subscribers 1000 --linger 2000 \
    --record "$T/$tag.rec" 2>"$T/sim-$tag.log" || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
  wait_pid "$tail_pid" 30; rc=$RC
  if [ -n "$nokey" ]; then
    # the record's pad-substituted hashes are not what this bridge publishes
    if [ "$rc" -ne 0 ]; then ok "$tag: kvtail checks fail without the bridge key (exit $rc)"
    else bad "$tag: kvtail checks passed without the bridge key"; fi
    expect_ge "$tag: kvtail badtok" "$(tail_stat "tail-$tag" badtok)" 100
    signal_pid "$kvb_pid" TERM 15; rc=$RC
    expect_eq "$tag: kvbridge exit code after SIGTERM" "$rc" 0
    return
  fi
  expect_eq "$tag: kvtail checks pass (exit code)" "$rc" 0
  want=$(rec_counts "$T/$tag.rec" live)
  expect_eq "$tag: all batches published live" "$(field batches "$want")" "$BATCHES"
  expect_eq "$tag: stored events = record" "$(tail_stat "tail-$tag" stored)" "$(field stored "$want")"
  expect_eq "$tag: removed events = record" "$(tail_stat "tail-$tag" removed)" "$(field removed "$want")"
  local s
  for s in holes dups bad reorders wrong badtok missing orphans; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  expect_ge "$tag: blocks indexed and compared" "$(tail_stat "tail-$tag" indexed)" 500
  if [ "$KVB_FORMAT" = dynamo-json ] && [ "$wl" = multimodal ]; then
    # not vacuous: many blocks carry multimodal objects (whose hashes enter
    # tokens_hash); JSON writes mm_extra_info only for those
    expect_ge "$tag: stored events with multimodal objects" \
      "$(count_log "$T/tail-$tag.log" '"mm_objects"')" 200
  fi
  if [ "$KVB_FORMAT" = dynamo-msgpack ]; then
    # no envelope carries two engine batches (a barrier may travel alone)
    expect_ge "$tag: an envelope per engine batch" "$(tail_stat "tail-$tag" envelopes)" "$BATCHES"
    expect_eq "$tag: envelope sequence errors" "$(tail_stat "tail-$tag" seqerr)" 0
  fi
  expect_eq "$tag: kvbridge logged no warning" "$(count_log "$T/kvb-$tag.log" ' warn:\| error:')" 0
  signal_pid "$kvb_pid" TERM 15; rc=$RC
  expect_eq "$tag: kvbridge exit code after SIGTERM" "$rc" 0
}

for fmt in dynamo-json dynamo-msgpack; do
  run_profile "$fmt" multimodal positional
  run_profile "$fmt" multimodal map
  run_profile "$fmt" multimodal map 151655
  run_profile "$fmt" multimodal map 151655 151656
  run_profile "$fmt" eagle positional
done

run_profile dynamo-json multimodal map 151655 151656 nokey

stop_pid "$NATS_PID" >/dev/null
finish
