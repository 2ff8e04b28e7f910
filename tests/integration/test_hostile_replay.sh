#!/usr/bin/env bash
# A hostile replay ROUTER (hostile_engine.c).
#   a. flood: the live stream jumps from seq 9 to 10^9 and the ROUTER answers
#      the request with fat in-range batches (2000 events each) flat out for
#      5 s, never END.  kvbridge's peak RSS stays under the ceiling of
#      kvbridge(8) MEMORY for this configuration, /healthz answers all along,
#      the replay ends in a gap barrier within replay.timeout_ms, and the
#      live batches after the gap are published.
#      (A turn that read 256 replies would put 512,000 router events into
#      nats.c's buffer at once and double the peak RSS.)
#   b. the same flood under a long replay.timeout_ms: SIGTERM in the middle
#      ends kvbridge within nats.flush_timeout_ms (+1 s), exit 0.
#   c. trickle: the ROUTER answers one in-range batch every 200 ms, never END.
#      While the replay holds the live stream back, kvbridge_live_held_batches
#      shows it and /readyz answers 503 saying so; replay.timeout_ms (4 s)
#      bounds the whole replay: then the gap barrier, the held batches are
#      applied and /readyz is 200 again.
#   d. an endless flood (60 s of in-range batches flat out, never END) under
#      replay.timeout_ms 2000: the flood never waits, so only replay.max_ms
#      (5 s of wall time) ends it: /readyz 503 while it holds the live
#      stream, then the gap barrier, the live batches after the gap, /readyz
#      200 (replay.timeout_ms alone would hold the live stream for the whole
#      flood: the flood never waits).
#   e. a gap above replay.max_batches (the default, 10000): no request, the
#      barrier at once, the live stream goes on.
# a to d set replay.max_batches above their gap (10^9 seqs), to be replayed.
source "$(dirname "$0")/lib.sh"

# shellcheck disable=SC2046
gcc -O1 -o "$T/hostile_engine" "$ROOT/tests/integration/hostile_engine.c" \
  $(pkg-config --cflags --libs libzmq msgpack-c 2>/dev/null || pkg-config --cflags --libs libzmq msgpack) \
  2>"$T/gcc.log" && ok "hostile_engine built" || { bad_log "hostile_engine did not build" "$T/gcc.log"; finish; exit 1; }

np=$(daemon_port)
start_nats "$np" || { bad "nats-server did not start"; finish; exit 1; }

