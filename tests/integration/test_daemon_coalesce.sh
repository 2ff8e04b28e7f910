#!/usr/bin/env bash
# nats.coalesce end to end: kvsim -> kvbridge -> nats-server -> kvtail, in
# dynamo-json and dynamo-msgpack. kvsim's realistic workload has batches with
# several chained stores and several removes; with coalesce on, kvtail's
# index still equals kvsim's record (no wrong block, no bad tokens_hash,
# nothing missing, no hole in the event_ids), and kvtail sees fewer router
# events than kvsim sent engine events. The same run with coalesce off is the
# baseline: a router event per engine event.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
BATCHES=1500

run_case() { # run_case FORMAT COALESCE
  local KVB_FORMAT=$1 co=$2 tag="$1-$2" p rc s
  p=$(daemon_port 2)
  SOURCES="  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))" NATS_URLS="nats://127.0.0.1:$NP" \
    kvbridge_config "$T/$tag.yaml"
  sed -i "s/^nats:\$/nats:\n  coalesce: $co/" "$T/$tag.yaml"
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || { bad "$tag: kvbridge did not start"; return; }
  local kvb_pid=$KVB_PID
  start_kvtail "tail-$tag" "$NP" --check --index --expect-record "$T/$tag.rec" --timeout 2500 \
    || { bad "$tag: kvtail not ready"; return; }
  local tail_pid=$TAIL_PID
  timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
    --workload realistic --batches "$BATCHES" --rate 6000 --lossless --seed 11 \
    --wait-subscribers 1000 --linger 2000 \
    --record "$T/$tag.rec" 2>"$T/sim-$tag.log" || bad_log "$tag: kvsim failed" "$T/sim-$tag.log"
  wait_pid "$tail_pid" 30; rc=$RC
  expect_eq "$tag: kvtail checks pass (exit code)" "$rc" 0
  for s in holes dups bad reorders wrong badtok missing orphans; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  expect_ge "$tag: blocks indexed and compared" "$(tail_stat "tail-$tag" indexed)" 500
  local want es er rs rr
  want=$(rec_counts "$T/$tag.rec" live)
  expect_eq "$tag: all batches published live" "$(field batches "$want")" "$BATCHES"
  es=$(field stored "$want"); er=$(field removed "$want")
  rs=$(tail_stat "tail-$tag" stored); rr=$(tail_stat "tail-$tag" removed)
  echo "# $tag: engine stored $es removed $er; router stored $rs removed $rr"
  if [ "$co" = true ]; then
    expect_ge "$tag: fewer stored router events than engine stores" "$((es - 1))" "$rs"
    expect_ge "$tag: fewer removed router events than engine removes" "$((er - 1))" "$rr"
  else
    expect_eq "$tag: coalesce off: stored events = record" "$rs" "$es"
    expect_eq "$tag: coalesce off: removed events = record" "$rr" "$er"
  fi
  signal_pid "$kvb_pid" TERM 15; rc=$RC
  expect_eq "$tag: kvbridge exit code after SIGTERM" "$rc" 0
}

for fmt in dynamo-json dynamo-msgpack; do
  run_case "$fmt" false
  run_case "$fmt" true
done

stop_pid "$NATS_PID" >/dev/null
finish
