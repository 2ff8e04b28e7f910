#!/usr/bin/env bash
# sources[].discover: the engine binds ephemeral ports (vLLM with tcp://*:0)
# and lists them on GET /kv_event_sources (kvsim --http); kvbridge reads the
# list and follows it.
#   restart: kvbridge starts first (the list cannot be read: counted,
#     /readyz 503 with its reason); the engine (2 ranks, replay sockets)
#     publishes at once; kvbridge reads the list, connects, recovers the
#     first batches from the replay sockets.  The engine restarts: every rank
#     gets new ports (the list answers 503 meanwhile) and publishes at once;
#     kvbridge follows without a reload: one restart barrier per rank, the
#     new incarnation from seq 0 through its new replay sockets.  Nothing
#     the engine held is lost (kvtail checks every event and the final index
#     against kvsim's record).
#   envelope: the {"sources": [...]} body, fixed ports listed as tcp://*:P
#     (the host becomes the discover URL's)
#   ranks: the body keyed by rank ({"0": {...}}), ephemeral ports
#   reload: SIGHUP changing a key of the source: its ranks reopened from the
#     list kept over the reload, resumed where they were
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# config TAG HTTP_PORT METRICS_PORT: kvbridge following kvsim's list, 2 ranks
config() {
  SOURCES="  - discover: http://127.0.0.1:$2
    dp_size: 2" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/$1.yaml"
  sed -i "s/^  listen: \"\"/  listen: \"127.0.0.1:$3\"/" "$T/$1.yaml"
}
# clean TAG: kvtail found no problem; per rank, the router events are the
# record's (delivered live or from the replay socket) plus BARRIERS
clean() {
  local tag=$1 barriers=$2 s r want
  expect_eq "$tag: kvtail checks pass (exit code)" "$RC" 0
  for s in holes dups bad reorders wrong badtok missing orphans; do
    expect_eq "$tag: kvtail $s" "$(tail_stat "tail-$tag" "$s")" 0
  done
  for r in 0 1; do
    want=$(rec_counts "$T/$tag.rec" delivered "$r")
    expect_eq "$tag rank $r: router events = record + $barriers barrier(s)" \
      "$(grep -c "\"dp_rank\":$r}}\$" "$T/tail-$tag.log" || true)" \
      "$(($(field events "$want") + barriers))"
  done
}
# last_seq MPORT RANK_ENDPOINT_PORT...: kvbridge_source_last_seq of the stream
# whose source ends in :PORT
last_seq() {
  http_get "$1" /metrics
  awk -v p=":$2\"" '$1 ~ /^kvbridge_source_last_seq\{/ && index($1, p) { print $2; f = 1 }
    END { if (!f) print -1 }' "$T/http.body"
}
# listed_ports HTTP_PORT: the ports of the endpoints kvsim lists, rank order
listed_ports() {
  http_get "$1" /kv_event_sources
  grep -o '"endpoint":"tcp://[^"]*"' "$T/http.body" | sed 's/.*://; s/"//' | tr '\n' ' '
}

# ---- restart -----------------------------------------------------------------
HP=$(daemon_port)
MP=$(daemon_port)
config restart "$HP" "$MP"
start_kvbridge kvb-restart "$T/restart.yaml" || bad "restart: kvbridge did not start"
KPID=$KVB_PID
wait_port "$MP" 10 || bad "restart: no metrics listener"
end=$((SECONDS + 10))
until [ "$(metric "$MP" 'kvbridge_source_list_failures_total{reason="unreachable"}')" -ge 1 ] ||
  [ $SECONDS -ge $end ]; do sleep 0.1; done
expect_ge "restart: the list could not be read yet (counted)" \
  "$(metric "$MP" 'kvbridge_source_list_failures_total{reason="unreachable"}')" 1
http_get "$MP" /readyz
expect_eq "restart: /readyz 503 before the list was read" "$HTTP_STATUS" 503
expect_eq "restart: /readyz says why" \
  "$(grep -c 'list of event sources of 1 engine(s) (sources\[\].discover) has not been read' "$T/http.body" || true)" 1
