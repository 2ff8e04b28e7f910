#!/usr/bin/env bash
# SIGHUP that changes one of two sources: the unchanged one is kept as it is
# (nginx keeps a listener whose address did not change), the changed one is
# reopened.  An engine with two DP ranks publishes 1000 batches/s per rank
# for 3 s, each rank read by its own source and published on its own subject:
#   - the log says "1 source(s) kept, 1 opened";
#   - rank 0 (unchanged): every event of the record arrives, no hole, and no
#     barrier but the start barrier (a kept source loses nothing);
#   - rank 1 (changed: its rcvhwm): still delivers after the reload, no hole.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
PA=$(daemon_port 2) # one engine, dp_size 2: rank r on port PA + r
PB=$((PA + 1))
CFG=$T/reload.yaml

write_cfg() { # write_cfg RCVHWM_OF_B
  cat >"$CFG.tmp" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$PA
    dp_rank: 0
  - endpoint: tcp://127.0.0.1:$PB
    dp_rank: 1
    rcvhwm: $1
nats:
  servers: [nats://127.0.0.1:$NP]
  subject: "kvb.reload.{dp_rank}"
metrics:
  listen: ""
YAML
  mv "$CFG.tmp" "$CFG"
}

write_cfg 100000
start_kvtail a "$NP" --subject kvb.reload.0 --check --timeout 8000 || bad "kvtail a not ready"
A_PID=$TAIL_PID
start_kvtail b "$NP" --subject kvb.reload.1 --check --allow-start-offset --timeout 8000 \
  || bad "kvtail b not ready"
B_PID=$TAIL_PID
start_kvbridge kvb "$CFG" || bad "kvbridge did not start"
start sim timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$PA" --dp-size 2 --batches 3000 \
  --rate 1000 --seed 31 --wait-subscribers 1000 --linger 300 --record "$T/rec"
SIM_PID=$LAST_PID
wait_log "$T/kvb.log" "start barrier\|dp_rank 0" 10 >/dev/null
sleep 1.5 # about half of the traffic before the reload

write_cfg 200000
kill -HUP "$KVB_PID"
if wait_log "$T/kvb.log" "reloaded $CFG" 10; then ok "log says reloaded"; else bad "no 'reloaded' in the log"; fi
expect_eq "log: one source kept, one opened" "$(count_log "$T/kvb.log" '1 source(s) kept, 1 opened')" 1

# A reload that keeps every source (only the log level changes), then one
# more: the kept sources must not refer to the configuration the first one
# freed (ASan runs this test: mk/sanitize.mk ASAN_SMOKE).
printf 'log:\n  level: info\n' >>"$CFG"
kill -HUP "$KVB_PID"
wait_log_count "$T/kvb.log" "reloaded $CFG" 2 10 \
  && ok "reload keeping every source" || bad "no second 'reloaded' in the log"
write_cfg 200000
kill -HUP "$KVB_PID"
wait_log_count "$T/kvb.log" "reloaded $CFG" 3 10 \
  && ok "a reload after it" || bad "no third 'reloaded' in the log"

wait_pid "$SIM_PID" 30
expect_eq "kvsim exit code" "$RC" 0
wait_pid "$A_PID" 20
expect_eq "rank 0: kvtail checks pass" "$RC" 0
wait_pid "$B_PID" 20
expect_eq "rank 1: kvtail checks pass" "$RC" 0

want=$(rec_counts "$T/rec" live 0)
expect_eq "rank 0 (kept): every event + the start barrier" \
  "$(tail_stat a messages)" "$(($(field events "$want") + 1))"
expect_eq "rank 0 (kept): no barrier but the start barrier" \
  "$(tail_stat a cleared)" "$(($(field cleared "$want") + 1))"
expect_eq "rank 0: holes" "$(tail_stat a holes)" 0
expect_eq "rank 1: holes" "$(tail_stat b holes)" 0
last_b=$(grep '"event_id"' "$T/b.log" | tail -1 | sed 's/.*"event_id":\([0-9]*\),.*/\1/')
expect_ge "rank 1 (reopened): events after the reload" "${last_b:-0}" 2000

signal_pid "$KVB_PID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
stop_pid "$NATS_PID" >/dev/null
finish
