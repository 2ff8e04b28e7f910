#!/usr/bin/env bash
# JetStream without a stream leader for a long time, then one elected:
# kvbridge must recover by itself (retry, never wait forever), and say so.
#   A 3-node cluster, a stream with 3 replicas, kvbridge under 500 batches/s.
#   The two nodes kvbridge is not connected to are SIGKILLed: its node keeps
#   the connection but the stream has no quorum, so no leader; every publish
#   gets "no responders" or no answer.  kvbridge must report the stall
#   (kvbridge_jetstream_stalled 1, a warning), pause reading when its window
#   fills, and keep sending again.  After the stall lasted NOLEADER_S (10) s,
#   one node comes back on its store: a leader is elected and kvbridge, with
#   nothing done to it, stores everything: 0 lost, 0 stored twice, the stall
#   ended (gauge 0, its length in the log).
source "$(dirname "$0")/lib.sh"

js_build || { finish; exit 1; }
NOLEADER_S=${NOLEADER_S:-10}

js_cluster kvbnl || { finish; exit 1; }

p=$(daemon_port 2); mp=$(daemon_port)
cat >"$T/k.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
nats:
  servers: [nats://127.0.0.1:${JS_PP[1]}, nats://127.0.0.1:${JS_PP[2]}, nats://127.0.0.1:${JS_PP[3]}]
  connect_timeout_ms: 30000
  jetstream:
    enabled: true
    replicas: 3
    ack_timeout_ms: 2000
metrics:
  listen: 127.0.0.1:$mp
YAML
start_kvbridge kvb "$T/k.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
kpid=$KVB_PID
node=$(kvbridge_node)
[ -n "$node" ] && ok "kvbridge is connected to n$node" || { bad "kvbridge's node not found"; finish; exit 1; }

"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
  --batches 15000 --rate 500 --replay-buffer 20000 --seed 71 --wait-subscribers 800 \
  --linger 120000 --record "$T/rec" 2>"$T/sim.log" &
spid=$!; PIDS+=("$spid")
wait_published "$mp" 3000 60 || bad "kvbridge did not publish 3000 router events"
expect_eq "not stalled under normal load" "$(metric "$mp" kvbridge_jetstream_stalled)" 0

# the two other nodes go: no quorum, no stream leader
killed=()
for i in 1 2 3; do
  [ "$i" = "$node" ] && continue
  signal_pid "${JS_PID[$i]}" KILL 5; killed+=("$i")
done
end=$((SECONDS + 60))
until [ "$(metric "$mp" kvbridge_jetstream_stalled)" = 1 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
expect_eq "the stall is reported (kvbridge_jetstream_stalled)" "$(metric "$mp" kvbridge_jetstream_stalled)" 1
expect_eq "... and logged" "$(count_log "$T/kvb.log" 'JetStream stores none of our publishes')" 1
# it lasts NOLEADER_S seconds (measured on kvbridge's side: the stall's start)
t_stall=$SECONDS
fails() {
  echo $(( $(metric "$mp" 'kvbridge_jetstream_ack_failures_total{reason="no_responders"}') + \
           $(metric "$mp" 'kvbridge_jetstream_ack_failures_total{reason="timeout"}') ))
}
fails_at_stall=$(fails)
timeout 15 "$T/js_check" --server "nats://127.0.0.1:${JS_PP[$node]}" --stream "$STREAM" --info 1 \
  >"$T/noleader.out" 2>&1 || true
echo "     without quorum: $(grep '^cluster:' "$T/noleader.out")$(grep 'js_check:' "$T/noleader.out")"
while [ $((SECONDS - t_stall)) -lt "$NOLEADER_S" ]; do
  [ "$(metric "$mp" kvbridge_jetstream_stalled)" = 1 ] || break
  sleep 0.5
done
echo "     after ${NOLEADER_S} s: $(js_diag "$mp")"
expect_eq "still stalled while there is no leader" "$(metric "$mp" kvbridge_jetstream_stalled)" 1
expect_eq "reading paused (the window is full)" "$(metric "$mp" kvbridge_reading_paused)" 1
# sending goes on while stalled: with ack_timeout_ms 2000, NOLEADER_S seconds
# of stall give several more failed answers than the stall started with
expect_ge "it kept sending while stalled (failed answers over ${NOLEADER_S} s)" \
  "$(fails)" "$((fails_at_stall + 2))"

# one node back on its store: quorum, a leader; nothing is done to kvbridge
node_start "${killed[0]}" -again
wait_port "${JS_PP[${killed[0]}]}" 15 || bad "n${killed[0]} did not come back"
end=$((SECONDS + 90)); leader=none
while [ $SECONDS -lt $end ]; do
  timeout 15 "$T/js_check" --server "nats://127.0.0.1:${JS_PP[$node]}" --stream "$STREAM" --info 1 \
    >"$T/lead.out" 2>/dev/null || true
  leader=$(leader_of lead); leader=${leader:-none}
  [ "$leader" != none ] && break
  sleep 0.5
done
[ "$leader" != none ] && ok "a leader is elected once n${killed[0]} is back ($leader)" \
  || bad "no leader even with n${killed[0]} back"
end=$((SECONDS + 60))
until [ "$(wc -l 2>/dev/null <"$T/rec" || echo 0)" -ge 15000 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
want=$(rec_counts "$T/rec" all)
SETTLE_S=90 settle "$mp" "$(( $(field events "$want") + 1 ))" \
  && ok "kvbridge recovered by itself: everything published and acknowledged" \
  || bad "kvbridge did not recover after the election"
expect_eq "the stall is over (gauge)" "$(metric "$mp" kvbridge_jetstream_stalled)" 0
expect_eq "its end is logged with its length" "$(count_log "$T/kvb.log" 'JetStream stores our publishes again after')" 1
grep -h 'JetStream stores' "$T/kvb.log" | sed 's/^/     | /'
expect_eq "nothing refused by the stream" "$(metric "$mp" kvbridge_jetstream_publish_errors_total)" 0
expect_eq "no NATS-side barrier" "$(count_log "$T/kvb.log" "lost on the NATS side")" 0
signal_pid "$spid" TERM 10
signal_pid "$kpid" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
"$T/js_check" --server "nats://127.0.0.1:${JS_PP[$node]}" --stream "$STREAM" \
  --wait-msgs "$(( $(field events "$want") + 1 ))" --wait-ms 20000 >"$T/after.out" 2>"$T/after.err" \
  || bad_log "js_check failed" "$T/after.err"
echo "     engine: $want"
echo "     $(grep '^jscheck:' "$T/after.out")"
expect_eq "messages in the stream = engine events + start barrier" "$(js_stat after messages)" \
  "$(( $(field events "$want") + 1 ))"
expect_eq "no event_id missing (0 lost)" "$(js_stat after holes)" 0
expect_eq "no Nats-Msg-Id stored twice" "$(js_stat after dup_ids)" 0
expect_eq "no event_id stored twice" "$(js_stat after dup_events)" 0
for i in 1 2 3; do kill -0 "${JS_PID[$i]}" 2>/dev/null && signal_pid "${JS_PID[$i]}" TERM 10; done
finish
