#!/usr/bin/env bash
# nats.format raw: every engine batch republished unchanged, with the headers
# KV-Seq, KV-Topic (absent for an empty topic frame, as kvsim sends),
# KV-Source and KV-DP-Rank.  A gap (kvsim --drop-live) is
# still recovered by replay: kvtail --format raw sees KV-Seq contiguous from 0
# per (source, topic), one message per batch.
source "$(dirname "$0")/lib.sh"

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
P=$(daemon_port 2)
SOURCES="  - endpoint: tcp://127.0.0.1:$P
    replay_endpoint: tcp://127.0.0.1:$((P + 1))" NATS_URLS="nats://127.0.0.1:$NP" \
  KVB_FORMAT=raw kvbridge_config "$T/raw.yaml"
start_kvbridge kvb "$T/raw.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
KVB_FORMAT=raw start_kvtail tail "$NP" --check --timeout 2500 || bad "kvtail not ready"
TPID=$TAIL_PID
timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --replay "tcp://127.0.0.1:$((P + 1))" \
  --batches 500 --rate 1000 --seed 4 --drop-live 200-204 --wait-subscribers 1000 --linger 500 \
  --record "$T/raw.rec" 2>"$T/sim.log" || bad_log "kvsim failed" "$T/sim.log"
wait_pid "$TPID" 30
expect_eq "kvtail checks pass (exit code)" "$RC" 0
expect_eq "one message per engine batch" "$(tail_stat tail messages)" 500
expect_eq "KV-Seq contiguous (replay filled the gap)" "$(tail_stat tail seqerr)" 0
expect_eq "every message has the four headers" "$(tail_stat tail bad)" 0
expect_eq "kvbridge log: gap filled by replay" "$(count_log "$T/kvb.log" 'gap filled up to seq 204')" 1
expect_eq "first message: seq 0, source, topic, rank" \
  "$(grep -m1 '"seq"' "$T/tail.log" | sed 's/,"bytes".*//')" \
  "{\"seq\":0,\"source\":\"tcp://127.0.0.1:$P\",\"topic\":\"\",\"dp_rank\":0"
expect_eq "no empty payload" "$(grep -c '"bytes":0}' "$T/tail.log" || true)" 0
signal_pid "$KVB_PID" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
stop_pid "$NATS_PID" >/dev/null
finish
