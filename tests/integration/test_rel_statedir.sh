#!/usr/bin/env bash
# state.dir saves that start failing while kvbridge runs (a disk full, a
# directory made read-only or removed): the older saved state stays, and
#   - the first failure is logged once as an error, later ones at most once a
#     minute (not once a second);
#   - kvbridge_state_save_failures_total counts them, kvbridge_state_save_failing
#     is 1, /readyz answers 503 and says why;
#   - once saves work again: one log line, the gauge back to 0, /readyz 200,
#     and the file is current again.
# Saves are made to fail the way root cannot bypass: a directory where the
# temporary files go (kvbridge.state.tmp, kvbridge.mirror.tmp: EISDIR).
source "$(dirname "$0")/lib.sh"

np=$(daemon_port); p=$(daemon_port 2); mp=$(daemon_port)
start_nats "$np" || { bad "nats-server did not start"; finish; exit 1; }
S="$T/state"
cat >"$T/k.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
nats:
  servers: [nats://127.0.0.1:$np]
metrics:
  listen: 127.0.0.1:$mp
state:
  dir: $S
YAML
start_kvbridge kvb "$T/k.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
kpid=$KVB_PID
# an engine that keeps publishing (saves happen only when batches came)
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
  --batches 60000 --rate 500 --seed 51 --wait-subscribers 500 --linger 1000 \
  --record "$T/rec" 2>"$T/sim.log" &
spid=$!; PIDS+=("$spid")

# wait_metric SERIES VALUE [SECONDS]: until the series has VALUE (>= for counters
# with GE=1); prints what it saw on a timeout
wait_metric() {
  local end=$((SECONDS + ${3:-20})) v
  while :; do
    v=$(metric "$mp" "$1")
    if [ "${GE:-0}" = 1 ]; then [ "${v%.*}" -ge "$2" ] && return 0; else [ "$v" = "$2" ] && return 0; fi
    [ $SECONDS -ge $end ] && { echo "     (waited ${3:-20} s for $1 = $2: it is $v)"; return 1; }
    sleep 0.2
  done
}
readyz() { http_get "$mp" /readyz; echo "$HTTP_STATUS"; }

GE=1 wait_metric kvbridge_state_saves_total 2 && ok "saves work at first" || bad "no save at first"
expect_eq "/readyz while saves work" "$(readyz)" 200
expect_eq "not failing" "$(metric "$mp" kvbridge_state_save_failing)" 0

# saves start failing
mkdir "$S/kvbridge.state.tmp" "$S/kvbridge.mirror.tmp"
wait_metric kvbridge_state_save_failing 1 && ok "kvbridge_state_save_failing = 1" \
  || bad_log "the failure was not noticed" "$T/kvb.log"
GE=1 wait_metric kvbridge_state_save_failures_total 4 && ok "failures counted (4 or more)" \
  || bad "failures not counted"
expect_eq "/readyz while saves fail" "$(readyz)" 503
expect_eq "/readyz says why" "$(grep -c 'cannot save state.dir (Is a directory)' "$T/http.body")" 1
expect_eq "metric ready = 0" "$(metric "$mp" kvbridge_ready)" 0
failures=$(metric "$mp" kvbridge_state_save_failures_total)
expect_eq "logged once as an error (not once per failure)" \
  "$(count_log "$T/kvb.log" 'state.*error: cannot save to')" 1
expect_eq "no reminder within the first minute" "$(count_log "$T/kvb.log" 'still cannot save')" 0
echo "     $failures failed saves, $(count_log "$T/kvb.log" 'cannot save') log line(s)"
stale=$(awk '$1 == "stream" { print $4 }' "$S/kvbridge.state")

# saves work again
rmdir "$S/kvbridge.state.tmp" "$S/kvbridge.mirror.tmp"
wait_metric kvbridge_state_save_failing 0 && ok "kvbridge_state_save_failing back to 0" \
  || bad_log "recovery not noticed" "$T/kvb.log"
expect_eq "/readyz once saves work again" "$(readyz)" 200
expect_eq "logged once when saves work again" "$(count_log "$T/kvb.log" 'saving to .* works again')" 1
end=$((SECONDS + 10)); now=$stale
while [ "$now" = "$stale" ] && [ $SECONDS -lt $end ]; do
  sleep 0.2; now=$(awk '$1 == "stream" { print $4 }' "$S/kvbridge.state")
done
expect_lt "the saved seq moved on ($stale, then $now)" "$stale" "$now"

signal_pid "$spid" TERM 10
signal_pid "$kpid" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
finish
