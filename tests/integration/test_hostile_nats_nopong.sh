#!/usr/bin/env bash
# A NATS server that takes the connection, sends INFO and never answers the
# client's PING (fake_nats.c).  nats.c before 3.8 (Debian's 3.4.1) spins in
# its handshake once the attempt's timeout has passed (nats.c issue #706):
# without kvbridge's guard, kvbridge never starts, burns a core, ignores
# SIGTERM, and at a reconnect its loop freezes behind nats.c's lock.
#   a. connect_timeout_ms 3000: kvbridge gives up with exit status 69, in time
#   b. connect_timeout_ms 0: kvbridge starts (running:), serves /healthz,
#      abandons and counts the stalled attempts, stops on SIGTERM with 0
#   c. the first connection is served (PONG, PUBs) and hung up after 2 s;
#      every reconnection is mute: kvbridge keeps serving /healthz, counts
#      the stalls and stops on SIGTERM with 75 (EX_TEMPFAIL: the router events
#      of kvsim's batches after the hang-up are never delivered)
# A stop waits up to flush_timeout_ms (1 s here) for NATS (the default, 5 s,
# is kvbridge's drain), then for the handshake in progress to be cut (about
# 0.1 s once destroy started), hence "within 8 s".
source "$(dirname "$0")/lib.sh"

gcc -O1 -o "$T/fake_nats" "$ROOT/tests/integration/fake_nats.c" 2>"$T/gcc.log" \
  && ok "fake_nats built" || { bad "fake_nats did not build"; cat "$T/gcc.log"; finish; exit 1; }

# cpu_ticks PID: user+system clock ticks so far
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

conf() { # conf FILE NATS_PORT ENGINE_PORT METRICS_PORT CONNECT_TIMEOUT_MS
  cat >"$1" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$3
nats:
  servers: [nats://127.0.0.1:$2]
  connect_timeout_ms: $5
  reconnect_wait_ms: 200
  reconnect_wait_max_ms: 400
  flush_timeout_ms: 1000
metrics:
  listen: 127.0.0.1:$4
YAML
}

# ---- a. connect_timeout_ms 3000: exit 69 ----
fp=$(daemon_port); ep=$(daemon_port); mp=$(daemon_port)
start fake-a "$T/fake_nats" "$fp" 0
wait_log "$T/fake-a.log" listening 5 || bad "a: fake_nats did not listen"
conf "$T/a.yaml" "$fp" "$ep" "$mp" 3000
s0=$SECONDS
start kvb-a "$BIN/kvbridge" -c "$T/a.yaml"
kpid=$LAST_PID
wait_pid "$kpid" 20
expect_eq "a: exit status 69 (NATS unavailable)" "$RC" 69
expect_le "a: gave up within 10 s (connect_timeout_ms 3000)" $((SECONDS - s0)) 10
expect_ge "a: the stalled handshake is logged" \
  "$(count_log "$T/kvb-a.log" 'did not complete the handshake')" 1

# ---- b. connect_timeout_ms 0: starts, serves, stops ----
fp=$(daemon_port); ep=$(daemon_port); mp=$(daemon_port)
start fake-b "$T/fake_nats" "$fp" 0
wait_log "$T/fake-b.log" listening 5 || bad "b: fake_nats did not listen"
conf "$T/b.yaml" "$fp" "$ep" "$mp" 0
if start_kvbridge kvb-b "$T/b.yaml"; then
  ok "b: kvbridge starts with a mute NATS server"
  kpid=$KVB_PID
  wait_log "$T/kvb-b.log" 'did not complete the handshake' 10 \
    && ok "b: stalled handshakes are abandoned" || bad "b: no stalled handshake abandoned"
  end=$((SECONDS + 10))
  until [ "$(metric "$mp" kvbridge_nats_connect_stalls_total)" -ge 2 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
  expect_ge "b: kvbridge_nats_connect_stalls_total" "$(metric "$mp" kvbridge_nats_connect_stalls_total)" 2
  http_get "$mp" /healthz
  expect_eq "b: /healthz answers" "$HTTP_STATUS" 200
  t0=$(cpu_ticks "$kpid"); sleep 3; t1=$(cpu_ticks "$kpid")
  expect_lt "b: CPU over 3 s (clock ticks; a spinning thread: ~300)" $((t1 - t0)) 150
  s0=$SECONDS
  signal_pid "$kpid" TERM 15
  expect_eq "b: exit status 0 after SIGTERM" "$RC" 0
  expect_le "b: stopped within 8 s of SIGTERM" $((SECONDS - s0)) 8
else
  bad "b: kvbridge did not start with a mute NATS server"
fi

# ---- c. served, hung up, then mute at every reconnection ----
fp=$(daemon_port); ep=$(daemon_port); mp=$(daemon_port)
start fake-c "$T/fake_nats" "$fp" 1 2000
wait_log "$T/fake-c.log" listening 5 || bad "c: fake_nats did not listen"
conf "$T/c.yaml" "$fp" "$ep" "$mp" 3000
if start_kvbridge kvb-c "$T/c.yaml"; then
  kpid=$KVB_PID
  start sim-c timeout 40 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$ep" --rate 200 --seed 7
  wait_log "$T/fake-c.log" 'close 1' 10 && ok "c: the server hung up" || bad "c: the server never hung up"
  wait_log "$T/kvb-c.log" 'did not complete the handshake' 10 \
    && ok "c: stalled reconnection abandoned" || bad "c: no stalled reconnection abandoned"
  slow=0
  for _ in 1 2 3 4 5 6; do
    http_get "$mp" /healthz
    [ "$HTTP_STATUS" = 200 ] || slow=$((slow + 1))
    sleep 0.5
  done
  expect_eq "c: /healthz answered during the reconnections (6 tries)" "$slow" 0
  expect_ge "c: kvbridge_nats_connect_stalls_total" "$(metric "$mp" kvbridge_nats_connect_stalls_total)" 1
  s0=$SECONDS
  signal_pid "$kpid" TERM 15
  expect_eq "c: exit status 75 after SIGTERM (router events not delivered)" "$RC" 75
  expect_ge "c: the undelivered bytes are logged" \
    "$(count_log "$T/kvb-c.log" 'flush at shutdown: .*not delivered: exit status 75')" 1
  expect_le "c: stopped within 8 s of SIGTERM" $((SECONDS - s0)) 8
else
  bad "c: kvbridge did not start"
fi

finish
