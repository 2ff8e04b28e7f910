#!/usr/bin/env bash
# Engine restarts: the seq goes back, kvbridge publishes a "cleared" restart
# barrier for every dp_rank of that stream right after the old incarnation's
# last event, then takes the new stream from there.  Nothing wrong in the
# index (the new engine's caches start empty), event_id contiguous, counts =
# record + start barrier + restart barrier.
#   inproc:   kvsim --restart-at (same socket, seq back to 0)
#   dp2:      the same with 2 DP ranks, replay endpoints, first seq 5000
#   process:  the engine process really goes away and a new one binds the port
#             (no replay endpoint: the restart barrier at reconnect)
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# setup TAG SOURCES_YAML: config, kvbridge, kvtail (expects $T/TAG.rec)
setup() {
  SOURCES=$2 NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/$1.yaml"
  # kvbridge first, then kvtail: kvtail's --timeout runs from its start, and a
  # slow kvbridge start (make check-valgrind-integration) must not use it up;
  # kvbridge publishes nothing before kvsim's first batch
  start_kvbridge "kvb-$1" "$T/$1.yaml" || bad "$1: kvbridge did not start"
  KPID=$KVB_PID
  start_kvtail "tail-$1" "$NP" --check --index --expect-record "$T/$1.rec" --timeout 2500 || bad "$1: kvtail not ready"
  TPID=$TAIL_PID
}

# finish_case TAG: kvtail verdict, kvbridge clean exit
finish_case() {
  wait_pid "$TPID" 30
  expect_eq "$1: kvtail checks pass (exit code)" "$RC" 0
  local s
  for s in holes dups bad reorders wrong badtok; do
    expect_eq "$1: kvtail $s" "$(tail_stat "tail-$1" "$s")" 0
  done
  signal_pid "$KPID" TERM 15
  expect_eq "$1: kvbridge exit code" "$RC" 0
}

# 1. restart inside kvsim after seq 600
P=$(daemon_port)
setup inproc "  - endpoint: tcp://127.0.0.1:$P"
timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --batches 1500 --rate 1500 --seed 4 \
  --restart-at 600 --wait-subscribers 1000 --linger 300 --record "$T/inproc.rec" 2>"$T/sim-inproc.log" \
  || bad_log "inproc: kvsim failed" "$T/sim-inproc.log"
finish_case inproc
want=$(rec_counts "$T/inproc.rec" live)
expect_eq "inproc: the record has one restart" "$(field restarts "$want")" 1
expect_eq "inproc: stored = record" "$(tail_stat tail-inproc stored)" "$(field stored "$want")"
expect_eq "inproc: removed = record" "$(tail_stat tail-inproc removed)" "$(field removed "$want")"
expect_eq "inproc: cleared = workload's + start + restart barrier" \
  "$(tail_stat tail-inproc cleared)" "$(($(field cleared "$want") + 2))"
expect_eq "inproc: kvbridge log: restart detected" \
  "$(count_log "$T/kvb-inproc.log" 'seq went back from 600 to 0: engine restart, publishing barrier')" 1
id=$(($(field events "$(rec_counts "$T/inproc.rec" live "" 601)") + 1))
expect_eq "inproc: the restart barrier follows seq 600's events (event_id $id)" \
  "$(grep -m1 "\"event_id\":$id," "$T/tail-inproc.log")" \
  "{\"worker_id\":7,\"event\":{\"event_id\":$id,\"data\":\"cleared\",\"dp_rank\":0}}"

# 2. two DP ranks with replay, seq starting at 5000, restart after 5400
P=$(daemon_port 4)
setup dp2 "  - endpoint: tcp://127.0.0.1:$P
    replay_endpoint: tcp://127.0.0.1:$((P + 2))
    dp_size: 2"
timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --replay "tcp://127.0.0.1:$((P + 2))" \
  --dp-size 2 --batches 1000 --rate 1000 --seed 6 --seq-start 5000 --restart-at 5400 \
  --wait-subscribers 1000 --linger 500 --record "$T/dp2.rec" 2>"$T/sim-dp2.log" || bad_log "dp2: kvsim failed" "$T/sim-dp2.log"
finish_case dp2
for r in 0 1; do
  want=$(rec_counts "$T/dp2.rec" live "$r")
  expect_eq "dp2 rank $r: one restart in the record" "$(field restarts "$want")" 1
  expect_eq "dp2 rank $r: router events = record + start + restart barrier" \
    "$(grep -c "\"dp_rank\":$r}}\$" "$T/tail-dp2.log" || true)" "$(($(field events "$want") + 2))"
  expect_eq "dp2 rank $r: cleared = workload's + start + restart barrier" \
    "$(grep "\"dp_rank\":$r}}\$" "$T/tail-dp2.log" | grep -c '"data":"cleared"' || true)" "$(($(field cleared "$want") + 2))"
  expect_eq "dp2 rank $r: kvbridge log: restart detected" \
    "$(count_log "$T/kvb-dp2.log" "$((P + r)): seq went back from 5400 to 5000: engine restart")" 1
done
expect_eq "dp2: no gap replay asked (a restart is not a gap; its start is asked)" "$(count_log "$T/kvb-dp2.log" 'requesting seq')" 0

# 3. a new engine process on the same port
P=$(daemon_port)
setup process "  - endpoint: tcp://127.0.0.1:$P"
timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --batches 700 --rate 1500 --seed 8 \
  --wait-subscribers 1000 --linger 300 --record "$T/process-1.rec" 2>"$T/sim-process-1.log" \
  || bad_log "process: first kvsim failed" "$T/sim-process-1.log"
timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --batches 700 --rate 1500 --seed 9 \
  --wait-subscribers 1000 --linger 300 --record "$T/process.rec" 2>"$T/sim-process-2.log" \
  || bad_log "process: second kvsim failed" "$T/sim-process-2.log"
finish_case process
w1=$(rec_counts "$T/process-1.rec" live)
w2=$(rec_counts "$T/process.rec" live)
expect_eq "process: messages = both engines' events + start + restart barrier" \
  "$(tail_stat tail-process messages)" "$(($(field events "$w1") + $(field events "$w2") + 2))"
expect_eq "process: cleared = workload's + start + restart barrier" \
  "$(tail_stat tail-process cleared)" "$(($(field cleared "$w1") + $(field cleared "$w2") + 2))"
# (no replay endpoint: the reconnect is the restart, its barrier at once)
expect_eq "process: kvbridge log: restart detected at reconnect" \
  "$(count_log "$T/kvb-process.log" 'engine reconnected and its stream after seq 699 cannot be proven without a replay endpoint: engine restart')" 1

stop_pid "$NATS_PID" >/dev/null
finish
