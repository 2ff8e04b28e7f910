#!/usr/bin/env bash
# ZMQ CURVE on the engine link (sources[].curve), with key pairs made by
# kvsim --curve-keygen.
# (1) bind mode with curve.allowed_clients_file: an engine whose key is listed
#     gets every event through (counts = record); an engine with another key
#     is refused during the handshake (kvbridge_curve_clients_rejected_total,
#     a warning with its address, never a key) and a plain engine cannot
#     connect: nothing of theirs arrives.
# (2) connect mode: kvbridge is a CURVE client of a CURVE-server engine, for
#     the replay socket too (a dropped range is filled through it); a second
#     kvbridge with a wrong server key receives nothing and keeps running,
#     until SIGHUP gives it the right key.
# CURVE off (the default) is what every other test runs.
source "$(dirname "$0")/lib.sh"

cmetric() { metric "$1" "$2" absent; } # a counter that must be there

# keys NAME: $T/NAME.pub and $T/NAME.sec (Z85, one line each)
keys() {
  "$BIN/kvsim" --curve-keygen >"$T/$1.keys" || return 1
  sed -n 1p "$T/$1.keys" >"$T/$1.pub"
  sed -n 2p "$T/$1.keys" >"$T/$1.sec"
  rm -f "$T/$1.keys"
}
for k in bridge engine intruder server; do keys "$k" || bad "kvsim --curve-keygen ($k)"; done
expect_eq "a key is 40 Z85 characters" "$(tr -d '\n' <"$T/bridge.pub" | wc -c)" 40

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }

# no secret key in a log: LOG
no_keys_in() {
  local k n=0
  for k in bridge engine intruder server; do
    grep -qF -- "$(cat "$T/$k.sec")" "$1" && n=$((n + 1))
    grep -qF -- "$(cat "$T/$k.pub")" "$1" && n=$((n + 1))
  done
  expect_eq "no key in $(basename "$1")" "$n" 0
}

# ---- (1) bind mode, allowed_clients_file -------------------------------------
P=$(daemon_port)
MP=$(daemon_port)
printf '# engines allowed to connect\n\n%s\n' "$(cat "$T/engine.pub")" >"$T/allowed"
cat >"$T/bind.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$P
    mode: bind
    curve:
      secret_key_file: bridge.sec   # next to this file
      allowed_clients_file: allowed
