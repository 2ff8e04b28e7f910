#!/usr/bin/env bash
# The engine's load and liveness (sources[].engine): kvsim serves a vLLM-like
# /metrics and /health whose KV usage follows its simulated cache.
#  1. load: ActiveLoad messages (dynamo-json) on ...endpoint.generate.kv_metrics
#     track kvsim's usage (the last one equals kvsim's final usage x total
#     blocks, and so does kvbridge_engine_kv_used_blocks); the stats line
#     appears, and its "published" counts add up to the metric.
#  2. an idle but healthy kvsim (no batch for longer than dead_after_ms,
#     /metrics answering): no engine_gone barrier.
#  3. kvsim stops answering (SIGUSR1) while still idle: after dead_after_ms,
#     exactly one barrier per dp_rank (2 ranks), once; /readyz 503 names it.
#  4. a killed kvsim (SIGKILL) with no batches: the same, once.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
P=$(daemon_port 2)
HP=$(daemon_port)
MP=$(daemon_port)
SUBJ=namespace.dynamo.component.backend.endpoint.generate.kv_metrics
TOTAL=1000
SOURCES="  - endpoint: tcp://127.0.0.1:$P
    dp_size: 2
    engine:
      kind: vllm
      metrics_url: http://127.0.0.1:$HP/metrics
      health_url: http://127.0.0.1:$HP/health
      scrape_interval_ms: 100
      dead_after_ms: 1500" NATS_URLS="nats://127.0.0.1:$NP" \
  EXTRA="log:
  stats_interval_s: 1" kvbridge_config "$T/e.yaml"
sed -i "s/^  listen: \"\"/  listen: \"127.0.0.1:$MP\"/" "$T/e.yaml"

rm -f "$T/load.ready"
stdbuf -oL "$BIN/kvtail" --server "nats://127.0.0.1:$NP" --subject "$SUBJ" \
  --ready-file "$T/load.ready" >"$T/load.log" 2>"$T/load.err" &
PIDS+=("$!")
wait_file "$T/load.ready" 15 || bad "kvtail (load) not ready"

# kvsim first (its HTTP face answers before kvbridge scrapes), then kvbridge
start sim "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --dp-size 2 --http "127.0.0.1:$HP" \
  --total-blocks $TOTAL --workload decode --rate 40 --batches 80 --wait-subscribers 2000 \
  --linger 600000
SPID=$LAST_PID
wait_port "$HP" 10 || bad "kvsim's HTTP face did not start"
start_kvbridge kvb "$T/e.yaml" || bad "kvbridge did not start"
wait_port "$MP" 10 || bad "kvbridge's metrics listener did not start"

# wait_metric SERIES MIN [SECONDS]: until the series is at least MIN (bounded)
wait_metric() {
  local end=$((SECONDS + ${3:-15}))
  until [ "$(metric "$MP" "$1")" -ge "$2" ] || [ $SECONDS -ge $end ]; do sleep 0.1; done
}
# kvsim's usage (rank R) from its /metrics, as blocks
sim_used() {
  http_get "$HP" /metrics
  awk -v r="$1" -v t=$TOTAL '$1 == "vllm:kv_cache_usage_perc{engine=\"" r "\",model_name=\"kvsim\"}" {
    printf "%d\n", $2 * t + 0.5 }' "$T/http.body"
}
# the last ActiveLoad message of dp_rank R: its kv_used_blocks
last_load() {
  grep "\"dp_rank\":$1," "$T/load.log" 2>/dev/null | tail -1 |
    sed -n 's/.*"kv_used_blocks":\([0-9]*\)}.*/\1/p'
}
gauge() { metric "$MP" "kvbridge_engine_kv_used_blocks{source=\"tcp://127.0.0.1:$1\",dp_rank=\"$2\"}"; }

# ---- 1. load tracks kvsim's usage -------------------------------------------
# (the stats lines are checked against the metrics: nothing may happen
# between the last batch and the idle line but the load messages)
end=$((SECONDS + 30))
until [ "$(metric "$MP" kvbridge_batches_received_total)" -ge 160 ] || [ $SECONDS -ge $end ]; do sleep 0.02; done
t0=$(date +%s%N) # kvsim's cache is final: its last batch is in
expect_eq "kvbridge applied every batch of both ranks" "$(metric "$MP" kvbridge_batches_received_total)" 160
for r in 0 1; do
  want=$(sim_used $r)
  end=$((SECONDS + 10))
  until [ "$(last_load $r)" = "$want" ] || [ $SECONDS -ge $end ]; do sleep 0.05; done
  expect_eq "rank $r: the last load message equals kvsim's usage x total blocks" "$(last_load $r)" "$want"
  # one scrape interval (100 ms) after the last batch, plus slack for the
  # polling here and a busy machine
  [ $r = 0 ] && expect_lt "rank 0: the final load arrived within a scrape interval (+ 500 ms slack) (ms)" \
    $((($(date +%s%N) - t0) / 1000000)) 600
  expect_eq "rank $r: kvbridge_engine_kv_used_blocks" "$(gauge $((P + r)) $r)" "$want"
  expect_ge "rank $r: load messages followed the changes" "$(grep -c "\"dp_rank\":$r," "$T/load.log")" 3
