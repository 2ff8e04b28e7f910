#!/usr/bin/env bash
# kvbridge-inspect --format dynamo-msgpack writes event-plane envelopes (hex,
# one per line); kvtail --publish --format dynamo-msgpack sends them, and a
# kvtail --format dynamo-msgpack subscriber (its own msgpack-c decoder, nothing
# from src/) must print exactly the router events of expected.jsonl, with
# the envelope sequence contiguous from 0.  The same with nats.batch false
# (one RouterEvent per envelope).  --format raw prints every batch.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
W=7587890738027725506
for d in tests/data/*/; do
  [ -f "$d/expected.jsonl" ] || continue
  name=$(basename "$d")
  for batch in true false; do
    tag=$name-$batch
    printf 'worker_id: %s\nblock_size: 16\nsources: [{endpoint: "tcp://127.0.0.1:1"}]\nnats: {format: dynamo-msgpack, batch: %s}\nmetrics: {listen: ""}\n' \
      "$W" "$batch" >"$T/$tag.yaml"
    "$BIN/kvbridge-inspect" -c "$T/$tag.yaml" "$d" >"$T/$tag.hex" || bad "$tag: inspect failed"
    n=$(wc -l <"$d/expected.jsonl")
    start_kvtail "tail-$tag" "$NP" --format dynamo-msgpack --check --count "$n" --timeout 5000 \
      || { bad "$tag: kvtail not ready"; continue; }
    tpid=$TAIL_PID
    "$BIN/kvtail" --server "nats://127.0.0.1:$NP" --format dynamo-msgpack --publish "$T/$tag.hex" \
      2>"$T/pub-$tag.err" || bad_log "$tag: kvtail --publish failed" "$T/pub-$tag.err"
    wait_pid "$tpid" 15
    expect_eq "$tag: kvtail checks pass" "$RC" 0
    grep -v '^kvtail: ' "$T/tail-$tag.log" >"$T/$tag.jsonl" || true
    if cmp -s "$T/$tag.jsonl" "$d/expected.jsonl"; then ok "$tag: decoded = expected.jsonl"
    else bad "$tag: decoded differs from expected.jsonl"; diff "$T/$tag.jsonl" "$d/expected.jsonl" | head -4; fi
    msgs=$(wc -l <"$T/$tag.hex")
    expect_eq "$tag: envelopes = inspect's lines" "$(tail_stat "tail-$tag" envelopes)" "$msgs"
    if [ "$batch" = false ]; then expect_eq "$tag: one event per envelope" "$msgs" "$n"; fi
    expect_eq "$tag: no sequence error" "$(tail_stat "tail-$tag" seqerr)" 0
  done
  expect_eq "$name: raw: one line per batch" "$("$BIN/kvbridge-inspect" --format raw "$d" | grep -c '"KV-Seq"')" \
    "$("$BIN/kvbridge-inspect" --decoded "$d" | grep -c '"events":\[')"
done
stop_pid "$NATS_PID" >/dev/null
finish
