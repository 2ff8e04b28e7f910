#!/usr/bin/env bash
# Bind mode (fan-in): kvbridge binds its SUB (mode: bind) and the engine's PUB
# connects to it (kvsim --connect), with a topic.  Every router event arrives
# (counts = record), event_id contiguous, index = engine.  A second engine
# process connecting later with seqs from 0 again is seen as a restart of the
# same stream: one restart barrier, then its events.  SIGHUP changing the
# bound source reopens it on the same address, and a third engine's events
# arrive.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
P=$(daemon_port)

SOURCES="  - endpoint: tcp://127.0.0.1:$P
    mode: bind
    topic: engine-a" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/bind.yaml"
# kvbridge first, then kvtail: kvtail's --timeout runs from its start, and a
# slow kvbridge start (make check-valgrind-integration) must not use it up;
# kvbridge publishes nothing before kvsim's first batch
start_kvbridge kvb "$T/bind.yaml" || bad "kvbridge did not start"
start_kvtail tail "$NP" --check --index --expect-record "$T/rec2" --timeout 2500 || bad "kvtail not ready"
TPID=$TAIL_PID
expect_eq "kvbridge log: SUB bound" "$(count_log "$T/kvb.log" "bound tcp://127.0.0.1:$P (dp_rank 0)")" 1
if wait_port "$P" 5; then ok "kvbridge listens on $P"; else bad "kvbridge does not listen on $P"; fi

for i in 1 2; do
  timeout 30 "$BIN/kvsim" --connect --endpoint "tcp://127.0.0.1:$P" --topic engine-a --batches 800 \
    --rate 1600 --seed "$((20 + i))" --wait-subscribers 1000 --linger 500 --record "$T/rec$i" \
    2>"$T/sim$i.log" || bad_log "kvsim $i failed" "$T/sim$i.log"
done
wait_pid "$TPID" 30
expect_eq "kvtail checks pass (exit code)" "$RC" 0
expect_tail_clean tail
w1=$(rec_counts "$T/rec1" live)
w2=$(rec_counts "$T/rec2" live)
expect_eq "engine 1: all 800 batches live" "$(field batches "$w1")" 800
first=$(($(field events "$w1") + 1))
expect_eq "engine 1's events arrive after the start barrier (event_id 1..$((first - 1)))" \
  "$(grep -m1 "\"event_id\":$first," "$T/tail.log")" \
  "{\"worker_id\":7,\"event\":{\"event_id\":$first,\"data\":\"cleared\",\"dp_rank\":0}}"
expect_eq "stored = both records" "$(tail_stat tail stored)" "$(($(field stored "$w1") + $(field stored "$w2")))"
expect_eq "removed = both records" "$(tail_stat tail removed)" "$(($(field removed "$w1") + $(field removed "$w2")))"
expect_eq "cleared = workload's + start + restart barrier" \
  "$(tail_stat tail cleared)" "$(($(field cleared "$w1") + $(field cleared "$w2") + 2))"
expect_eq "kvtail: index = engine 2's cache (missing)" "$(tail_stat tail missing)" 0
expect_eq "kvbridge log: second engine = restart of stream 'engine-a'" \
  "$(count_log "$T/kvb.log" "topic 'engine-a': seq went back from 799 to 0: engine restart")" 1
expect_eq "kvbridge log: no gap" "$(count_log "$T/kvb.log" 'seq gap')" 0

# SIGHUP changing the bound source and NATS (a server nobody runs): the running
# SUB is closed for the new one, the new NATS connection fails, so the reload
# is refused and the running source is opened again on its address
DEAD=$(daemon_port)
cat >"$T/bind.yaml" <<YAML
worker_id: 7
block_size: 16
forward_tiers: [device]
sources:
  - endpoint: tcp://127.0.0.1:$P
    mode: bind
    topic: engine-a
    rcvhwm: 4000
nats:
  servers: [nats://127.0.0.1:$DEAD]
  connect_timeout_ms: 300
metrics:
  listen: ""
YAML
kill -HUP "$KVB_PID"
wait_log "$T/kvb.log" "cannot connect to NATS" 10 && ok "failed SIGHUP: refused (NATS unreachable)" \
  || bad_log "failed SIGHUP: no refusal logged" "$T/kvb.log"
# bound: at start, by the refused reload, and again for the running source
for _ in $(seq 100); do [ "$(count_log "$T/kvb.log" "bound tcp://127.0.0.1:$P ")" -ge 3 ] && break; sleep 0.1; done
expect_eq "failed SIGHUP: the running source bound again" "$(count_log "$T/kvb.log" "bound tcp://127.0.0.1:$P ")" 3
expect_eq "failed SIGHUP: kvbridge still running" "$(kill -0 "$KVB_PID" 2>/dev/null && echo yes)" yes

# SIGHUP changing the bound source (rcvhwm): the new SUB binds the address the
# running one holds, so kvbridge closes that first; a third engine then
# delivers all its events through the reopened socket
SOURCES="  - endpoint: tcp://127.0.0.1:$P
    mode: bind
    topic: engine-a
    rcvhwm: 5000" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/bind.yaml"
kill -HUP "$KVB_PID"
wait_log "$T/kvb.log" "reloaded .*(sources reopened)" 10 && ok "SIGHUP: sources reopened on the same address" \
  || bad_log "SIGHUP: no reload" "$T/kvb.log"
expect_eq "SIGHUP: no 'cannot open the new sources'" "$(count_log "$T/kvb.log" 'cannot open the new sources')" 0
start_kvtail tail3 "$NP" --check --timeout 2500 || bad "kvtail 3 not ready"
T3=$TAIL_PID
timeout 30 "$BIN/kvsim" --connect --endpoint "tcp://127.0.0.1:$P" --topic engine-a --batches 300 \
  --rate 1600 --seed 23 --wait-subscribers 1000 --linger 500 --record "$T/rec3" \
  2>"$T/sim3.log" || bad_log "kvsim 3 failed" "$T/sim3.log"
wait_pid "$T3" 30
w3=$(rec_counts "$T/rec3" live)
expect_eq "after the reload: stored = engine 3's record" "$(tail_stat tail3 stored)" "$(field stored "$w3")"
expect_eq "after the reload: removed = engine 3's record" "$(tail_stat tail3 removed)" "$(field removed "$w3")"
expect_eq "after the reload: cleared = engine 3's + its restart barrier" \
  "$(tail_stat tail3 cleared)" "$(($(field cleared "$w3") + 1))"
# (kvtail 3 subscribed mid-stream: the ids before it are its one "hole")
expect_tail_clean tail3 dups bad reorders

signal_pid "$KVB_PID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
stop_pid "$NATS_PID" >/dev/null
finish