done
expect_eq "a load message's shape" \
  "$(grep '"dp_rank":0,' "$T/load.log" | tail -1 | sed 's/"kv_used_blocks":[0-9]*/"kv_used_blocks":N/')" \
  '{"worker_id":7,"dp_rank":0,"active_decode_blocks":null,"active_prefill_tokens":null,"scheduler_load_scope":null,"kv_used_blocks":N}'

# the stats line: per source, and "all:" lines whose published counts add up
# an idle line logged after every batch was in: the lines before it cover them all
n0=$(wc -l <"$T/kvb.log")
end=$((SECONDS + 15))
until tail -n +"$((n0 + 1))" "$T/kvb.log" | grep -q "kvbridge\[stats\] info: idle for" || [ $SECONDS -ge $end ]; do
  sleep 0.1
done
tail -n +"$((n0 + 1))" "$T/kvb.log" | grep -q "kvbridge\[stats\] info: idle for" || bad "no idle stats line after the batches"
expect_ge "a stats line per source" "$(count_log "$T/kvb.log" "stats\] info: tcp://127.0.0.1:$P: .* batches/s, .* events/s, .* gaps; engine dp_rank 0: kv ")" 1
expect_ge "the second source's line" "$(count_log "$T/kvb.log" "stats\] info: tcp://127.0.0.1:$((P + 1)): .*; engine dp_rank 1: kv ")" 1
sum=$(sed -n 's/.*stats\] info: all: .* published \([0-9]*\).*/\1/p' "$T/kvb.log" | awk '{ n += $1 } END { print n + 0 }')
expect_eq "the stats lines' published counts add up to the metric" "$sum" "$(published "$MP")"

# ---- 2. idle but healthy: no barrier ------------------------------------------
s0=$(metric "$MP" kvbridge_engine_scrapes_total)
wait_metric kvbridge_engine_scrapes_total $((s0 + 30))
expect_eq "idle, healthy engine (3 s of scrapes, no batch): no engine_gone barrier" \
  "$(metric "$MP" 'kvbridge_barriers_total{cause="engine_gone"}')" 0
http_get "$MP" /readyz
expect_eq "/readyz while the engine is idle" "$HTTP_STATUS" 200

# ---- 3. stops answering: one barrier per dp_rank ------------------------------
kill -USR1 "$SPID"
wait_metric 'kvbridge_barriers_total{cause="engine_gone"}' 2
expect_eq "not answering: one engine_gone barrier per dp_rank" "$(metric "$MP" 'kvbridge_barriers_total{cause="engine_gone"}')" 2
expect_eq "kvbridge_engines_gone" "$(metric "$MP" kvbridge_engines_gone)" 1
http_get "$MP" /readyz
expect_eq "/readyz while the engine is gone" "$HTTP_STATUS" 503
check "/readyz names the engine" grep -q "engine gone: tcp://127.0.0.1:$P dp_rank 0" "$T/http.body"
f0=$(metric "$MP" kvbridge_engine_scrape_failures_total)
wait_metric kvbridge_engine_scrape_failures_total $((f0 + 20))
expect_eq "still gone 20 scrapes later: no more barriers" "$(metric "$MP" 'kvbridge_barriers_total{cause="engine_gone"}')" 2
expect_eq "logged once" "$(count_log "$T/kvb.log" 'engine gone:')" 1

kill -USR2 "$SPID"
end=$((SECONDS + 10))
until [ "$(metric "$MP" kvbridge_engines_gone)" = 0 ] || [ $SECONDS -ge $end ]; do sleep 0.1; done
expect_eq "answering again: not gone" "$(metric "$MP" kvbridge_engines_gone)" 0
http_get "$MP" /readyz
expect_eq "/readyz once it answers again" "$HTTP_STATUS" 200

# ---- 4. killed: one barrier per dp_rank, once ---------------------------------
# (nothing was published for either rank since the first engine_gone barriers:
# the router holds nothing of them, so the new ones are counted as redundant
# instead of published)
r0=$(metric "$MP" kvbridge_barriers_redundant_total)
stop_pid "$SPID" KILL >/dev/null
wait_metric kvbridge_engine_gone_total 2
f0=$(metric "$MP" kvbridge_engine_scrape_failures_total)
wait_metric kvbridge_engine_scrape_failures_total $((f0 + 20))
expect_eq "killed: one more engine_gone barrier per dp_rank, once (published or redundant)" \
  "$(($(metric "$MP" 'kvbridge_barriers_total{cause="engine_gone"}') + $(metric "$MP" kvbridge_barriers_redundant_total) - r0))" 4
expect_eq "kvbridge_engine_gone_total" "$(metric "$MP" kvbridge_engine_gone_total)" 2
expect_eq "kvbridge_engine_up" "$(metric "$MP" "kvbridge_engine_up{source=\"tcp://127.0.0.1:$P\",dp_rank=\"0\"}")" 0

signal_pid "$KVB_PID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
expect_eq "kvbridge logged no error" "$(count_log "$T/kvb.log" 'error:')" 0
finish
