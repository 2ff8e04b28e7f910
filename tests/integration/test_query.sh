#!/usr/bin/env bash
# The query API (README "Query API"): the residency mirror answers dumps,
# recent events and matches over HTTP (/v1/...) and NATS request/reply
# (query.subject), and consumers that start late or lose their subscription
# recover from it to the engine's truth (kvsim's record) without a
# "cleared":
#   http:    every path, status and shape; the dump's blocks = the gauge, its
#            last_event_id = the last event published; events since N; 410
#            past the ring; errors 400/404/405; the query metrics
#   late:    kvtail --recover started in the middle of a run (a dump, then
#            live events), and one after the run (--pair: a dump only)
#   cut:     kvtail --recover whose subscription is cut for a second: the
#            hole is filled from /events since; with a small ring (410) from
#            a dump instead
#   full:    limits.max_resident_blocks too small: overflows counted, a
#            mirror_full barrier, and a plain consumer still right
#   restart: with state.dir, kvbridge stopped in the middle of a run and
#            started again: it loads the mirror saved with its cursors (no
#            barrier) and the ring of recent events saved with it (events
#            since an id from before the restart: 200 with those events;
#            before: 410, the ring started empty), replays what it missed,
#            and a consumer started after the restart recovers to the
#            engine's truth
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# config FILE ENGINE_PORT METRICS_PORT [EXTRA YAML]
config() {
  cat >"$1" <<YAML
worker_id: 7
block_size: 16
forward_tiers: [device]
sources:
  - endpoint: tcp://127.0.0.1:$2
nats:
  servers: [nats://127.0.0.1:$NP]
metrics:
  listen: "127.0.0.1:$3"
${4:-}
YAML
}

# post PORT PATH BODY: like http_get, for a POST with a JSON body
post() {
  HTTP_STATUS=000
  (exec 3<>"/dev/tcp/127.0.0.1/$1" &&
     printf 'POST %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
       "$2" "${#3}" "$3" >&3 && timeout 5 cat <&3) >"$T/http.raw" 2>/dev/null || true
  HTTP_STATUS=$(head -n 1 "$T/http.raw" | awk '{ print $2 }')
  [ -n "$HTTP_STATUS" ] || HTTP_STATUS=000
  tr -d '\r' <"$T/http.raw" | sed '1,/^$/d' >"$T/http.body"
}

# dump_blocks FILE: block_hash count of the router event lines of FILE
dump_blocks() { grep -o '"block_hash":' "$1" | wc -l; }

# recover_clean NAME [STAT...]: kvtail --recover NAME ended right: exit 0,
# index = engine (and each STAT 0)
recover_clean() {
  expect_eq "$1: kvtail exit code" "$RC" 0
  local s n=$1; shift
  for s in wrong badtok missing bad holes query_errors "$@"; do
    expect_eq "$n: $s" "$(tail_stat "$n" "$s")" 0
  done
  expect_ge "$n: blocks indexed" "$(tail_stat "$n" indexed)" 1
}

# ---- 1. HTTP, and consumers that start late or lose their subscription ----
EP=$(daemon_port); MP=$(daemon_port)
config "$T/a.yaml" "$EP" "$MP"
start_kvbridge kvb-a "$T/a.yaml" || bad "kvbridge did not start"
KPID=$KVB_PID
wait_port "$MP" 10 || bad "metrics port"
http_get "$MP" "/v1/dump?worker_id=7&dp_rank=0"
expect_eq "dump before any event: 404" "$HTTP_STATUS" 404
expect_eq "404 body" "$(cat "$T/http.body")" \
  '{"error":"no router event for this worker_id and dp_rank yet","status":404}'

# the plain consumer (from the start) and the one cut for a second
start_kvtail cut "$NP" --quiet --recover --query kvbridge.query.7 --expect-record "$T/a.rec" \
  --timeout 3000 --cut-after 1500:1000 || bad "kvtail cut not ready"
CUT=$TAIL_PID
start "sim-a" timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$EP" --batches 4000 --rate 800 \
  --seed 11 --wait-subscribers 2000 --linger 300 --record "$T/a.rec"
SIM=$LAST_PID
# the late consumer: once a quarter of the run is published
end=$((SECONDS + 20))
until [ "$(published "$MP")" -ge 2000 ] || [ $SECONDS -ge $end ]; do sleep 0.1; done
start_kvtail late "$NP" --quiet --recover --query kvbridge.query.7 --expect-record "$T/a.rec" \
  --timeout 3000 || bad "kvtail late not ready"
LATE=$TAIL_PID
wait_pid "$SIM" 60
expect_eq "kvsim exit code" "$RC" 0
wait_pid "$LATE" 30
recover_clean late
expect_eq "late: started from one dump" "$(tail_stat late dumps)" 1
wait_pid "$CUT" 30
recover_clean cut
expect_ge "cut: the hole was filled from the events since" "$(tail_stat cut events_asked)" 2
expect_eq "cut: no dump needed (the ring held the hole)" "$(tail_stat cut gone)" 0
grep -q 'cutting the subscription' "$T/cut.err" && ok "cut: the subscription was cut" || bad "cut: no cut"

# no barrier but the start one: every "cleared" they saw was the engine's own
expect_eq "no barrier during the run (only the start one)" \
  "$(http_get "$MP" /metrics; awk '$1 ~ /^kvbridge_barriers_total/ { n += $2 } END { print n + 0 }' "$T/http.body")" 1
want=$(rec_counts "$T/a.rec" live)
expect_le "late: the \"cleared\" it saw are the engine's own" "$(tail_stat late cleared)" "$(field cleared "$want")"

# after the run: a consumer with --pair (a dump, no live event)
start_kvtail after "$NP" --quiet --recover --query kvbridge.query.7 --pair 7:0 \
  --expect-record "$T/a.rec" --timeout 500 || bad "kvtail after not ready"
wait_pid "$TAIL_PID" 30
recover_clean after
expect_eq "after: no message, one dump" "$(tail_stat after messages) $(tail_stat after dumps)" "0 1"

# the HTTP answers, against the metrics
total=$(published "$MP")
http_get "$MP" "/v1/dump?worker_id=7&dp_rank=0"
expect_eq "dump: 200" "$HTTP_STATUS" 200
cp "$T/http.body" "$T/dump.ndjson"
expect_eq "dump: last line" "$(tail -n 1 "$T/dump.ndjson")" "{\"last_event_id\":$((total - 1))}"
expect_eq "dump: blocks = kvbridge_mirror_resident_blocks" "$(dump_blocks "$T/dump.ndjson")" \
  "$(metric "$MP" 'kvbridge_mirror_resident_blocks{tier="device"}')"
expect_eq "dump: every other line a stored event of the dynamo-json shape" \
  "$(head -n -1 "$T/dump.ndjson" | grep -vc '^{"worker_id":7,"event":{"event_id":'$((total - 1))',"data":{"stored":{"parent_hash":\(null\|[0-9]*\),"blocks":\[.*\]}},"dp_rank":0}}$')" 0
expect_eq "dump = the NATS dump (kvtail --dump)" \
  "$("$BIN/kvtail" --server "nats://127.0.0.1:$NP" --query kvbridge.query.7 --dump 7:0 | sed 's/.*blocks=\([0-9]*\) .*/\1/')" \
  "$(dump_blocks "$T/dump.ndjson")"
http_get "$MP" "/v1/events?worker_id=7&dp_rank=0&since=$((total - 4))"
expect_eq "events since last-3: 200" "$HTTP_STATUS" 200
expect_eq "events since last-3: 3 events and the cursor" "$(wc -l <"$T/http.body")" 4
expect_eq "events: ids in order" "$(grep -o '"event_id":[0-9]*' "$T/http.body" | tr '\n' ' ')" \
  "\"event_id\":$((total - 3)) \"event_id\":$((total - 2)) \"event_id\":$((total - 1)) "
http_get "$MP" "/v1/events?since=1"
expect_eq "events since 1 (past the ring of 4096): 410" "$HTTP_STATUS" 410
http_get "$MP" "/v1/events?worker_id=7"
expect_eq "events without since: 400" "$HTTP_STATUS" 400
http_get "$MP" "/v1/dump?dp_rank=x"
expect_eq "bad dp_rank: 400" "$HTTP_STATUS" 400
http_get "$MP" "/v1/nothing"
expect_eq "unknown path: 404" "$HTTP_STATUS" 404
http_get "$MP" "/v1/match"
expect_eq "GET /v1/match: 405" "$HTTP_STATUS" 405
post "$MP" /v1/match '{"worker_id":7,"dp_rank":0,"token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"lora_name":null}'
expect_eq "match: 200" "$HTTP_STATUS" 200
expect_eq "match: shape" "$(cat "$T/http.body")" \
  '{"matched_blocks":{"device":0,"host_pinned":0,"disk":0,"external":0}}'
post "$MP" /v1/match '{"worker_id":7,"token_ids":[1,'
expect_eq "match, bad JSON: 400" "$HTTP_STATUS" 400
expect_eq "match (NATS, kvtail --match)" \
  "$("$BIN/kvtail" --server "nats://127.0.0.1:$NP" --query kvbridge.query.7 --match 7:0 --tokens 1,2,3)" \
  '{"matched_blocks":{"device":0,"host_pinned":0,"disk":0,"external":0}}'
expect_ge "queries_total{op=dump}" "$(metric "$MP" 'kvbridge_queries_total{op="dump"}')" 5
expect_ge "queries_total{op=events}" "$(metric "$MP" 'kvbridge_queries_total{op="events"}')" 5
expect_ge "queries_total{op=invalid}" "$(metric "$MP" 'kvbridge_queries_total{op="invalid"}')" 3
expect_ge "query_bytes_total{op=dump}" "$(metric "$MP" 'kvbridge_query_bytes_total{op="dump"}')" 1000
expect_ge "query_duration_seconds_count" "$(metric "$MP" kvbridge_query_duration_seconds_count)" 15
expect_ge "mirror_bytes" "$(metric "$MP" kvbridge_mirror_bytes)" 1000
signal_pid "$KPID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0

# ---- 2. a small ring: the hole is older than it, so a dump -----------------
EP=$(daemon_port); MP=$(daemon_port)
config "$T/b.yaml" "$EP" "$MP" "query:
  recent_events: 32"
start_kvbridge kvb-b "$T/b.yaml" || bad "kvbridge b did not start"
KPID=$KVB_PID
start_kvtail gone "$NP" --quiet --recover --query kvbridge.query.7 --expect-record "$T/b.rec" \
  --timeout 3000 --cut-after 1000:1000 || bad "kvtail gone not ready"
timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$EP" --batches 3000 --rate 800 --seed 12 \
  --wait-subscribers 2000 --linger 300 --record "$T/b.rec" 2>"$T/sim-b.log" \
  || bad_log "kvsim b failed" "$T/sim-b.log"
wait_pid "$TAIL_PID" 30
recover_clean gone
expect_ge "gone: the events were gone (410)" "$(tail_stat gone gone)" 1
expect_ge "gone: recovered from a dump" "$(tail_stat gone dumps)" 2
signal_pid "$KPID" TERM 15
expect_eq "kvbridge b exit code" "$RC" 0

# ---- 3. a mirror too small: barrier, never a silent divergence --------------
EP=$(daemon_port); MP=$(daemon_port)
config "$T/c.yaml" "$EP" "$MP" "limits:
  max_resident_blocks: 200"
start_kvbridge kvb-c "$T/c.yaml" || bad "kvbridge c did not start"
KPID=$KVB_PID
start_kvtail plain "$NP" --quiet --check --index --expect-record "$T/c.rec" --timeout 2500 \
  || bad "kvtail plain not ready"
timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$EP" --batches 1000 --rate 1000 --seed 13 \
  --wait-subscribers 2000 --linger 300 --record "$T/c.rec" 2>"$T/sim-c.log" \
  || bad_log "kvsim c failed" "$T/sim-c.log"
wait_pid "$TAIL_PID" 30
expect_eq "full: plain kvtail exit code" "$RC" 0
expect_tail_clean plain
overflows=$(metric "$MP" kvbridge_mirror_overflows_total)
expect_ge "full: mirror_overflows_total" "$overflows" 1
expect_eq "full: one mirror_full barrier per overflow" \
  "$(metric "$MP" 'kvbridge_barriers_total{cause="mirror_full"}')" "$overflows"
expect_le "full: resident blocks within the limit" \
  "$(metric "$MP" 'kvbridge_mirror_resident_blocks{tier="device"}')" 200
expect_ge "full: logged" "$(count_log "$T/kvb-c.log" 'residency mirror full')" 1
http_get "$MP" "/v1/dump?worker_id=7&dp_rank=0"
expect_eq "full: dump blocks = gauge" "$(dump_blocks "$T/http.body")" \
  "$(metric "$MP" 'kvbridge_mirror_resident_blocks{tier="device"}')"
signal_pid "$KPID" TERM 15
expect_eq "kvbridge c exit code" "$RC" 0

# ---- 4. a kvbridge restart (state.dir): the mirror comes back ---------------
EP=$(daemon_port 2); MP=$(daemon_port)
mkdir -p "$T/state"
config "$T/d.yaml" "$EP" "$MP" "state:
  dir: $T/state"
sed -i "s|^  - endpoint: .*|&\n    replay_endpoint: tcp://127.0.0.1:$((EP + 1))|" "$T/d.yaml"
start_kvbridge kvb-d1 "$T/d.yaml" || bad "kvbridge d did not start"
KPID=$KVB_PID
start "sim-d" timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$EP" --replay "tcp://127.0.0.1:$((EP + 1))" \
  --batches 5000 --rate 700 --seed 14 --wait-subscribers 2000 --linger 2000 --record "$T/d.rec"
SIM=$LAST_PID
end=$((SECONDS + 20))
until [ "$(published "$MP")" -ge 3000 ] || [ $SECONDS -ge $end ]; do sleep 0.1; done
signal_pid "$KPID" TERM 15
expect_eq "restart: first kvbridge exit code" "$RC" 0
[ -s "$T/state/kvbridge.mirror" ] && ok "restart: mirror saved" || bad "restart: no $T/state/kvbridge.mirror"
start_kvbridge kvb-d2 "$T/d.yaml" || bad "kvbridge d2 did not start"
KPID=$KVB_PID
expect_eq "restart: the mirror was loaded, nothing to clear" \
  "$(grep -c 'residency mirror: 1 pair(s) loaded ([0-9]* blocks), 0 to clear' "$T/kvb-d2.log")" 1
# the last event before the stop: the saved counter's next id - 1
last=$(awk '$1 == "counter" && $2 == 7 && $3 == 0 { print $4 - 1 }' "$T/state/kvbridge.state")
http_get "$MP" "/v1/events?worker_id=7&dp_rank=0&since=$((last - 100))"
expect_eq "restart: events since an id before the restart: 200 (the ring came back)" "$HTTP_STATUS" 200
expect_eq "restart: ... from the next id on, in order" \
  "$(grep -o '"event_id":[0-9]*' "$T/http.body" | head -n 100 | sed 's/.*://' | tr '\n' ' ')" \
  "$(seq -s ' ' $((last - 99)) "$last") "
start_kvtail restarted "$NP" --quiet --recover --query kvbridge.query.7 --pair 7:0 \
  --expect-record "$T/d.rec" --timeout 3000 || bad "kvtail restarted not ready"
wait_pid "$SIM" 60
expect_eq "restart: kvsim exit code" "$RC" 0
wait_pid "$TAIL_PID" 30
recover_clean restarted
expect_eq "restart: no barrier after the restart" \
  "$(http_get "$MP" /metrics; awk '$1 ~ /^kvbridge_barriers_total/ { n += $2 } END { print n + 0 }' "$T/http.body")" 0
signal_pid "$KPID" TERM 15
expect_eq "kvbridge d2 exit code" "$RC" 0

finish
