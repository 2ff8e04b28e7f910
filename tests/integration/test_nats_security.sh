#!/usr/bin/env bash
# NATS security end to end (nats-server with a config file; kvsim -> kvbridge
# -> a subscriber with its own credentials):
#  1. user/password: good credentials deliver every router event; a wrong
#     password with nats.connect_timeout_ms 20000 exits 69 at once, naming the
#     server's reason; with 0 kvbridge keeps running and logs every refused
#     attempt; no secret appears in --check output or in any log
#  2. token: the same
#  3. TLS with client certificates (a CA made here with openssl; the server
#     verifies clients): delivers; a wrong CA, and no client certificate, exit
#     69 with the TLS reason.  kvtail only takes a URL, so the subscriber here
#     is tests/integration/nats_tls_sub.c, compiled by this script
#  4. the password from password_file, found through $CREDENTIALS_DIRECTORY
#     (systemd LoadCredential=), and next to the config file without it
source "$(dirname "$0")/lib.sh"

SUBJ=namespace.dynamo.component.backend.kv_events
PW=kvb-pass-5f3a9c      # kvbridge's password (must never be printed)
TOKEN=kvb-token-e81d02  # its token (same)
TAILPW=tail-pass-77     # the subscriber's password

# kvb_conf FILE ENGINE_PORT NATS_LINES: a kvbridge config; NATS_LINES go under
# nats: (indented by two); CT = nats.connect_timeout_ms (default 20000: far
# above the time a refused kvbridge takes to exit, even under valgrind)
kvb_conf() {
  {
    printf 'worker_id: 7\nblock_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:%s\nnats:\n' "$2"
    printf '%s\n' "$3"
    printf '  connect_timeout_ms: %s\n  flush_timeout_ms: 1000\n' "${CT:-20000}"
    printf '  reconnect_wait_ms: 200\n  reconnect_wait_max_ms: 400\nmetrics:\n  listen: ""\n'
  } >"$1"
}

# flow NAME CONF ENGINE_PORT SUBSCRIBER...: kvbridge (environment from
# KVB_ENV) starts, then the subscriber (writes $T/NAME.ready once subscribed,
# prints messages=N last; its idle timeout runs from its start, so it comes
# after a kvbridge slow to start, under valgrind; kvbridge publishes nothing
# before the first batch), then kvsim publishes 40 batches: every router event
# must arrive
flow() {
  local name=$1 conf=$2 ep=$3 spid kpid want got; shift 3
  # shellcheck disable=SC2086  # KVB_ENV: none, or one VAR=value word
  start "$name" env ${KVB_ENV:-} "$BIN/kvbridge" -c "$conf"
  kpid=$LAST_PID
  wait_log "$T/$name.log" "running:" 15 || { bad_log "$name: kvbridge did not start" "$T/$name.log"; return 1; }
  rm -f "$T/$name.ready"
  "$@" >"$T/$name.sub" 2>"$T/$name.suberr" &
  spid=$!; PIDS+=("$spid")
  wait_file "$T/$name.ready" 10 || { bad_log "$name: subscriber not ready" "$T/$name.suberr"; return 1; }
  timeout 20 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$ep" --batches 40 --rate 400 --seed 11 \
    --wait-subscribers 1000 --linger 200 --record "$T/$name.rec" 2>"$T/$name.sim" \
    || bad_log "$name: kvsim failed" "$T/$name.sim"
  wait_pid "$spid" 20
  expect_eq "$name: subscriber exit code" "$RC" 0
  want=$(rec_counts "$T/$name.rec" live)
  got=$(grep -o 'messages=[0-9]*' "$T/$name.sub" | tail -1 | cut -d= -f2)
  expect_eq "$name: every router event delivered (record + start barrier)" "$got" \
    "$(($(field events "$want") + 1))"
  signal_pid "$kpid" TERM 10
  expect_eq "$name: kvbridge exit code after SIGTERM" "$RC" 0
}

# refused NAME CONF PATTERN: kvbridge exits 69 well before the 20 s
# connect_timeout_ms, its log naming the cause
refused() {
  local t0=$SECONDS
  RC=0; timeout 40 "$BIN/kvbridge" -c "$2" >"$T/$1.log" 2>&1 </dev/null || RC=$?
  expect_eq "$1: exit code 69 (EX_UNAVAILABLE)" "$RC" 69
  expect_lt "$1: exits at once, not after connect_timeout_ms (s)" "$((SECONDS - t0))" 10
  if grep -q -- "$3" "$T/$1.log"; then ok "$1: the log says why ($3)"; else bad_log "$1: no '$3' in the log" "$T/$1.log"; fi
}

