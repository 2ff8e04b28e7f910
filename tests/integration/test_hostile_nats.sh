#!/usr/bin/env bash
# Hostile or broken NATS servers.
#   a. stall: the server stops reading (nats-server SIGSTOPped) under 3000
#      batches/s.  kvbridge pauses reading (backpressure) and /readyz answers
#      503 saying NATS does not take router events (before: 200 all along);
#      SIGTERM then ends kvbridge within nats.flush_timeout_ms + 1.5 s with
#      exit status 75, the undelivered bytes logged (before: exit 0, after
#      two flush timeouts).
#   b. discovered servers: a server (fake_nats.c) advertises another address
#      in its INFO connect_urls, then hangs up.  kvbridge reconnects only to
#      nats.servers: the advertised server never sees a connection, so no
#      credentials go to it (before: nats.c connected to it).  With
#      nats.discovered_servers: true it does (the control).
source "$(dirname "$0")/lib.sh"

# ---- a. a server that stops reading ----
np=$(daemon_port); ep=$(daemon_port); mp=$(daemon_port)
start_nats "$np" || { bad "nats-server did not start"; finish; exit 1; }
cat >"$T/a.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$ep
nats:
  servers: [nats://127.0.0.1:$np]
  reconnect_buffer_bytes: 1048576
  flush_timeout_ms: 3000
$(kvb_format_yaml)
metrics:
  listen: 127.0.0.1:$mp
YAML
if start_kvbridge kvb-a "$T/a.yaml"; then
  kpid=$KVB_PID
  start sim-a timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$ep" --rate 3000 --seed 7
  end=$((SECONDS + 10))
  until [ "$(metric "$mp" kvbridge_batches_received_total)" -ge 1000 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
  http_get "$mp" /readyz
  expect_eq "a: /readyz while NATS reads" "$HTTP_STATUS" 200
  kill -STOP "$NATS_PID"
  end=$((SECONDS + 20))
  until http_get "$mp" /readyz && [ "$HTTP_STATUS" = 503 ]; do [ $SECONDS -ge $end ] && break; sleep 0.2; done
  expect_eq "a: /readyz once NATS stopped reading" "$HTTP_STATUS" 503
  check "a: /readyz says why ($(head -n 1 "$T/http.body"))" grep -q "NATS has not taken router events" "$T/http.body"
  expect_eq "a: kvbridge_reading_paused" "$(metric "$mp" kvbridge_reading_paused)" 1
  http_get "$mp" /healthz
  expect_eq "a: /healthz" "$HTTP_STATUS" 200
  t0=$(date +%s%N)
  signal_pid "$kpid" TERM 15
  ms=$((($(date +%s%N) - t0) / 1000000))
  expect_eq "a: exit status 75 (router events not delivered)" "$RC" 75
  # one flush timeout (the drain's), then closing the stalled connection
  # (about 0.5 s); before: the sink flushed for flush_timeout_ms once more
  expect_le "a: stopped within flush_timeout_ms + 1.5 s of SIGTERM (ms)" "$ms" 4500
  expect_ge "a: the loss is logged" "$(count_log "$T/kvb-a.log" 'not delivered: exit status 75')" 1
  kill -CONT "$NATS_PID"
else
  bad "a: kvbridge did not start"
fi

# ---- b. servers advertised in connect_urls ----
gcc -O1 -o "$T/fake_nats" "$ROOT/tests/integration/fake_nats.c" 2>"$T/gcc.log" \
  && ok "fake_nats built" || { bad_log "fake_nats did not build" "$T/gcc.log"; finish; exit 1; }
run_b() { # run_b TAG DISCOVERED(true|false): sets CONNS (connections the advertised server saw)
  local fa fb ep2 kp
  fa=$(daemon_port); fb=$(daemon_port); ep2=$(daemon_port)
  start "fb-$1" "$T/fake_nats" "$fb" 0
  start "fa-$1" "$T/fake_nats" "$fa" 1 1500 "127.0.0.1:$fb"
  wait_log "$T/fa-$1.log" listening 5 && wait_log "$T/fb-$1.log" listening 5 || bad "$1: fake_nats did not listen"
  cat >"$T/$1.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$ep2
nats:
  servers: [nats://127.0.0.1:$fa]
  discovered_servers: $2
  reconnect_wait_ms: 100
  reconnect_wait_max_ms: 200
  flush_timeout_ms: 500
metrics:
  listen: ""
YAML
  if start_kvbridge "kvb-$1" "$T/$1.yaml"; then
    kp=$KVB_PID
    wait_log "$T/fa-$1.log" 'close 1' 10 || bad "$1: the first server never hung up"
    if [ "$2" = true ]; then # nats.c picks at random among the servers it knows
      wait_log "$T/fb-$1.log" 'conn 1' 15 || true
    else # two reconnections to the configured server: time enough to go elsewhere
      wait_log "$T/fa-$1.log" 'conn 3' 10 || bad "$1: kvbridge did not reconnect"
    fi
    CONNS=$(count_log "$T/fb-$1.log" '^conn ')
    signal_pid "$kp" TERM 15
  else
    bad "$1: kvbridge did not start"
    CONNS=-1
  fi
}
run_b b false
expect_eq "b: connections to the advertised server (nats.discovered_servers false)" "$CONNS" 0
run_b b-control true
expect_ge "b: connections to it with nats.discovered_servers true (control)" "$CONNS" 1

finish