nats:
  servers: [nats://127.0.0.1:$NP]
metrics:
  listen: 127.0.0.1:$MP
YAML
start_kvbridge kvb "$T/bind.yaml" || bad "kvbridge (bind, CURVE) did not start"
KVB1=$KVB_PID
expect_eq "kvbridge log: CURVE server with an allowlist" \
  "$(count_log "$T/kvb.log" "CURVE server, clients in curve.allowed_clients_file only")" 1

sim=("$BIN/kvsim" --connect --endpoint "tcp://127.0.0.1:$P" --rate 400 --linger 0)
# refused: a key not in the list, and no CURVE at all (both try for ~1.5 s)
timeout 30 "${sim[@]}" --topic intruder --batches 400 --seed 3 --wait-subscribers 500 \
  --curve-secret-file "$T/intruder.sec" --curve-server-key "$(cat "$T/bridge.pub")" \
  2>"$T/intruder.log" &
I_PID=$!
PIDS+=("$I_PID")
timeout 30 "${sim[@]}" --topic plain --batches 400 --seed 4 --wait-subscribers 500 \
  2>"$T/plain.log" &
N_PID=$!
PIDS+=("$N_PID")
wait_pid "$I_PID" 30
expect_eq "intruder kvsim exit code" "$RC" 0
wait_pid "$N_PID" 30
expect_eq "plain kvsim exit code" "$RC" 0
expect_ge "kvbridge_curve_clients_rejected_total" \
  "$(cmetric "$MP" kvbridge_curve_clients_rejected_total)" 1
expect_ge "kvbridge log: the refused client's address" \
  "$(count_log "$T/kvb.log" "CURVE client from 127.0.0.1 refused: its public key is not in curve.allowed_clients_file")" 1
expect_eq "nothing received from them" "$(cmetric "$MP" kvbridge_batches_received_total)" 0
expect_eq "kvbridge log: no stream of theirs" "$(grep -c "topic '\(intruder\|plain\)'" "$T/kvb.log")" 0

# the listed engine: every event
start_kvtail tail1 "$NP" --check --index --expect-record "$T/rec1" --timeout 2500 || bad "kvtail not ready"
T1=$TAIL_PID
timeout 30 "${sim[@]}" --topic engine --batches 600 --rate 1600 --seed 5 --wait-subscribers 1000 \
  --linger 500 --record "$T/rec1" --curve-secret-file "$T/engine.sec" \
  --curve-server-key "$(cat "$T/bridge.pub")" 2>"$T/sim1.log" || bad_log "allowed kvsim failed" "$T/sim1.log"
wait_pid "$T1" 30
expect_eq "kvtail checks pass (exit code)" "$RC" 0
expect_tail_clean tail1
w=$(rec_counts "$T/rec1" live)
expect_eq "allowed engine: all 600 batches live" "$(field batches "$w")" 600
expect_eq "stored = record" "$(tail_stat tail1 stored)" "$(field stored "$w")"
expect_eq "removed = record" "$(tail_stat tail1 removed)" "$(field removed "$w")"
expect_eq "cleared = record + start barrier" "$(tail_stat tail1 cleared)" "$(($(field cleared "$w") + 1))"
expect_eq "kvbridge_batches_received_total = 600" "$(cmetric "$MP" kvbridge_batches_received_total)" 600
signal_pid "$KVB1" TERM 15
expect_eq "kvbridge (bind) exit code" "$RC" 0
no_keys_in "$T/kvb.log"

# ---- (2) connect mode --------------------------------------------------------
E=$(daemon_port)
R=$(daemon_port)
MP2=$(daemon_port)
MP3=$(daemon_port)
# (a Z85 key may hold '$': written as '$$', since values expand ${NAME} and $$;
# a key with "$$" or "${" in it failed about one run in a hundred)
conf_connect() { # conf_connect FILE SERVER_KEY_FILE SUBJECT METRICS_PORT
  cat >"$1" <<YAML
worker_id: 8
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$E
    replay_endpoint: tcp://127.0.0.1:$R
    curve:
      secret_key_file: $T/bridge.sec
      server_public_key: '$(sed 's/\$/$$/g' "$2")'
nats:
  servers: [nats://127.0.0.1:$NP]
  subject: $3
metrics:
  listen: 127.0.0.1:$4
YAML
}
conf_connect "$T/connect.yaml" "$T/server.pub" kv.right "$MP2"
conf_connect "$T/wrong.yaml" "$T/intruder.pub" kv.wrong "$MP3"
start_kvtail tail2 "$NP" --subject kv.right --check --index --expect-record "$T/rec2" --timeout 3000 ||
  bad "kvtail not ready"
T2=$TAIL_PID
start_kvtail tail3 "$NP" --subject kv.wrong --timeout 6000 || bad "kvtail (wrong) not ready"
T3=$TAIL_PID
start_kvbridge kvb2 "$T/connect.yaml" || bad "kvbridge (connect, CURVE) did not start"
KVB2=$KVB_PID
start_kvbridge kvb3 "$T/wrong.yaml" || bad "kvbridge (wrong server key) did not start"
KVB3=$KVB_PID
# batches 200..209 are not published live: kvbridge asks the replay ROUTER
# (a CURVE server too) for them
timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$E" --replay "tcp://127.0.0.1:$R" \
  --curve-secret-file "$T/server.sec" --batches 600 --rate 1600 --seed 6 --drop-live 200-209 \
  --wait-subscribers 1500 --linger 1000 --record "$T/rec2" 2>"$T/sim2.log" ||
  bad_log "CURVE server kvsim failed" "$T/sim2.log"
wait_pid "$T2" 30
expect_eq "kvtail checks pass (exit code)" "$RC" 0
expect_tail_clean tail2
w=$(rec_counts "$T/rec2" delivered)
expect_eq "stored = record (live and replayed)" "$(tail_stat tail2 stored)" "$(field stored "$w")"
expect_eq "removed = record" "$(tail_stat tail2 removed)" "$(field removed "$w")"
expect_eq "cleared = record + start barrier (no gap barrier)" \
  "$(tail_stat tail2 cleared)" "$(($(field cleared "$w") + 1))"
expect_eq "kvbridge log: the gap filled through the CURVE replay socket" \
  "$(count_log "$T/kvb2.log" "gap filled up to seq 209")" 1
expect_eq "kvbridge_replays_failed_total" "$(cmetric "$MP2" kvbridge_replays_failed_total)" 0
expect_eq "kvbridge_batches_received_total = 600" "$(cmetric "$MP2" kvbridge_batches_received_total)" 600

wait_pid "$T3" 30
expect_eq "wrong server key: nothing on NATS" "$(tail_stat tail3 messages)" 0
expect_eq "wrong server key: nothing received" "$(cmetric "$MP3" kvbridge_batches_received_total)" 0
if kill -0 "$KVB3" 2>/dev/null; then ok "wrong server key: kvbridge still running"; else bad "wrong server key: kvbridge died"; fi
signal_pid "$KVB2" TERM 15
expect_eq "kvbridge (connect) exit code" "$RC" 0

# SIGHUP with the right server key: the source is reopened with it
conf_connect "$T/wrong.yaml" "$T/server.pub" kv.wrong "$MP3"
kill -HUP "$KVB3"
wait_log "$T/kvb3.log" "(sources reopened)" 10 && ok "reload: sources reopened" || bad "reload: sources not reopened"
timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$E" --curve-secret-file "$T/server.sec" \
  --batches 200 --rate 1600 --seed 7 --wait-subscribers 1500 --linger 200 2>"$T/sim3.log" ||
  bad_log "CURVE server kvsim (reload) failed" "$T/sim3.log"
for _ in $(seq 50); do [ "$(cmetric "$MP3" kvbridge_batches_received_total)" = 200 ] && break; sleep 0.1; done
expect_eq "reloaded server key: all 200 batches received" "$(cmetric "$MP3" kvbridge_batches_received_total)" 200
signal_pid "$KVB3" TERM 15
expect_eq "kvbridge (reloaded key) exit code" "$RC" 0
no_keys_in "$T/kvb2.log"
no_keys_in "$T/kvb3.log"

stop_pid "$NATS_PID" >/dev/null
finish