tail_cmd() { # tail_cmd NAME USERINFO PORT: kvtail with credentials in the URL
  echo "$BIN/kvtail" --server "nats://$2@127.0.0.1:$3" --ready-file "$T/$1.ready" \
    --check --quiet --timeout 2500
}

# ---- 1. user and password -------------------------------------------------
NP=$(daemon_port); EP=$(daemon_port)
cat >"$T/users.conf" <<CONF
authorization {
  users = [
    { user: kvb, password: "$PW" }
    { user: tail, password: "$TAILPW" }
  ]
}
CONF
start_nats "$NP" -c "$T/users.conf" || bad "nats-server (users) did not start"
USERS_PID=$NATS_PID

kvb_conf "$T/user.yaml" "$EP" "  servers: [nats://127.0.0.1:$NP]
  user: kvb
  password: \"$PW\""
RC=0; "$BIN/kvbridge" -c "$T/user.yaml" --check >"$T/check-user.out" 2>&1 || RC=$?
expect_eq "--check with a password: exit code" "$RC" 0
expect_eq "--check prints no secret" "$(grep -c -- "$PW" "$T/check-user.out")" 0
# shellcheck disable=SC2046
flow user "$T/user.yaml" "$EP" $(tail_cmd user "tail:$TAILPW" "$NP") || true

kvb_conf "$T/user-bad.yaml" "$EP" "  servers: [nats://127.0.0.1:$NP]
  user: kvb
  password: wrong-$PW"
refused user-bad "$T/user-bad.yaml" "NATS server rejected the connection: Authorization Violation"

# connect_timeout_ms 0: keeps running, every attempt logged
CT=0 kvb_conf "$T/user-bad0.yaml" "$EP" "  servers: [nats://127.0.0.1:$NP]
  user: kvb
  password: wrong-$PW"
start user-bad0 "$BIN/kvbridge" -c "$T/user-bad0.yaml"
KPID=$LAST_PID
end=$((SECONDS + 10))
while [ "$(count_log "$T/user-bad0.log" 'Authorization Violation (attempt')" -lt 3 ] && [ $SECONDS -lt $end ]; do sleep 0.1; done
expect_ge "connect_timeout_ms 0: refused attempts retried and logged" \
  "$(count_log "$T/user-bad0.log" 'rejected the connection: Authorization Violation (attempt')" 3
kill -0 "$KPID" 2>/dev/null && ok "connect_timeout_ms 0: kvbridge keeps running" || bad "connect_timeout_ms 0: kvbridge exited"
signal_pid "$KPID" TERM 10
expect_eq "connect_timeout_ms 0: exit code after SIGTERM" "$RC" 0

# ---- 2. token -------------------------------------------------------------
TP=$(daemon_port)
printf 'authorization { token: "%s" }\n' "$TOKEN" >"$T/token.conf"
start_nats "$TP" -c "$T/token.conf" || bad "nats-server (token) did not start"
kvb_conf "$T/token.yaml" "$EP" "  servers: [nats://127.0.0.1:$TP]
  token: \"$TOKEN\""
# shellcheck disable=SC2046
flow token "$T/token.yaml" "$EP" $(tail_cmd token "$TOKEN" "$TP") || true
kvb_conf "$T/token-bad.yaml" "$EP" "  servers: [nats://127.0.0.1:$TP]
  token: not-$TOKEN"
refused token-bad "$T/token-bad.yaml" "NATS server rejected the connection: Authorization Violation"

# ---- 3. TLS, clients verified ---------------------------------------------
P=$T/pki; mkdir -p "$P"
command -v openssl >/dev/null || bad "openssl is not installed (apt-get install openssl)"
pki() { openssl "$@" >>"$P/openssl.log" 2>&1 || true; }
pki req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca-key.pem" -out "$P/ca.pem" -days 2 -subj "/CN=kvbridge test CA"
pki req -x509 -newkey rsa:2048 -nodes -keyout "$P/other-ca-key.pem" -out "$P/other-ca.pem" -days 2 -subj "/CN=another CA"
pki req -newkey rsa:2048 -nodes -keyout "$P/server-key.pem" -out "$P/server.csr" -subj "/CN=localhost"
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$P/server.ext"
pki x509 -req -in "$P/server.csr" -CA "$P/ca.pem" -CAkey "$P/ca-key.pem" -CAcreateserial -out "$P/server.pem" -days 2 -extfile "$P/server.ext"
pki req -newkey rsa:2048 -nodes -keyout "$P/client-key.pem" -out "$P/client.csr" -subj "/CN=kvbridge"
printf 'extendedKeyUsage=clientAuth\n' >"$P/client.ext"
pki x509 -req -in "$P/client.csr" -CA "$P/ca.pem" -CAkey "$P/ca-key.pem" -CAcreateserial -out "$P/client.pem" -days 2 -extfile "$P/client.ext"
[ -s "$P/server.pem" ] && [ -s "$P/client.pem" ] && ok "test PKI made with openssl" || bad_log "openssl failed" "$P/openssl.log"

