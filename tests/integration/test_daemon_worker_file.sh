#!/usr/bin/env bash
# worker_id_file: the worker id comes from a file a launcher
# writes; SIGHUP reads it again, and a changed id is a reload that keeps the
# source open and starts the new worker's event_ids at 0 with a start barrier
# ("cleared", event_id 0), while the engine goes on publishing.  Every router
# event of the engine arrives, under the old id before the reload and the new
# one after, each id contiguous from 0 (kvtail --check).
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
P=$(daemon_port); PR=$(daemon_port)

echo 201 >"$T/worker-id"
cat >"$T/wf.yaml" <<YAML
worker_id_file: worker-id
block_size: 16
forward_tiers: [device]
sources:
  - endpoint: tcp://127.0.0.1:$P
    replay_endpoint: tcp://127.0.0.1:$PR
nats:
  servers: [nats://127.0.0.1:$NP]
$(kvb_format_yaml)
metrics:
  listen: ""
YAML
expect_eq "--check -v: the id from the file" \
  "$("$BIN/kvbridge" -c "$T/wf.yaml" --check -v | grep -E '^(worker_id|sources\[0\]\.worker_id):' | tr '\n' ' ')" \
  "worker_id: 201 sources[0].worker_id: 201 "
start_kvbridge kvb "$T/wf.yaml" || bad "kvbridge did not start"
expect_eq "kvbridge log: worker 201" "$(count_log "$T/kvb.log" "running: worker_id 201,")" 1
start_kvtail tail "$NP" --check --timeout 4000 || bad "kvtail not ready"
TPID=$TAIL_PID
start_kvtail tail202 "$NP" --worker 202 --check --quiet --timeout 4000 || bad "kvtail 202 not ready"
T2=$TAIL_PID

timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --replay "tcp://127.0.0.1:$PR" \
  --batches 2400 --rate 400 --seed 41 --wait-subscribers 1000 --linger 8000 \
  --record "$T/rec" 2>"$T/sim.log" &
SIM=$!
wait_log "$T/tail.log" '"worker_id":201,"event":{"event_id":50,' 15 \
  && ok "events of worker 201 arrive" || bad "no events of worker 201"
echo 202 >"$T/worker-id"
kill -HUP "$KVB_PID"
wait_log "$T/kvb.log" "reloaded $T/wf.yaml" 10 && ok "SIGHUP: reloaded" || bad_log "SIGHUP: no reload" "$T/kvb.log"
expect_eq "SIGHUP: the source was not reopened" "$(count_log "$T/kvb.log" "sources reopened")" 0
wait_pid "$TPID" 40
expect_eq "kvtail --check passes (both ids contiguous from 0)" "$RC" 0
expect_tail_clean tail holes dups bad reorders
wait_pid "$T2" 20
expect_eq "kvtail --worker 202 --check passes" "$RC" 0
expect_eq "worker 202: its first event is the start barrier" \
  "$(grep -m1 '^{"worker_id":202,' "$T/tail.log")" \
  '{"worker_id":202,"event":{"event_id":0,"data":"cleared","dp_rank":0}}'
last201=$(awk '/^\{"worker_id":201,/ { n = NR } END { print n }' "$T/tail.log")
first202=$(awk '/^\{"worker_id":202,/ && !n { n = NR } END { print n }' "$T/tail.log")
expect_lt "every event of 201 before the first of 202" "${last201:-x}" "${first202:-0}"
wait_pid "$SIM" 30
w=$(rec_counts "$T/rec" live)
expect_eq "all 2400 batches live" "$(field batches "$w")" 2400
expect_eq "stored = record (both ids)" "$(tail_stat tail stored)" "$(field stored "$w")"
expect_eq "removed = record (both ids)" "$(tail_stat tail removed)" "$(field removed "$w")"
expect_eq "cleared = record + the two start barriers" "$(tail_stat tail cleared)" \
  "$(($(field cleared "$w") + 2))"

# an id file that does not hold an id: the reload is refused, 202 stays
echo "not-an-id" >"$T/worker-id"
kill -HUP "$KVB_PID"
wait_log "$T/kvb.log" "does not hold a worker id" 10 && ok "bad id file: reported" \
  || bad_log "bad id file: not reported" "$T/kvb.log"
wait_log "$T/kvb.log" "keeping the running configuration" 10 && ok "bad id file: reload refused" \
  || bad_log "bad id file: not refused" "$T/kvb.log"

signal_pid "$KVB_PID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
stop_pid "$NATS_PID" >/dev/null
finish
