#!/usr/bin/env bash
# SIGHUP while the engine publishes (1000 batches/s for 4 s):
#   1. a good new file moving nats.subject: the log says reloaded, events go
#      to the new subject from then on, event_id goes on without a hole or a
#      reset across the two subjects, nothing is lost (sum = record);
#   2. a bad file (block_size: sixteen): the log shows FILE:LINE:COL and
#      keeps the running configuration; events keep arriving on the new subject;
#   3. a file changing a restart-only key (state.dir): refused, still running.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
P=$(daemon_port)
CFG=$T/reload.yaml
NEW_SUBJECT=kvb.reload.7.0

write_cfg() { # write_cfg BLOCK_SIZE SUBJECT [EXTRA YAML]
  cat >"$CFG.tmp" <<YAML
worker_id: 7
block_size: $1
sources:
  - endpoint: tcp://127.0.0.1:$P
nats:
  servers: [nats://127.0.0.1:$NP]
  subject: "$2"
metrics:
  listen: ""
${3:-}
YAML
  mv "$CFG.tmp" "$CFG"
}

write_cfg 16 "namespace.{namespace}.component.{component}.kv_events"
start_kvtail old "$NP" --check --timeout 8000 || bad "kvtail (old subject) not ready"
OLD_PID=$TAIL_PID
start_kvtail new "$NP" --subject "$NEW_SUBJECT" --check --allow-start-offset --timeout 8000 \
  || bad "kvtail (new subject) not ready"
NEW_PID=$TAIL_PID
start_kvbridge kvb "$CFG" || bad "kvbridge did not start"
start sim timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --batches 4000 --rate 1000 \
  --seed 30 --wait-subscribers 1000 --linger 300 --record "$T/rec"
SIM_PID=$LAST_PID
sleep 2 # ~1 s of traffic on the old subject

# 1. good file: new subject (with {worker_id} and {dp_rank})
write_cfg 16 "kvb.reload.{worker_id}.{dp_rank}"
kill -HUP "$KVB_PID"
if wait_log "$T/kvb.log" "reloaded $CFG" 10; then ok "good file: log says reloaded"; else bad "good file: no 'reloaded' in the log"; fi
expect_eq "good file: NATS connection kept (same servers)" "$(count_log "$T/kvb.log" 'NATS reconnected')" 0
sleep 0.7

# 2. bad file: the running configuration stays
write_cfg sixteen "namespace.{namespace}.component.{component}.kv_events"
kill -HUP "$KVB_PID"
if wait_log "$T/kvb.log" "is invalid, keeping the running configuration" 10; then
  ok "bad file: log says kept"; else bad "bad file: not refused in the log"; fi
expect_eq "bad file: log shows FILE:LINE:COL" \
  "$(count_log "$T/kvb.log" "kvbridge\[config\] error: $CFG:2:13: block_size: 'sixteen' is not a decimal integer")" 1
start_kvtail late "$NP" --subject "$NEW_SUBJECT" --check --allow-start-offset --count 200 --timeout 5000 \
  || bad "kvtail (late) not ready"
LATE_PID=$TAIL_PID

# 3. a key that needs a restart: refused as a whole
write_cfg 16 "kvb.reload.{worker_id}.{dp_rank}" "state:
  dir: $T/state"
kill -HUP "$KVB_PID"
if wait_log "$T/kvb.log" "needs a restart, keeping the running configuration" 10; then
  ok "restart-only key: refused"; else bad "restart-only key: not refused"; fi

wait_pid "$LATE_PID" 15
expect_eq "after the bad reload: 200 more events on the new subject (kvtail exit)" "$RC" 0
expect_eq "after the bad reload: messages" "$(tail_stat late messages)" 200

wait_pid "$SIM_PID" 30
expect_eq "kvsim exit code" "$RC" 0
kill -0 "$KVB_PID" 2>/dev/null && ok "kvbridge still running" || bad "kvbridge died"
wait_pid "$OLD_PID" 20
expect_eq "old subject: kvtail checks pass" "$RC" 0
wait_pid "$NEW_PID" 20
expect_eq "new subject: kvtail checks pass" "$RC" 0

want=$(rec_counts "$T/rec" live)
n_old=$(tail_stat old messages)
n_new=$(tail_stat new messages)
expect_ge "old subject got events before the reload" "${n_old:-0}" 500
expect_ge "new subject got events after the reload" "${n_new:-0}" 1000
expect_eq "old + new = record + start barrier (nothing lost, nothing twice)" \
  "$((${n_old:-0} + ${n_new:-0}))" "$(($(field events "$want") + 1))"
last_old=$(grep '"event_id"' "$T/old.log" | tail -1 | sed 's/.*"event_id":\([0-9]*\),.*/\1/')
first_new=$(grep -m1 '"event_id"' "$T/new.log" | sed 's/.*"event_id":\([0-9]*\),.*/\1/')
expect_eq "event_id goes on across the reload" "$first_new" "$((last_old + 1))"
expect_eq "holes on the new subject" "$(tail_stat new holes)" 0
expect_eq "cleared: only workload's + start barrier (reload is not a loss)" \
  "$(($(tail_stat old cleared) + $(tail_stat new cleared)))" "$(($(field cleared "$want") + 1))"

signal_pid "$KVB_PID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
stop_pid "$NATS_PID" >/dev/null
finish
