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
#   d. the first connection is served and hung up after 2 s; every
#      reconnection gets its PONG 3 s late (FAKE_NATS_LATE_PONG_MS): SIGTERM
#      lands while such a handshake is in progress.
# SIGTERM ends kvbridge within nats.flush_timeout_ms (1 s here), everything
# included: the drain's wait for NATS, cutting the handshake in progress,
# closing (b, c, d measure it, with 300 ms for the test's own polling and the
# process's exit).  The stop's "not delivered" is what was really left:
# 0 bytes in b, where nothing was published.
source "$(dirname "$0")/lib.sh"

gcc -O1 -o "$T/fake_nats" "$ROOT/tests/integration/fake_nats.c" 2>"$T/gcc.log" \
  && ok "fake_nats built" || { bad "fake_nats did not build"; cat "$T/gcc.log"; finish; exit 1; }

# cpu_ticks PID: user+system clock ticks so far
ms_now() { date +%s%3N; }
FLUSH_MS=1000
# stop_in_time NAME PID RC: SIGTERM, then the exit status and the time to exit
stop_in_time() {
  local t0 dt
  t0=$(ms_now)
  signal_pid "$2" TERM 15
  dt=$(($(ms_now) - t0))
  expect_eq "$1: exit status $3 after SIGTERM" "$RC" "$3"
  expect_le "$1: ms from SIGTERM to exit (flush_timeout_ms $FLUSH_MS + 300)" "$dt" $((FLUSH_MS + 300))
}
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
  flush_timeout_ms: $FLUSH_MS
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
  stop_in_time b "$kpid" 0
  expect_ge "b: nothing published, 0 bytes not delivered" \
    "$(count_log "$T/kvb-b.log" 'flush at shutdown: .*(0 bytes of router events not delivered)')" 1
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
  stop_in_time "c (router events not delivered)" "$kpid" 75
  expect_ge "c: the undelivered bytes are logged" \
    "$(count_log "$T/kvb-c.log" 'flush at shutdown: .*not delivered: exit status 75')" 1
else
  bad "c: kvbridge did not start"
fi

# ---- d. served, hung up, then every PONG 3 s late ----
fp=$(daemon_port); ep=$(daemon_port); mp=$(daemon_port)
FAKE_NATS_LATE_PONG_MS=3000 start fake-d "$T/fake_nats" "$fp" 1 2000
wait_log "$T/fake-d.log" listening 5 || bad "d: fake_nats did not listen"
conf "$T/d.yaml" "$fp" "$ep" "$mp" 0
if start_kvbridge kvb-d "$T/d.yaml"; then
  kpid=$KVB_PID
  start sim-d timeout 40 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$ep" --rate 200 --seed 7
  wait_log "$T/fake-d.log" 'close 1' 10 && ok "d: the server hung up" || bad "d: the server never hung up"
  wait_log "$T/fake-d.log" 'conn 2 late' 10 && ok "d: a reconnection waits for its late PONG" \
    || bad "d: no reconnection"
  sleep 0.5 # into that handshake (3 s long)
  t0=$(ms_now)
  signal_pid "$kpid" TERM 15
  dt=$(($(ms_now) - t0))
  expect_le "d: ms from SIGTERM to exit (flush_timeout_ms $FLUSH_MS + 300)" "$dt" $((FLUSH_MS + 300))
  case $RC in 0 | 75) ok "d: exit status $RC after SIGTERM (0, or 75 with events lost)" ;;
    *) bad "d: exit status $RC after SIGTERM" ;; esac
else
  bad "d: kvbridge did not start"
fi

finish
