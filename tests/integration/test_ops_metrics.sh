#!/usr/bin/env bash
# The metrics endpoint against what the engine really sent.  kvsim publishes
# 1000 batches with a replay endpoint and faults: batches dropped live (gaps
# the replay fills), dropped forever (a gap it cannot fill: barrier), garbage
# payloads (malformed batches: barriers), a 2-frame message (malformed frames,
# then a gap the replay fills) and an engine restart.  /metrics (scraped with a
# bash /dev/tcp HTTP client, no curl needed) must count exactly what kvsim's
# --record says: batches, events by type, drops by reason, router events by
# type (= kvtail's counts), gaps, replays requested/filled/failed, barriers by
# cause, restarts, malformed messages by kind, the per-stream series and the
# histograms.  Then the probes: /healthz 200; /readyz 200, 503 once
# nats-server is stopped, 200 again once it is back on the same port.  And
# every metric conf/grafana-kvbridge.json queries exists in the exposition.
source "$(dirname "$0")/lib.sh"

# scrape NAME: /metrics into $T/NAME.prom (fails the test on a non-200)
scrape() {
  http_get "$MP" /metrics
  cp "$T/http.body" "$T/$1.prom"
  [ "$HTTP_STATUS" = 200 ] || bad "GET /metrics: status $HTTP_STATUS"
}

# scraped NAME SERIES: the value of SERIES in $T/NAME.prom (exactly as exposed, labels included)
scraped() { awk -v k="$2" '$1 == k { print $2; f = 1 } END { if (!f) print "absent" }' "$T/$1.prom"; }

# wait_status PATH STATUS SECONDS: poll until PATH answers STATUS
wait_status() {
  local end=$((SECONDS + $3))
  while :; do
    http_get "$MP" "$1"
    [ "$HTTP_STATUS" = "$2" ] && return 0
    [ $SECONDS -ge $end ] && return 1
    sleep 0.1
  done
}

