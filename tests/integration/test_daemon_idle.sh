#!/usr/bin/env bash
# Idle CPU: kvbridge connected to NATS and to an engine (with a replay
# endpoint) that publishes nothing for 5 s uses (almost) no CPU: utime+stime
# from /proc/PID/stat must stay under 5% of the wall time (a loop that polls
# without blocking would burn ~100%).  The same while NATS is down and
# nats.c keeps reconnecting; and SIGTERM then still ends kvbridge in bounded
# time (nats.flush_timeout_ms, default 5 s).
source "$(dirname "$0")/lib.sh"

HZ=$(getconf CLK_TCK)
NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
P=$(daemon_port 2)
SOURCES="  - endpoint: tcp://127.0.0.1:$P
    replay_endpoint: tcp://127.0.0.1:$((P + 1))" NATS_URLS="nats://127.0.0.1:$NP" \
  EXTRA="log:
  level: debug" kvbridge_config "$T/idle.yaml"

start_kvtail tail "$NP" --check --count 2 --timeout 10000 || bad "kvtail not ready"
TPID=$TAIL_PID
start_kvbridge kvb "$T/idle.yaml" || bad "kvbridge did not start"
# one batch (so that the SUB is surely connected), then nothing for 20 s
start sim timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --replay "tcp://127.0.0.1:$((P + 1))" \
  --workload prefill --batches 1 --wait-subscribers 1000 --linger 20000
SPID=$LAST_PID
wait_pid "$TPID" 15
expect_eq "the batch went through (start barrier + 1 store)" "$(tail_stat tail messages)" 2
sleep 0.5

# measure WHAT SECONDS: CPU ticks of kvbridge over SECONDS of wall time
measure() {
  local what=$1 secs=$2 c0 c1 t0 t1 used wall
  c0=$(cpu_ticks "$KVB_PID"); t0=$(date +%s%N)
  sleep "$secs"
  c1=$(cpu_ticks "$KVB_PID"); t1=$(date +%s%N)
  used=$((c1 - c0))
  wall=$(((t1 - t0) * HZ / 1000000000)) # in ticks
  echo "     ($what: kvbridge used $used ticks of CPU in $wall ticks of wall time, HZ=$HZ)"
  expect_lt "$what: CPU < 5% of wall time (ticks)" "$used" "$((wall / 20))"
}
measure "idle, connected" 5
expect_eq "kvbridge logged nothing while idle" "$(count_log "$T/kvb.log" 'warn:\|error:')" 0

stop_pid "$NATS_PID" >/dev/null
wait_log "$T/kvb.log" 'disconnected from NATS' 10 || bad "kvbridge did not notice NATS going away"
measure "idle, NATS down" 3

stop_pid "$SPID" >/dev/null
t0=$(date +%s%N)
signal_pid "$KVB_PID" TERM 15
ms=$((($(date +%s%N) - t0) / 1000000))
expect_eq "kvbridge exit code (NATS down at shutdown)" "$RC" 0
expect_lt "NATS down at shutdown: gives up within flush_timeout_ms (5000) + 2 s (ms)" "$ms" 7000
finish