start_kvtail tail-restart "$NP" --check --index --expect-record "$T/restart.rec" --timeout 4000 ||
  bad "restart: kvtail not ready"
TPID=$TAIL_PID
# 300 batches per rank, idle until told, then 300 more, a restart on new
# ports, 2000 of the new incarnation (2 s: kvbridge's reads of the list
# back off up to 5 s, and what comes before its connection is replayed)
start sim-restart "$BIN/kvsim" --endpoint 'tcp://*:0' --replay 'tcp://*:0' --dp-size 2 \
  --http "127.0.0.1:$HP" --batches 2600 --rate 1000 --seed 31 --wait-subscribers 0 \
  --mark-after 300 --mark-file "$T/mark" --hold-file "$T/go" --restart-at 599 \
  --restart-close 200 --linger 1500 --record "$T/restart.rec"
SPID=$LAST_PID
wait_file "$T/mark" 20 || bad "restart: kvsim did not publish its first 300 batches"
first=$(listed_ports "$HP")
read -r p0 p1 <<<"$first"
end=$((SECONDS + 20))
until [ "$(last_seq "$MP" "$p0")" = 299 ] && [ "$(last_seq "$MP" "$p1")" = 299 ] ||
  [ $SECONDS -ge $end ]; do sleep 0.1; done
expect_eq "restart: both ranks applied up to seq 299 (ports $first)" \
  "$(last_seq "$MP" "$p0") $(last_seq "$MP" "$p1")" "299 299"
expect_eq "restart: the first batches came from the replay sockets" \
  "$(count_log "$T/kvb-restart.log" 'stream starts at a later seq: asking the engine for seq 0\.\.')" 2
http_get "$MP" /readyz
expect_eq "restart: /readyz 200 once the list was read" "$HTTP_STATUS" 200
touch "$T/go"
wait_pid "$SPID" 30
expect_eq "restart: kvsim exit code" "$RC" 0
wait_pid "$TPID" 30
clean restart 2
want=$(rec_counts "$T/restart.rec" delivered 0)
expect_eq "restart: the record has the engine restart" "$(field restarts "$want")" 1
expect_eq "restart: both ranks moved (kvbridge log)" \
  "$(count_log "$T/kvb-restart.log" "moved from tcp://127.0.0.1:\($p0\|$p1\) to tcp://127.0.0.1:")" 2
expect_eq "restart: one restart barrier per rank" \
  "$(metric "$MP" 'kvbridge_barriers_total{cause="restart"}')" 2
expect_eq "restart: counted as endpoint changes" \
  "$(metric "$MP" kvbridge_source_endpoint_changes_total)" 2
expect_eq "restart: no gap barrier" "$(metric "$MP" 'kvbridge_barriers_total{cause="gap"}')" 0
expect_eq "restart: the new incarnation's start came from its replay sockets" \
  "$(count_log "$T/kvb-restart.log" 'stream starts at a later seq: asking the engine for seq 0\.\.')" 4
expect_ge "restart: the 503 while a rank restarted was counted" \
  "$(metric "$MP" 'kvbridge_source_list_failures_total{reason="status"}')" 1
expect_eq "restart: no reload" "$(count_log "$T/kvb-restart.log" 'reload')" 0
signal_pid "$KPID" TERM 15
expect_eq "restart: kvbridge exit code" "$RC" 0