# rec_expect RECORD: what a correct bridge counts for a kvsim --record file
# (batches delivered live or by replay; kvbridge's default filters: group 0,
# tier device, removes with hashes), as NAME=VALUE lines
rec_expect() {
  awk '
  /^\{"restart":true/ { next }
  {
    s = $0; sub(/^\{"seq":/, "", s); sub(/,.*/, "", s); last = s
    live = index($0, "\"live\":true") > 0; rep = index($0, "\"replay\":true") > 0
    mal = index($0, "\"fault\":\"malformed\"") > 0
    if (live || mal) arrived++
    if (!live && !rep) next
    batches++
    n = split($0, ev, /\{"type":"/)
    for (i = 2; i <= n; i++) {
      e = ev[i]; t = e; sub(/".*/, "", t)
      recv[t]++
      if (t == "cleared") { pub["cleared"]++; continue }
      g = 0; if (match(e, /"group":[0-9]+/)) g = substr(e, RSTART + 8, RLENGTH - 8) + 0
      tier = ""; if (match(e, /"tier":"[a-z_]+"/)) tier = substr(e, RSTART + 8, RLENGTH - 9)
      # the group rules of docs/router-events.md section 8: kvsim group-1
      # stores say sliding_window; a group-1 remove follows the kind its
      # group last stored, or is unlearned before any
      if (g != 0 && t == "stored") { drop["non_main_attention_kind"]++; learned[g] = 1 }
      else if (g != 0) drop[learned[g] ? "non_main_attention_group" : "unlearned_group_idx"]++
      else if (tier != "device") drop["tier_filtered"]++
      else if (t == "removed" && index(e, "\"hashes\":[]")) drop["empty_remove"]++
      else pub[t]++
    }
  }
  END {
    printf "batches=%d arrived=%d last_seq=%d\n", batches, arrived, last
    printf "recv_stored=%d recv_removed=%d recv_cleared=%d\n", recv["stored"], recv["removed"], recv["cleared"]
    printf "pub_stored=%d pub_removed=%d pub_cleared=%d\n", pub["stored"], pub["removed"], pub["cleared"]
    printf "drop_non_main_attention_kind=%d drop_non_main_attention_group=%d\n",
      drop["non_main_attention_kind"], drop["non_main_attention_group"]
    printf "drop_unlearned_group_idx=%d drop_tier_filtered=%d drop_empty_remove=%d\n",
      drop["unlearned_group_idx"], drop["tier_filtered"], drop["empty_remove"]
  }' "$1" | tr ' ' '\n'
}

NP=$(daemon_port)
MP=$(daemon_port)
P=$(daemon_port 2)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
cat >"$T/kvb.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$P
    replay_endpoint: tcp://127.0.0.1:$((P + 1))
nats:
  servers: [nats://127.0.0.1:$NP]
  reconnect_wait_ms: 100
  reconnect_wait_max_ms: 200
metrics:
  listen: 127.0.0.1:$MP
YAML

# kvbridge first, then kvtail: kvtail's --timeout runs from its start, and a
# slow kvbridge start (make check-valgrind-integration) must not use it up;
# kvbridge publishes nothing before kvsim's first batch
start_kvbridge kvb "$T/kvb.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
KPID=$KVB_PID
start_kvtail tail "$NP" --check --index --expect-record "$T/rec" --timeout 2500 \
  || { bad "kvtail not ready"; finish; exit 1; }
TPID=$TAIL_PID
wait_port "$MP" 10 || bad "metrics port $MP not listening"

# before any engine batch: the probes, and every family exposed at 0
http_get "$MP" /healthz
expect_eq "GET /healthz: 200" "$HTTP_STATUS" 200
expect_eq "GET /healthz: body" "$(cat "$T/http.body")" ok
if wait_status /readyz 200 10; then ok "GET /readyz: 200 (NATS connected, source set up)"; else bad "GET /readyz: $HTTP_STATUS, want 200"; fi
http_get "$MP" /nope
expect_eq "GET /nope: 404" "$HTTP_STATUS" 404
scrape idle
expect_eq "idle: kvbridge_batches_received_total 0" "$(scraped idle kvbridge_batches_received_total)" 0
expect_eq "idle: kvbridge_ready 1" "$(scraped idle kvbridge_ready)" 1
expect_eq "idle: kvbridge_nats_connected 1" "$(scraped idle kvbridge_nats_connected)" 1
expect_eq "idle: kvbridge_build_info carries the version" \
  "$(grep -c "^kvbridge_build_info{version=\"$("$BIN/kvbridge" --version | awk '{ print $2 }')\"} 1$" "$T/idle.prom")" 1

# the workload: gaps 100-104 and 300 (filled), 500-502 (never buffered: barrier),
# garbage at 650 and 700 (barriers), 2 frames at 800 (malformed frames + a gap
# the replay fills), a restart after 949 (seq 0..49 again: below every fault)
timeout 40 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --replay "tcp://127.0.0.1:$((P + 1))" \
  --wait-subscribers 1000 --linger 1000 --batches 1000 --rate 1000 --seed 21 --record "$T/rec" \
  --drop-live 100-104,300 --drop-forever 500-502 --malformed-at 650,700 --bad-frames-at 800 \
  --restart-at 949 2>"$T/sim.log" || bad_log "kvsim failed" "$T/sim.log"
wait_pid "$TPID" 30
expect_eq "kvtail checks pass (exit code)" "$RC" 0
for s in holes dups bad wrong badtok; do
  expect_eq "kvtail $s" "$(tail_stat tail "$s")" 0
done
scrape run
rec_expect "$T/rec" >"$T/want"
want() { sed -n "s/^$1=//p" "$T/want"; }
PUB_CLEARED=$(want pub_cleared)
m() { scraped run "$1"; }

# engine input
expect_eq "batches_received_total = batches delivered (live or replayed, decodable)" \
  "$(m kvbridge_batches_received_total)" "$(want batches)"
for t in stored removed cleared; do
  expect_eq "events_received_total{type=\"$t\"} = record" "$(m "kvbridge_events_received_total{type=\"$t\"}")" "$(want "recv_$t")"
done
for t in unknown malformed; do
  expect_eq "events_received_total{type=\"$t\"} = 0" "$(m "kvbridge_events_received_total{type=\"$t\"}")" 0
done
for r in non_main_attention_kind non_main_attention_group unlearned_group_idx tier_filtered \
  empty_remove; do
  expect_eq "events_dropped_total{reason=\"$r\"} = record" "$(m "kvbridge_events_dropped_total{reason=\"$r\"}")" "$(want "drop_$r")"
done
for r in unknown_kind unknown_medium non_local_locality duplicate_hash resident_repeat copies_remain \
  block_size_mismatch unsupported_tokens no_complete_block unknown_event_type malformed_event; do
  expect_eq "events_dropped_total{reason=\"$r\"} = 0" "$(m "kvbridge_events_dropped_total{reason=\"$r\"}")" 0
done
expect_eq "unknown_medium_total = 0" "$(m kvbridge_unknown_medium_total)" 0

# router output: = the record, = what kvtail received
barriers=5 # start, gap (500-502), restart, malformed at 650 and 700
expect_eq "router_events_published_total{type=\"stored\"} = record" \
  "$(m 'kvbridge_router_events_published_total{type="stored"}')" "$(want pub_stored)"
expect_eq "router_events_published_total{type=\"removed\"} = record" \
  "$(m 'kvbridge_router_events_published_total{type="removed"}')" "$(want pub_removed)"
expect_eq "router_events_published_total{type=\"cleared\"} = record + $barriers barriers" \
  "$(m 'kvbridge_router_events_published_total{type="cleared"}')" "$((${PUB_CLEARED:-0} + barriers))"
for t in stored removed cleared; do
  expect_eq "router_events_published_total{type=\"$t\"} = kvtail's $t" \
    "$(m "kvbridge_router_events_published_total{type=\"$t\"}")" "$(tail_stat tail "$t")"
done
# num SERIES: its value, 0 when absent (the checks above report that)
num() { local v; v=$(m "$1"); [[ $v =~ ^[0-9]+$ ]] && echo "$v" || echo 0; }
sum_recv=0; sum_pub=0; sum_drop=0; sum_bar=0
for t in stored removed cleared unknown malformed; do sum_recv=$((sum_recv + $(num "kvbridge_events_received_total{type=\"$t\"}"))); done
for t in stored removed cleared; do sum_pub=$((sum_pub + $(num "kvbridge_router_events_published_total{type=\"$t\"}"))); done
while read -r r; do
  sum_drop=$((sum_drop + $(num "kvbridge_events_dropped_total{reason=\"$r\"}")))
done < <(sed -n 's/^kvbridge_events_dropped_total{reason="\([a-z_]*\)"}.*/\1/p' "$T/run.prom")
for c in start gap restart malformed_batch; do sum_bar=$((sum_bar + $(num "kvbridge_barriers_total{cause=\"$c\"}"))); done
expect_eq "every event received is published or dropped (received = published - barriers + dropped)" \
  "$sum_recv" "$((sum_pub - sum_bar + sum_drop))"

# sequence, gaps, replays, barriers, malformed
expect_eq "seq_gaps_total (100-104, 300, 500-502, 800)" "$(m kvbridge_seq_gaps_total)" 4
expect_eq "replays_requested_total" "$(m kvbridge_replays_requested_total)" 4
expect_eq "replays_filled_total (100-104, 300, 800)" "$(m kvbridge_replays_filled_total)" 3
expect_eq "replays_failed_total (500-502)" "$(m kvbridge_replays_failed_total)" 1
expect_eq "engine_restarts_total" "$(m kvbridge_engine_restarts_total)" 1
expect_eq "barriers_total{cause=\"start\"}" "$(m 'kvbridge_barriers_total{cause="start"}')" 1
expect_eq "barriers_total{cause=\"gap\"}" "$(m 'kvbridge_barriers_total{cause="gap"}')" 1
expect_eq "barriers_total{cause=\"restart\"}" "$(m 'kvbridge_barriers_total{cause="restart"}')" 1
expect_eq "barriers_total{cause=\"malformed_batch\"}" "$(m 'kvbridge_barriers_total{cause="malformed_batch"}')" 2
expect_eq "malformed_messages_total{kind=\"frames\"}" "$(m 'kvbridge_malformed_messages_total{kind="frames"}')" 1
expect_eq "malformed_messages_total{kind=\"seq_frame\"}" "$(m 'kvbridge_malformed_messages_total{kind="seq_frame"}')" 0
expect_eq "malformed_messages_total{kind=\"malformed_batch\"}" "$(m 'kvbridge_malformed_messages_total{kind="malformed_batch"}')" 2
expect_eq "malformed_messages_total{kind=\"replay_reply\"}" "$(m 'kvbridge_malformed_messages_total{kind="replay_reply"}')" 0
expect_eq "kvbridge log agrees: 4 gaps asked for replay" "$(count_log "$T/kvb.log" 'asking for replay')" 4

# NATS while connected
expect_eq "nats_connected 1" "$(m kvbridge_nats_connected)" 1
expect_eq "nats_publish_errors_total 0" "$(m kvbridge_nats_publish_errors_total)" 0
expect_eq "nats_disconnects_total 0" "$(m kvbridge_nats_disconnects_total)" 0
expect_eq "ready 1" "$(m kvbridge_ready)" 1

# per stream
S="source=\"tcp://127.0.0.1:$P\",topic=\"\""
expect_eq "source_batches_received_total = batches_received_total (one stream: applied, live or replayed)" \
  "$(m "kvbridge_source_batches_received_total{$S}")" "$(m kvbridge_batches_received_total)"
expect_eq "source_last_seq = the engine's last seq" "$(m "kvbridge_source_last_seq{$S}")" "$(want last_seq)"
expect_eq "source_seq_gaps_total = seq_gaps_total (one stream)" \
  "$(m "kvbridge_source_seq_gaps_total{$S}")" "$(m kvbridge_seq_gaps_total)"
expect_eq "source_events_received_total = events_received_total (one stream)" \
  "$(m "kvbridge_source_events_received_total{$S}")" "$sum_recv"

# histograms: cumulative buckets, +Inf = count, observations of live batches
for h in publish_delay_seconds batch_processing_seconds; do
  cnt=$(m "kvbridge_${h}_count")
  inf=$(m "kvbridge_${h}_bucket{le=\"+Inf\"}")
  expect_eq "$h: +Inf bucket = count" "$inf" "$cnt"
  expect_eq "$h: buckets cumulative" "$(awk -v p="kvbridge_${h}_bucket" 'index($1, p "{") == 1 { if ($2 < last) bad = 1; last = $2; n++ } END { print (n > 1 && !bad) ? "yes" : "no" }' "$T/run.prom")" yes
  expect_ge "$h: count >= 900 (live batches)" "$cnt" 900
  expect_le "$h: count <= batches that arrived live" "$cnt" "$(want arrived)"
done
expect_eq "publish_delay_seconds_sum is a number of seconds" \
  "$(m kvbridge_publish_delay_seconds_sum | grep -cE '^[0-9]+\.[0-9]{9}$')" 1

# every metric the Grafana board queries exists in the exposition (that it
# is JSON, and names only metrics of the list: tests/unit/check_docs.c)
G=$ROOT/conf/grafana-kvbridge.json
names=$(grep -o 'kvbridge_[a-z0-9_]*' "$G" | sort -u)
# series names, and family names (# TYPE lines: a histogram's own name)
awk '/^kvbridge_/ { sub(/[{ ].*/, "", $1); print $1 } /^# TYPE kvbridge_/ { print $3 }' "$T/run.prom" | sort -u >"$T/exposed"
missing=""
for n in $names; do grep -qxF "$n" "$T/exposed" || missing="$missing $n"; done
expect_eq "Grafana metrics missing from /metrics" "${missing:-none}" none
expect_ge "Grafana board queries metrics" "$(echo "$names" | wc -w)" 20

# ---- /readyz follows NATS -------------------------------------------------------
stop_pid "$NATS_PID" >/dev/null
if wait_status /readyz 503 10; then ok "nats-server stopped: /readyz 503"; else bad "nats-server stopped: /readyz $HTTP_STATUS, want 503"; fi
expect_eq "nats-server stopped: body" "$(cat "$T/http.body")" "not ready"
scrape down
expect_eq "nats-server stopped: nats_connected 0" "$(scraped down kvbridge_nats_connected)" 0
expect_eq "nats-server stopped: ready 0" "$(scraped down kvbridge_ready)" 0
expect_ge "nats-server stopped: nats_disconnects_total >= 1" "$(scraped down kvbridge_nats_disconnects_total)" 1
http_get "$MP" /healthz
expect_eq "nats-server stopped: /healthz still 200 (the loop turns)" "$HTTP_STATUS" 200

start_nats "$NP" || bad "nats-server did not restart on port $NP"
if wait_status /readyz 200 15; then ok "nats-server back: /readyz 200"; else bad "nats-server back: /readyz $HTTP_STATUS, want 200"; fi
scrape back
expect_eq "nats-server back: nats_connected 1" "$(scraped back kvbridge_nats_connected)" 1
expect_ge "nats-server back: nats_reconnects_total >= 1" "$(scraped back kvbridge_nats_reconnects_total)" 1
expect_eq "counters kept: batches_received_total" "$(scraped back kvbridge_batches_received_total)" "$(m kvbridge_batches_received_total)"

signal_pid "$KPID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
stop_pid "$NATS_PID" >/dev/null
finish
