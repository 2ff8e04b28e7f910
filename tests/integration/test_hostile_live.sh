#!/usr/bin/env bash
# Hostile live peers of a bind-mode source (hostile_engine.c).
#   a. topics: 100 topics at once fill the stream table (64 per source; the
#      36 others are dropped and counted), then, after 3 s of silence, a new
#      topic comes: the least recently used idle stream is expired (counted
#      in kvbridge_streams_expired_total) and the new one flows.
#      (A table that stays full for good would drop the new topic.)
#   b. dp_rank churn: 2000 batches, each with a new dp_rank.  The first 64
#      ranks start (one start barrier each); each later batch is dropped and
#      counted as malformed, without a barrier on the 64 ranks it does not
#      belong to (a barrier per rank and batch would be 123,968 in all).
#   c. partial frames: 12 raw ZMTP peers each announce a 4 MiB frame (the
#      limit) and send 3 MiB of it, then stall.  With sources[].max_peers 4
#      the 8 others are closed as they come (kvbridge_peers_refused_total),
#      and the memory held stays under max_peers x max_payload_bytes.
#      (Keeping every peer's partial frame would hold 12 x 3 MiB here, and
#      4.8 GB for 20 peers of 240 MiB frames.)
#   d. reconnecting peers: 40 PUB sockets connect at once with
#      sources[].max_peers 4, and libzmq connects each refused one again
#      10 ms later, for 6 s: hundreds of connections closed over max_peers.
#      Each drop is still counted (kvbridge_peers_refused_total), but
#      "engine connection dropped" is rate-limited like the refusal warning
#      beside it: at most 5 lines per 10 s, plus a count of those
#      suppressed (one line per drop would be thousands of lines a second,
#      as attack_live.py bind_many shows).
source "$(dirname "$0")/lib.sh"

# shellcheck disable=SC2046
gcc -O1 -o "$T/hostile_engine" "$ROOT/tests/integration/hostile_engine.c" \
  $(pkg-config --cflags --libs libzmq msgpack-c 2>/dev/null || pkg-config --cflags --libs libzmq msgpack) \
  2>"$T/gcc.log" && ok "hostile_engine built" || { bad_log "hostile_engine did not build" "$T/gcc.log"; finish; exit 1; }

np=$(daemon_port)
start_nats "$np" || { bad "nats-server did not start"; finish; exit 1; }