GAP_TO=1000000000
conf() { # conf FILE ENGINE_PORT REPLAY_PORT METRICS_PORT REPLAY_TIMEOUT_MS [MAX_MS [MAX_BATCHES]]
  cat >"$1" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$2
    replay_endpoint: tcp://127.0.0.1:$3
    rcvhwm: 1000
nats:
  servers: [nats://127.0.0.1:$np]
  flush_timeout_ms: 1000
$(kvb_format_yaml)
replay:
  timeout_ms: $5
  max_ms: ${6:-30000}
  max_batches: ${7:-2000000000}
metrics:
  listen: 127.0.0.1:$4
YAML
}
vmhwm_kb() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
last_seq() { # last_seq MPORT: the stream's kvbridge_source_last_seq
  http_get "$1" /metrics
  awk '$1 ~ /^kvbridge_source_last_seq\{/ { print $2 }' "$T/http.body" | head -n 1
}

# ---- a. flood, replay.timeout_ms 2000 ----
ep=$(daemon_port); rp=$(daemon_port); mp=$(daemon_port)
conf "$T/a.yaml" "$ep" "$rp" "$mp" 2000
start eng-a "$T/hostile_engine" flood --pub "tcp://127.0.0.1:$ep" --router "tcp://127.0.0.1:$rp" \
  --rate 50 --gap-to $GAP_TO --flood-ms 5000 --fat 2000 --seconds 40
wait_log "$T/eng-a.log" listening 5 || bad "a: hostile_engine did not start"
if start_kvbridge kvb-a "$T/a.yaml"; then
  kpid=$KVB_PID
  wait_log "$T/eng-a.log" "request from" 15 && ok "a: the replay was asked for" || bad "a: no replay request"
  notok=0
  for _ in $(seq 12); do # 6 s: the flood and a little after
    http_get "$mp" /healthz
    [ "$HTTP_STATUS" = 200 ] || notok=$((notok + 1))
    sleep 0.5
  done
  expect_eq "a: /healthz not 200 during the flood (of 12 tries)" "$notok" 0
  want=$((GAP_TO + 400))
  end=$((SECONDS + 30))
  until [ "$(last_seq "$mp")" -ge "$want" ] 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 0.3; done
  expect_ge "a: live batches after the gap applied (last seq)" "$(last_seq "$mp")" "$want"
  expect_ge "a: the unrecovered gap got its barrier" \
    "$(metric "$mp" 'kvbridge_barriers_total{cause="gap"}')" 1
  expect_ge "a: the replay counted as failed" "$(metric "$mp" kvbridge_replays_failed_total)" 1
  # kvbridge(8) MEMORY for this configuration: 20 MiB + (rcvhwm 1000 + H 10000) x
  # (100 B + 2 KiB) + R 1000 x (93 KiB + 2 KiB) + 2 x 16 MiB (nats.c's buffer)
  ceiling=$(((20 << 10) + 11000 * 2148 / 1024 + 1000 * 95 + 2 * (16 << 10)))
  expect_le "a: peak RSS in KiB (VmHWM) under the MEMORY ceiling" "$(vmhwm_kb "$kpid")" "$ceiling"
  signal_pid "$kpid" TERM 15
  expect_eq "a: exit status 0 after SIGTERM" "$RC" 0
else
  bad "a: kvbridge did not start"
fi

# ---- b. SIGTERM in the middle of a flood (replay.timeout_ms 60000) ----
ep=$(daemon_port); rp=$(daemon_port); mp=$(daemon_port)
conf "$T/b.yaml" "$ep" "$rp" "$mp" 60000
start eng-b "$T/hostile_engine" flood --pub "tcp://127.0.0.1:$ep" --router "tcp://127.0.0.1:$rp" \
  --rate 50 --gap-to $GAP_TO --flood-ms 20000 --fat 2000 --seconds 40
wait_log "$T/eng-b.log" listening 5 || bad "b: hostile_engine did not start"
if start_kvbridge kvb-b "$T/b.yaml"; then
  kpid=$KVB_PID
  wait_log "$T/eng-b.log" "request from" 15 && ok "b: the replay was asked for" || bad "b: no replay request"
  end=$((SECONDS + 10))
  until [ "$(metric "$mp" kvbridge_batches_received_total)" -ge 200 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
  expect_ge "b: flooded (batches applied)" "$(metric "$mp" kvbridge_batches_received_total)" 200
  t0=$(date +%s%N)
  signal_pid "$kpid" TERM 15
  ms=$((($(date +%s%N) - t0) / 1000000))
  expect_eq "b: exit status 0 after SIGTERM" "$RC" 0
  expect_le "b: stopped within flush_timeout_ms + 1 s of SIGTERM (ms)" "$ms" 2000
else
  bad "b: kvbridge did not start"
fi

# ---- c. trickle, replay.timeout_ms 4000 ----
ep=$(daemon_port); rp=$(daemon_port); mp=$(daemon_port)
conf "$T/c.yaml" "$ep" "$rp" "$mp" 4000
if start_kvbridge kvb-c "$T/c.yaml"; then
  kpid=$KVB_PID
  end=$((SECONDS + 10)) # ready before the engine starts
  until http_get "$mp" /readyz && [ "$HTTP_STATUS" = 200 ]; do [ $SECONDS -ge $end ] && break; sleep 0.1; done
  expect_eq "c: /readyz before the replay" "$HTTP_STATUS" 200
  start eng-c "$T/hostile_engine" trickle --pub "tcp://127.0.0.1:$ep" --router "tcp://127.0.0.1:$rp" \
    --rate 50 --gap-to 1000000 --seconds 30
  wait_log "$T/eng-c.log" "request from" 15 && ok "c: the replay was asked for" || bad "c: no replay request"
  t_req=$SECONDS
  end=$((SECONDS + 4))
  until http_get "$mp" /readyz && [ "$HTTP_STATUS" = 503 ]; do [ $SECONDS -ge $end ] && break; sleep 0.1; done
  expect_eq "c: /readyz while live batches are held back" "$HTTP_STATUS" 503
  check "c: /readyz says why ($(head -n 1 "$T/http.body"))" grep -q "held back behind a replay" "$T/http.body"
  expect_ge "c: kvbridge_live_held_batches" "$(metric "$mp" kvbridge_live_held_batches)" 20
  end=$((SECONDS + 10))
  until [ "$(metric "$mp" kvbridge_replays_failed_total)" -ge 1 ] || [ $SECONDS -ge $end ]; do sleep 0.1; done
  expect_le "c: the whole replay ended within replay.timeout_ms (+2 s, seconds)" $((SECONDS - t_req)) 6
  expect_ge "c: the gap barrier" "$(metric "$mp" 'kvbridge_barriers_total{cause="gap"}')" 1
  end=$((SECONDS + 5))
  until http_get "$mp" /readyz && [ "$HTTP_STATUS" = 200 ]; do [ $SECONDS -ge $end ] && break; sleep 0.1; done
  expect_eq "c: /readyz once the held batches are applied" "$HTTP_STATUS" 200
  expect_eq "c: kvbridge_live_held_batches afterwards" "$(metric "$mp" kvbridge_live_held_batches)" 0
  expect_ge "c: live batches after the gap applied (last seq)" "$(last_seq "$mp")" 1000100
  signal_pid "$kpid" TERM 15
  expect_eq "c: exit status 0 after SIGTERM" "$RC" 0
else
  bad "c: kvbridge did not start"
fi

# ---- d. an endless flood: replay.max_ms 5000 ends it ----
ep=$(daemon_port); rp=$(daemon_port); mp=$(daemon_port)
conf "$T/d.yaml" "$ep" "$rp" "$mp" 2000 5000
start eng-d "$T/hostile_engine" flood --pub "tcp://127.0.0.1:$ep" --router "tcp://127.0.0.1:$rp" \
  --rate 50 --gap-to $GAP_TO --flood-ms 60000 --fat 2000 --seconds 60
epid=$LAST_PID
wait_log "$T/eng-d.log" listening 5 || bad "d: hostile_engine did not start"
if start_kvbridge kvb-d "$T/d.yaml"; then
  kpid=$KVB_PID
  wait_log "$T/eng-d.log" "request from" 15 && ok "d: the replay was asked for" || bad "d: no replay request"
  t_req=$SECONDS
  end=$((SECONDS + 4))
  until http_get "$mp" /readyz && [ "$HTTP_STATUS" = 503 ]; do [ $SECONDS -ge $end ] && break; sleep 0.1; done
  expect_eq "d: /readyz while the flood holds the live stream" "$HTTP_STATUS" 503
  check "d: /readyz says why ($(head -n 1 "$T/http.body"))" grep -q "held back behind a replay" "$T/http.body"
  end=$((SECONDS + 15))
  until [ "$(metric "$mp" kvbridge_replays_failed_total)" -ge 1 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
  expect_le "d: the replay ended within replay.max_ms (+3 s, seconds)" $((SECONDS - t_req)) 8
  expect_ge "d: the gap barrier" "$(metric "$mp" 'kvbridge_barriers_total{cause="gap"}')" 1
  want=$((GAP_TO + 100))
  end=$((SECONDS + 10))
  until [ "$(last_seq "$mp")" -ge "$want" ] 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 0.3; done
  expect_ge "d: live batches after the gap applied, the flood still on (last seq)" "$(last_seq "$mp")" "$want"
  end=$((SECONDS + 5))
  until http_get "$mp" /readyz && [ "$HTTP_STATUS" = 200 ]; do [ $SECONDS -ge $end ] && break; sleep 0.1; done
  expect_eq "d: /readyz once the live stream goes on" "$HTTP_STATUS" 200
  check "d: kvbridge log: replay.max_ms named" grep -q "replay.max_ms reached" "$T/kvb-d.log"
  signal_pid "$kpid" TERM 15
  expect_eq "d: exit status 0 after SIGTERM" "$RC" 0
  stop_pid "$epid" >/dev/null 2>&1
else
  bad "d: kvbridge did not start"
fi

# ---- e. a gap above replay.max_batches: a barrier, no request ----
ep=$(daemon_port); rp=$(daemon_port); mp=$(daemon_port)
conf "$T/e.yaml" "$ep" "$rp" "$mp" 4000 30000 10000
if start_kvbridge kvb-e "$T/e.yaml"; then
  kpid=$KVB_PID
  start eng-e "$T/hostile_engine" trickle --pub "tcp://127.0.0.1:$ep" --router "tcp://127.0.0.1:$rp" \
    --rate 10 --gap-to 100000 --seconds 30
  # (10 batches/s: kvbridge's SUB is connected before the gap at seq 10)
  end=$((SECONDS + 15))
  until [ "$(last_seq "$mp")" -ge 100020 ] 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 0.2; done
  expect_ge "e: live batches after the gap applied (last seq)" "$(last_seq "$mp")" 100020
  expect_ge "e: the gap barrier" "$(metric "$mp" 'kvbridge_barriers_total{cause="gap"}')" 1
  # (a request from 0 is the stream's start, when the first batches went to
  # nobody; the gap's would be from 10)
  expect_eq "e: no replay request for the gap" "$(grep -c 'request from 10$' "$T/eng-e.log")" 0
  check "e: kvbridge log: more than replay.max_batches" \
    grep -q "99990 missing before 100000 (more than replay.max_batches), publishing barrier" "$T/kvb-e.log"
  signal_pid "$kpid" TERM 15
  expect_eq "e: exit status 0 after SIGTERM" "$RC" 0
else
  bad "e: kvbridge did not start"
fi

finish