# shellcheck disable=SC2046
gcc -O1 -o "$T/nats_tls_sub" "$ROOT/tests/integration/nats_tls_sub.c" $(pkg-config --cflags --libs libnats) \
  2>"$T/gcc.log" && ok "nats_tls_sub built" || bad_log "nats_tls_sub did not build" "$T/gcc.log"

SP=$(daemon_port)
cat >"$T/tls.conf" <<CONF
tls {
  cert_file: "$P/server.pem"
  key_file: "$P/server-key.pem"
  ca_file: "$P/ca.pem"
  verify: true
  timeout: 2
}
CONF
start_nats "$SP" -c "$T/tls.conf" || bad "nats-server (TLS) did not start"
kvb_conf "$T/tls.yaml" "$EP" "  servers: [nats://127.0.0.1:$SP]
  tls:
    enabled: true
    ca: pki/ca.pem
    cert: pki/client.pem
    key: pki/client-key.pem"
flow tls "$T/tls.yaml" "$EP" "$T/nats_tls_sub" "nats://127.0.0.1:$SP" "$P/ca.pem" "$P/client.pem" \
  "$P/client-key.pem" "$SUBJ" "$T/tls.ready" 2500 || true

# a CA that did not sign the server's certificate (TLS on through tls://)
kvb_conf "$T/tls-ca.yaml" "$EP" "  servers: [tls://127.0.0.1:$SP]
  tls:
    ca: pki/other-ca.pem
    cert: pki/client.pem
    key: pki/client-key.pem"
refused tls-wrong-ca "$T/tls-ca.yaml" "rejected the connection: SSL handshake error: .*unable to get local issuer certificate"

# no client certificate: the server hangs up
kvb_conf "$T/tls-nocert.yaml" "$EP" "  servers: [tls://127.0.0.1:$SP]
  tls:
    ca: pki/ca.pem"
refused tls-no-cert "$T/tls-nocert.yaml" "rejected the connection: .*client certificate"

# ---- 4. password_file through $CREDENTIALS_DIRECTORY ------------------------
mkdir -p "$T/creds"
printf '%s\n' "$PW" >"$T/creds/nats-password"
chmod 600 "$T/creds/nats-password"
kvb_conf "$T/pwfile.yaml" "$EP" "  servers: [nats://127.0.0.1:$NP]
  user: kvb
  password_file: nats-password"
RC=0; "$BIN/kvbridge" -c "$T/pwfile.yaml" --check >"$T/check-nocreds.out" 2>&1 || RC=$?
expect_eq "password_file without \$CREDENTIALS_DIRECTORY: looked up next to the config (78)" "$RC" 78
expect_eq "  ... the error names the file it looked for" \
  "$(grep -c "^$T/pwfile.yaml:8:18: nats.password_file: cannot read '$T/nats-password'" "$T/check-nocreds.out")" 1
RC=0; CREDENTIALS_DIRECTORY=$T/creds "$BIN/kvbridge" -c "$T/pwfile.yaml" --check >"$T/check-creds.out" 2>&1 || RC=$?
expect_eq "password_file in \$CREDENTIALS_DIRECTORY: --check exit code" "$RC" 0
KVB_ENV="CREDENTIALS_DIRECTORY=$T/creds"
# shellcheck disable=SC2046
flow pwfile "$T/pwfile.yaml" "$EP" $(tail_cmd pwfile "tail:$TAILPW" "$NP") || true
KVB_ENV=

# ---- secrets never printed --------------------------------------------------
leaks=$(grep -l -e "$PW" -e "$TOKEN" "$T"/*.log "$T"/*.out 2>/dev/null | grep -v '/nats-' || true)
expect_eq "no password or token in any kvbridge output" "$leaks" ""

stop_pid "$USERS_PID" >/dev/null
finish
