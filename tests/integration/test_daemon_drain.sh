#!/usr/bin/env bash
# SIGTERM drains: everything kvbridge has read reaches NATS before it exits 0.
#   end:  kvsim sends 20000 batches as fast as it can (lossless PUB); SIGTERM
#         right after kvsim exits (kvbridge may still be reading): kvtail gets
#         the start barrier + exactly the router events of the first K batches
#         of the record (usually all 20000), event_id contiguous.
#   mid:  SIGTERM while kvsim is still publishing: kvbridge stops reading and
#         exits 0 promptly; what arrived is the start barrier + the events of
#         the first K batches exactly (never half a batch, no hole).
#   outage: NATS is down when SIGTERM comes, with router events in nats.c's
#         reconnect buffer, and back 0.1 s later: the drain (flush_timeout_ms
#         8000) must wait for the reconnect and deliver them, not drop them.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# is_boundary RECORD N: echoes the K for which N = the router events of the
# record's first K batches (the first such K), -1 when there is none
is_boundary() { rec_cumulative "$1" | awk -v n="$2" '!k && $1 == n { k = NR } END { print k ? k : -1 }'; }

# 1. SIGTERM right after the engine's last batch
P=$(daemon_port)
SOURCES="  - endpoint: tcp://127.0.0.1:$P" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/end.yaml"
# kvbridge first, then kvtail: kvtail's --timeout runs from its start, and a
# slow kvbridge start (make check-valgrind-integration) must not use it up;
# kvbridge publishes nothing before kvsim's first batch
start_kvbridge kvb-end "$T/end.yaml" || bad "end: kvbridge did not start"
KPID=$KVB_PID
start_kvtail tail-end "$NP" --quiet --check --timeout 3000 || bad "end: kvtail not ready"
TPID=$TAIL_PID
timeout 40 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --batches 20000 --rate 0 --lossless \
  --seed 40 --wait-subscribers 1000 --linger 500 --record "$T/end.rec" 2>"$T/sim-end.log" \
  || bad_log "end: kvsim failed" "$T/sim-end.log"
t0=$(date +%s%N)
signal_pid "$KPID" TERM 20
t1=$(date +%s%N)
expect_eq "end: kvbridge exit code after SIGTERM" "$RC" 0
echo "     (kvbridge exited $(((t1 - t0) / 1000000)) ms after SIGTERM)"
wait_pid "$TPID" 30
expect_eq "end: kvtail checks pass (exit code)" "$RC" 0
want=$(rec_counts "$T/end.rec" live)
expect_eq "end: 20000 batches sent" "$(field batches "$want")" 20000
for s in holes dups bad reorders; do
  expect_eq "end: kvtail $s" "$(tail_stat tail-end "$s")" 0
done
# kvbridge stops reading at SIGTERM: what it had read when the signal came is
# the first K batches; all of their router events (and nothing else) must be out
m=$(tail_stat tail-end messages)
k=$(is_boundary "$T/end.rec" "$((m - 1))")
expect_ge "end: published = start barrier + the events of the first K batches (K)" "$k" 1
echo "     (kvbridge had read $k of 20000 batches: $m messages, the record has $(($(field events "$want") + 1)))"
if [ "$k" = 20000 ]; then
  expect_eq "end: all read: stored = record" "$(tail_stat tail-end stored)" "$(field stored "$want")"
  expect_eq "end: all read: removed = record" "$(tail_stat tail-end removed)" "$(field removed "$want")"
fi
expect_eq "end: no flush warning" "$(count_log "$T/kvb-end.log" 'flush at shutdown')" 0

# 2. SIGTERM in the middle of the stream
P=$(daemon_port)
SOURCES="  - endpoint: tcp://127.0.0.1:$P" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/mid.yaml"
start_kvbridge kvb-mid "$T/mid.yaml" || bad "mid: kvbridge did not start"
KPID=$KVB_PID
start_kvtail tail-mid "$NP" --quiet --check --timeout 3000 || bad "mid: kvtail not ready"
TPID=$TAIL_PID
start sim-mid timeout 40 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --batches 6000 --rate 3000 \
  --seed 41 --wait-subscribers 1000 --linger 300 --record "$T/mid.rec"