conf() { # conf FILE ENGINE_PORT METRICS_PORT [EXTRA SOURCE KEYS]
  cat >"$1" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$2
    mode: bind
${4:-}
nats:
  servers: [nats://127.0.0.1:$np]
$(kvb_format_yaml)
metrics:
  listen: 127.0.0.1:$3
YAML
}
# sum_metric MPORT FAMILY: the sum of every series of FAMILY
sum_metric() {
  http_get "$1" /metrics
  awk -v f="$2" '$1 == f || index($1, f "{") == 1 { n += $2 } END { print n + 0 }' "$T/http.body"
}

# ---- a. a full stream table expires its idle streams ----
ep=$(daemon_port); mp=$(daemon_port)
conf "$T/a.yaml" "$ep" "$mp"
if start_kvbridge kvb-a "$T/a.yaml"; then
  kpid=$KVB_PID
  start eng-a "$T/hostile_engine" topics --pub "tcp://127.0.0.1:$ep" --topics 100 --rounds 1 \
    --rate 0 --pause-ms 3000 --tail 50 --tail-topic late
  wait_log "$T/eng-a.log" "sent live=" 20 && ok "a: the engine sent its batches" || bad "a: engine not done"
  end=$((SECONDS + 10))
  until [ "$(sum_metric "$mp" kvbridge_batches_received_total)" -ge 114 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
  expect_eq "a: batches applied (64 topics, then 50 of the late one)" \
    "$(sum_metric "$mp" kvbridge_batches_received_total)" 114
  expect_eq "a: topics beyond the table dropped while all were busy" \
    "$(metric "$mp" 'kvbridge_malformed_messages_total{kind="frames"}')" 36
  expect_ge "a: idle streams expired" "$(metric "$mp" kvbridge_streams_expired_total)" 1
  http_get "$mp" /metrics
  expect_eq "a: the late topic's last seq" \
    "$(awk '$1 ~ /^kvbridge_source_last_seq\{/ && $1 ~ /topic="late"/ { print $2 }' "$T/http.body")" 49
  expect_ge "a: the expiry is logged" "$(count_log "$T/kvb-a.log" 'streams (topics): expired')" 1
  signal_pid "$kpid" TERM 15
  expect_eq "a: exit status 0 after SIGTERM" "$RC" 0
else
  bad "a: kvbridge did not start"
fi

# ---- b. dp_rank churn ----
ep=$(daemon_port); mp=$(daemon_port)
conf "$T/b.yaml" "$ep" "$mp"
if start_kvbridge kvb-b "$T/b.yaml"; then
  kpid=$KVB_PID
  start eng-b "$T/hostile_engine" ranks --pub "tcp://127.0.0.1:$ep" --count 2000 --rate 0
  wait_log "$T/eng-b.log" "sent live=" 20 && ok "b: the engine sent its batches" || bad "b: engine not done"
  end=$((SECONDS + 10))
  until [ "$(metric "$mp" 'kvbridge_malformed_messages_total{kind="malformed_batch"}')" -ge 1936 ] ||
    [ $SECONDS -ge $end ]; do sleep 0.2; done
  expect_eq "b: batches of a 65th and later rank dropped as malformed" \
    "$(metric "$mp" 'kvbridge_malformed_messages_total{kind="malformed_batch"}')" 1936
  expect_eq "b: batches applied (ranks 0..63)" "$(sum_metric "$mp" kvbridge_batches_received_total)" 64
  expect_eq "b: barriers: the 64 start barriers only" "$(sum_metric "$mp" kvbridge_barriers_total)" 64
  signal_pid "$kpid" TERM 15
  expect_eq "b: exit status 0 after SIGTERM" "$RC" 0
else
  bad "b: kvbridge did not start"
fi

# ---- c. peers that stall in the middle of a frame ----
ep=$(daemon_port); mp=$(daemon_port)
conf "$T/c.yaml" "$ep" "$mp" "    max_peers: 4
limits:
  max_payload_bytes: 4194304"
rss_kb() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
if start_kvbridge kvb-c "$T/c.yaml"; then
  kpid=$KVB_PID
  rss0=$(rss_kb "$kpid")
  start eng-c "$T/hostile_engine" partial --pub "tcp://127.0.0.1:$ep" --peers 12 --decl-mb 4 \
    --send-mb 3 --seconds 20
  wait_log "$T/eng-c.log" "peers=" 30 && ok "c: the peers are connected and stalled" || bad "c: peers not done"
  end=$((SECONDS + 5))
  until [ "$(metric "$mp" kvbridge_peers_refused_total)" -ge 8 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
  expect_ge "c: peers beyond max_peers refused" "$(metric "$mp" kvbridge_peers_refused_total)" 8
  sleep 0.5 # let libzmq read what the taken peers sent (bounded by the check below anyway)
  grow=$(($(rss_kb "$kpid") - rss0))
  expect_le "c: RSS growth in KiB under max_peers x max_payload_bytes + 8 MiB" "$grow" $((4 * 4096 + 8192))
  http_get "$mp" /healthz
  expect_eq "c: /healthz" "$HTTP_STATUS" 200
  signal_pid "$kpid" TERM 15
  expect_eq "c: exit status 0 after SIGTERM" "$RC" 0
else
  bad "c: kvbridge did not start"
fi

# ---- d. peers closed over max_peers that reconnect at once ----
ep=$(daemon_port); mp=$(daemon_port)
conf "$T/d.yaml" "$ep" "$mp" "    max_peers: 4"
if start_kvbridge kvb-d "$T/d.yaml"; then
  kpid=$KVB_PID
  start eng-d "$T/hostile_engine" many --pub "tcp://127.0.0.1:$ep" --peers 40 --seconds 6
  epid=$LAST_PID
  wait_log "$T/eng-d.log" "peers=40" 10 && ok "d: 40 peers connecting" || bad "d: peers not started"
  end=$((SECONDS + 10))
  until [ "$(metric "$mp" kvbridge_peers_refused_total)" -ge 200 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
  refused=$(metric "$mp" kvbridge_peers_refused_total)
  expect_ge "d: connections closed over max_peers (they reconnect)" "$refused" 200
  wait_pid "$epid" 15
  drops=$(count_log "$T/kvb-d.log" "engine connection dropped")
  echo "     d: $refused refused, $drops \"engine connection dropped\" lines, $(count_log "$T/kvb-d.log" "similar messages suppressed") \"suppressed\" lines"
  expect_le "d: \"engine connection dropped\" lines (5 per 10 s)" "$drops" 10
  http_get "$mp" /healthz
  expect_eq "d: /healthz" "$HTTP_STATUS" 200
  signal_pid "$kpid" TERM 15
  expect_eq "d: exit status 0 after SIGTERM" "$RC" 0
else
  bad "d: kvbridge did not start"
fi

finish