# ---- shapes ------------------------------------------------------------------
# shape TAG SHAPE ENDPOINT REPLAY: kvsim first (listing at once), then kvbridge
shape() {
  local tag=$1 shape=$2 hp mp
  hp=$(daemon_port)
  mp=$(daemon_port)
  config "$tag" "$hp" "$mp"
  start_kvtail "tail-$tag" "$NP" --check --index --expect-record "$T/$tag.rec" --timeout 2500 ||
    bad "$tag: kvtail not ready"
  TPID=$TAIL_PID
  start "sim-$tag" "$BIN/kvsim" --endpoint "$3" --replay "$4" --dp-size 2 --http "127.0.0.1:$hp" \
    --sources-shape "$shape" --batches 400 --rate 1000 --seed 33 --wait-subscribers 0 \
    --linger 1000 --record "$T/$tag.rec"
  SPID=$LAST_PID
  wait_port "$hp" 10 || bad "$tag: kvsim's HTTP face did not start"
  start_kvbridge "kvb-$tag" "$T/$tag.yaml" || bad "$tag: kvbridge did not start"
  KPID=$KVB_PID
  wait_pid "$SPID" 30
  wait_pid "$TPID" 30
  clean "$tag" 1
  expect_eq "$tag: the list read" "$(metric "$mp" kvbridge_source_list_reads_total)" 1
  signal_pid "$KPID" TERM 15
  expect_eq "$tag: kvbridge exit code" "$RC" 0
}
P=$(daemon_port 4)
shape envelope envelope "tcp://*:$P" "tcp://*:$((P + 2))"
for r in 0 1; do
  expect_eq "envelope rank $r: tcp://*:$((P + r)) read as the URL's host" \
    "$(count_log "$T/kvb-envelope.log" "connecting to tcp://127.0.0.1:$((P + r)) (dp_rank $r, replay tcp://127.0.0.1:$((P + 2 + r)))")" 1
done
shape ranks ranks 'tcp://*:0' 'tcp://*:0'

# ---- reload ------------------------------------------------------------------
# SIGHUP with a changed source key: the ranks are reopened from the list kept
# over the reload, their streams resumed where they were (no barrier beyond
# the start one, nothing missing)
HP=$(daemon_port)
MP=$(daemon_port)
config reload "$HP" "$MP"
start_kvtail tail-reload "$NP" --check --index --expect-record "$T/reload.rec" --timeout 2500 ||
  bad "reload: kvtail not ready"
TPID=$TAIL_PID
start sim-reload "$BIN/kvsim" --endpoint 'tcp://*:0' --replay 'tcp://*:0' --dp-size 2 \
  --http "127.0.0.1:$HP" --batches 1000 --rate 1000 --seed 35 --wait-subscribers 0 \
  --mark-after 300 --mark-file "$T/mark-reload" --hold-file "$T/go-reload" --linger 1000 \
  --record "$T/reload.rec"
SPID=$LAST_PID
wait_port "$HP" 10 || bad "reload: kvsim's HTTP face did not start"
start_kvbridge kvb-reload "$T/reload.yaml" || bad "reload: kvbridge did not start"
KPID=$KVB_PID
wait_file "$T/mark-reload" 20 || bad "reload: kvsim did not publish its first 300 batches"
read -r p0 p1 <<<"$(listed_ports "$HP")"
end=$((SECONDS + 20))
until [ "$(last_seq "$MP" "$p0")" = 299 ] && [ "$(last_seq "$MP" "$p1")" = 299 ] ||
  [ $SECONDS -ge $end ]; do sleep 0.1; done
sed -i 's/^    dp_size: 2$/    dp_size: 2\n    rcvhwm: 5000/' "$T/reload.yaml"
kill -HUP "$KPID"
wait_log "$T/kvb-reload.log" "reloaded .* (sources reopened)" 10 ||
  bad_log "reload: not reloaded" "$T/kvb-reload.log"
http_get "$MP" /readyz
expect_eq "reload: /readyz 200 after the reload (the list kept)" "$HTTP_STATUS" 200
touch "$T/go-reload"
wait_pid "$SPID" 30
wait_pid "$TPID" 30
clean reload 1
expect_eq "reload: both ranks resumed" "$(count_log "$T/kvb-reload.log" 'resuming after seq 299')" 2
signal_pid "$KPID" TERM 15
expect_eq "reload: kvbridge exit code" "$RC" 0

stop_pid "$NATS_PID" >/dev/null
finish