SPID=$LAST_PID
sleep 2 # about 1 s of traffic
t0=$(date +%s%N)
signal_pid "$KPID" TERM 20
t1=$(date +%s%N)
expect_eq "mid: kvbridge exit code after SIGTERM" "$RC" 0
expect_lt "mid: kvbridge exits promptly (ms)" "$(((t1 - t0) / 1000000))" 3000
wait_pid "$SPID" 30
wait_pid "$TPID" 30
expect_eq "mid: kvtail checks pass (exit code)" "$RC" 0
for s in holes dups bad reorders; do
  expect_eq "mid: kvtail $s" "$(tail_stat tail-mid "$s")" 0
done
m=$(tail_stat tail-mid messages)
k=$(is_boundary "$T/mid.rec" "$((m - 1))")
expect_ge "mid: published = start barrier + the events of the first K batches (K)" "$k" 1
expect_lt "mid: K < 6000 (stopped before the end)" "$k" 6000
echo "     (read $k of 6000 batches, $m messages)"

stop_pid "$NATS_PID" >/dev/null

# 3. SIGTERM during a NATS outage, NATS back at once
outage() { # outage N: 2 = inconclusive (kvbridge reconnected before kvtail subscribed)
  local n=$1 np p kpid npid tpid want
  np=$(daemon_port)
  p=$(daemon_port)
  cat >"$T/outage$n.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
nats:
  servers: [nats://127.0.0.1:$np]
  reconnect_wait_ms: 3000
  reconnect_wait_max_ms: 3000
  flush_timeout_ms: 8000
metrics:
  listen: ""
YAML
  start_nats "$np" || { bad "outage: nats-server did not start"; return 1; }
  npid=$NATS_PID
  start_kvbridge "kvb-outage$n" "$T/outage$n.yaml" || { bad "outage: kvbridge did not start"; return 1; }
  kpid=$KVB_PID
  stop_pid "$npid" >/dev/null
  wait_log "$T/kvb-outage$n.log" 'disconnected from NATS' 10 || bad "outage: disconnect not noticed"
  timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --batches 500 --rate 2000 --seed 42 \
    --wait-subscribers 1000 --linger 300 --record "$T/outage$n.rec" 2>"$T/sim-outage$n.log" \
    || bad_log "outage: kvsim failed" "$T/sim-outage$n.log"
  sleep 0.3
  kill -TERM "$kpid"
  start_nats "$np" || { bad "outage: nats-server did not restart"; return 1; }
  npid=$NATS_PID
  start_kvtail "tail-outage$n" "$np" --quiet --check --timeout 3000 || { bad "outage: kvtail not ready"; return 1; }
  tpid=$TAIL_PID
  if grep -q 'reconnected to NATS' "$T/kvb-outage$n.log"; then
    echo "     (outage attempt $n: kvbridge reconnected before kvtail subscribed: inconclusive)"
    stop_pid "$tpid" >/dev/null; stop_pid "$kpid" KILL >/dev/null; stop_pid "$npid" >/dev/null
    return 2
  fi
  wait_pid "$kpid" 20
  expect_eq "outage: kvbridge exit code after SIGTERM" "$RC" 0
  wait_pid "$tpid" 30
  want=$(rec_counts "$T/outage$n.rec" live)
  expect_eq "outage: router events buffered during the outage reach NATS (messages)" \
    "$(tail_stat "tail-outage$n" messages)" "$(($(field events "$want") + 1))"
  expect_eq "outage: holes" "$(tail_stat "tail-outage$n" holes)" 0
  expect_eq "outage: no 'flush at shutdown' failure" "$(count_log "$T/kvb-outage$n.log" 'flush at shutdown')" 0
  stop_pid "$npid" >/dev/null
  return 0
}
rc=0
outage 1 || rc=$?
if [ "$rc" = 2 ]; then rc=0; outage 2 || rc=$?; fi
[ "$rc" = 2 ] && bad "outage: kvbridge reconnected before kvtail could subscribe, twice: no verdict"
finish
