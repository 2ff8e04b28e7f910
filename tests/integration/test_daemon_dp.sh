#!/usr/bin/env bash
# Data parallelism: one source with dp_size 4 expands to live ports base+0..3
# and replay ports rbase+0..3; kvsim --dp-size 4 publishes rank r on those.
# Each rank gets its own event_id counter (contiguous from 0, checked by
# kvtail per (worker_id, dp_rank)), its own start barrier, its own replay of
# a dropped batch, and exactly the router events its record lists.
#   trtllm: TensorRT-LLM's per-rank ipc sockets (rank_naming: trtllm): rank 0
#   on ipc://PATH, rank r on ipc://PATH_dp{r}, replay likewise; the engine
#   publishes at once (nothing waits for kvbridge; its first 10 batches reach
#   no subscriber): each rank's first batches come from its replay socket
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
P=$(daemon_port 8) # live P..P+3, replay P+4..P+7

SOURCES="  - endpoint: tcp://127.0.0.1:$P
    replay_endpoint: tcp://127.0.0.1:$((P + 4))
    dp_size: 4" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/dp.yaml"

# kvbridge first, then kvtail: kvtail's --timeout runs from its start, and a
# slow kvbridge start (make check-valgrind-integration) must not use it up;
# kvbridge publishes nothing before kvsim's first batch
start_kvbridge kvb "$T/dp.yaml" || bad "kvbridge did not start"
start_kvtail tail "$NP" --check --index --expect-record "$T/dp.rec" --timeout 2500 || bad "kvtail not ready"
TPID=$TAIL_PID
timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --replay "tcp://127.0.0.1:$((P + 4))" \
  --dp-size 4 --batches 1000 --rate 1000 --seed 5 --drop-live 300 --wait-subscribers 1000 \
  --linger 500 --record "$T/dp.rec" 2>"$T/sim.log" || bad_log "kvsim failed" "$T/sim.log"
wait_pid "$TPID" 30
expect_eq "kvtail checks pass (exit code)" "$RC" 0

L=$T/tail.log
expect_eq "kvtail sees 4 (worker_id, dp_rank) pairs" "$(sed -n 's/.*check: pairs=\([0-9]*\).*/\1/p' "$T/tail.err")" 4
for s in holes dups bad reorders wrong badtok missing orphans; do
  expect_eq "kvtail $s" "$(tail_stat tail "$s")" 0
done
total=0
for r in 0 1 2 3; do
  want=$(rec_counts "$T/dp.rec" delivered "$r")
  n=$(grep -c "\"dp_rank\":$r}}\$" "$L" || true)
  expect_eq "rank $r: 1000 batches in the record" "$(field batches "$want")" 1000
  expect_eq "rank $r: router events = record + start barrier" "$n" "$(($(field events "$want") + 1))"
  expect_eq "rank $r: cleared = record + start barrier" \
    "$(grep "\"dp_rank\":$r}}\$" "$L" | grep -c '"data":"cleared"' || true)" "$(($(field cleared "$want") + 1))"
  expect_eq "rank $r: first event is the start barrier" "$(grep -m1 "\"dp_rank\":$r}}\$" "$L")" \
    "{\"worker_id\":7,\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":$r}}"
  expect_eq "rank $r: last event_id = count - 1" \
    "$(grep "\"dp_rank\":$r}}\$" "$L" | tail -1 | sed 's/.*"event_id":\([0-9]*\),.*/\1/')" "$((n - 1))"
  expect_eq "rank $r: source on ports $((P + r)) / $((P + 4 + r))" \
    "$(count_log "$T/kvb.log" "connecting to tcp://127.0.0.1:$((P + r)) (dp_rank $r, replay tcp://127.0.0.1:$((P + 4 + r)))")" 1
  expect_eq "rank $r: gap at seq 300 filled from its replay port" \
    "$(count_log "$T/kvb.log" "tcp://127.0.0.1:$((P + r)): gap filled up to seq 300")" 1
  total=$((total + n))
done
expect_eq "all messages belong to ranks 0..3" "$(tail_stat tail messages)" "$total"
expect_eq "no barrier beyond the start ones (kvbridge log)" "$(count_log "$T/kvb.log" 'barrier')" 0

signal_pid "$KVB_PID" TERM 15
expect_eq "kvbridge exit code after SIGTERM" "$RC" 0

# trtllm: three ranks on ipc sockets named the TensorRT-LLM way
EP="ipc://$T/kv" REP="ipc://$T/kv-replay"
SOURCES="  - endpoint: $EP
    replay_endpoint: $REP
    dp_size: 3
    rank_naming: trtllm" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/trt.yaml"
start_kvbridge kvb-trt "$T/trt.yaml" || bad "trtllm: kvbridge did not start"
KPID=$KVB_PID
start_kvtail tail-trt "$NP" --check --index --expect-record "$T/trt.rec" --timeout 2500 ||
  bad "trtllm: kvtail not ready"
TPID=$TAIL_PID
timeout 30 "$BIN/kvsim" --endpoint "$EP" --replay "$REP" --rank-naming trtllm --dp-size 3 \
  --batches 800 --rate 1000 --seed 15 --drop-live 0-9,300 --wait-subscribers 0 --linger 500 \
  --record "$T/trt.rec" 2>"$T/sim-trt.log" || bad_log "trtllm: kvsim failed" "$T/sim-trt.log"
wait_pid "$TPID" 30
expect_eq "trtllm: kvtail checks pass (exit code)" "$RC" 0
for s in holes dups bad reorders wrong badtok missing orphans; do
  expect_eq "trtllm: kvtail $s" "$(tail_stat tail-trt "$s")" 0
done
L=$T/tail-trt.log
for r in 0 1 2; do
  ep=$EP rep=$REP
  [ "$r" = 0 ] || { ep=${EP}_dp$r; rep=${REP}_dp$r; }
  want=$(rec_counts "$T/trt.rec" delivered "$r")
  expect_eq "trtllm rank $r: source on $ep, replay $rep" \
    "$(count_log "$T/kvb-trt.log" "connecting to $ep (dp_rank $r, replay $rep)")" 1
  expect_eq "trtllm rank $r: router events = record + start barrier" \
    "$(grep -c "\"dp_rank\":$r}}\$" "$L" || true)" "$(($(field events "$want") + 1))"
  expect_eq "trtllm rank $r: the first batches came from the replay socket" \
    "$(count_log "$T/kvb-trt.log" "$ep: stream starts at a later seq: asking the engine for seq 0\.\.")" 1
  expect_eq "trtllm rank $r: gap at seq 300 filled from its replay socket" \
    "$(count_log "$T/kvb-trt.log" "$ep: gap filled up to seq 300")" 1
done
signal_pid "$KPID" TERM 15
expect_eq "trtllm: kvbridge exit code after SIGTERM" "$RC" 0
stop_pid "$NATS_PID" >/dev/null
finish
