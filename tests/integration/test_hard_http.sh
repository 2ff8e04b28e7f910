#!/usr/bin/env bash
# Slow HTTP clients (slowloris) must not take /healthz and /metrics down: a
# liveness probe that goes unanswered restarts a healthy bridge.
#   1. 16 connections from 127.0.0.1 each send a partial request and then one
#      header byte now and then (never finishing it): probes of /healthz and
#      /metrics from 127.0.0.1 are answered, each within 2 s.
#   2. 48 such connections from 127.0.0.1, more than one address may hold
#      (the per-IP limit, kvbridge(8) METRICS): probes from another address
#      (127.0.0.2, as a kubelet or Prometheus would come from) are answered.
#   3. Connections that send nothing more are closed by kvbridge after the
#      idle timeout (5 s), which frees their slots: probes from 127.0.0.1 are
#      answered again; a silent connection lasts that long, not much longer.
# Probes: curl (--interface picks the source address), --max-time 2.
source "$(dirname "$0")/lib.sh"

command -v curl >/dev/null || { bad "curl is missing (make deps installs it)"; finish; exit 1; }

np=$(daemon_port); ep=$(daemon_port); mp=$(daemon_port)
start_nats "$np" || { bad "nats-server did not start"; finish; exit 1; }
SOURCES="  - endpoint: tcp://127.0.0.1:$ep" NATS_URLS="nats://127.0.0.1:$np" \
  kvbridge_config "$T/kvb.yaml"
sed -i "s|^  listen: \"\"|  listen: 127.0.0.1:$mp|" "$T/kvb.yaml"
start_kvbridge kvb "$T/kvb.yaml" || { bad_log "kvbridge did not start" "$T/kvb.log"; finish; exit 1; }
KPID=$KVB_PID
wait_port "$mp" 10 || bad "metrics port $mp not listening"

# probe SRC PATH: HTTP status of one GET from source address SRC (000: none in 2 s)
probe() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 2 --interface "$1" \
    "http://127.0.0.1:$mp$2" 2>/dev/null || true
}
# probes WHAT SRC: 5 probes of each path; every one must answer 200
probes() {
  local what=$1 src=$2 path i got n
  for path in /healthz /metrics; do
    n=0
    for i in 1 2 3 4 5; do
      got=$(probe "$src" "$path")
      [ "$got" = 200 ] && n=$((n + 1))
      [ "${NUDGE:-1}" = 0 ] || nudge
    done
    expect_eq "$what: $path from $src answered 200 within 2 s" "$n/5" "5/5"
  done
}

# slow connections: each sends the start of a request, then a header byte
# from time to time (nudge), never the blank line that ends it
# (kvbridge closes what is over its limits: a write there must fail with
# EPIPE, not kill this shell)
trap '' PIPE
SLOW=()
open_slow() { # open_slow N
  local i fd
  for i in $(seq "$1"); do
    if exec {fd}<>"/dev/tcp/127.0.0.1/$mp"; then
      { printf 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ' >&"$fd"; } 2>/dev/null || true
      SLOW+=("$fd")
    fi
  done
}
nudge() { local fd; for fd in "${SLOW[@]}"; do { printf 'x' >&"$fd"; } 2>/dev/null || true; done; }
close_slow() { local fd; for fd in "${SLOW[@]}"; do exec {fd}>&-; done; SLOW=(); }

expect_eq "before: /healthz" "$(probe 127.0.0.1 /healthz)" 200

# 1. 16 slow connections (the old connection limit), probes from the same address
open_slow 16
expect_eq "case 1: slow connections open" "${#SLOW[@]}" 16
probes "case 1: 16 slow connections" 127.0.0.1

# 2. 48 slow connections from 127.0.0.1: probes from another address
open_slow 32
probes "case 2: 48 slow connections from 127.0.0.1" 127.0.0.2
kill -0 "$KPID" 2>/dev/null && ok "case 2: kvbridge alive" || bad "case 2: kvbridge died"

# 3. idle timeout: stop nudging; kvbridge closes the connections it holds
# (ours stay open), and probes from 127.0.0.1 are served again
t0=$SECONDS
until [ "$(probe 127.0.0.1 /healthz)" = 200 ] || [ $((SECONDS - t0)) -ge 20 ]; do sleep 0.2; done
expect_le "case 3: silent slow connections freed by the idle timeout within 20 s (s)" "$((SECONDS - t0))" 19
NUDGE=0 probes "case 3: slow connections gone silent" 127.0.0.1
close_slow
# a connection that never sends is closed after the idle timeout, not before
exec {idle}<>"/dev/tcp/127.0.0.1/$mp"
t0=$SECONDS
if timeout 20 cat <&$idle >/dev/null 2>&1; then
  expect_ge "case 3: a silent connection is kept for the idle timeout (s)" "$((SECONDS - t0))" 3
  expect_le "case 3: a silent connection is closed within 20 s (s)" "$((SECONDS - t0))" 19
else
  bad "case 3: a silent connection stayed open 20 s"
fi
exec {idle}>&-

signal_pid "$KPID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
finish
