#!/usr/bin/env bash
# JetStream mode (nats.jetstream.enabled): every router event is stored in a
# stream, acknowledged, and carries Nats-Msg-Id
# {worker_id}.{dp_rank}.{epoch}.{event_id}.  What a consumer gets is read
# from the stream itself after each run by js_check (tests/integration/
# js_check.c, compiled here): every message, its id, event_id runs per
# (worker_id, dp_rank, epoch).
#   a. nats-server -js SIGKILLed for 5 s under 2000 batches/s, restarted on
#      the same store: unacknowledged publishes are sent again and the
#      duplicate window drops the copies the stream already had: 0 lost,
#      0 stored twice, every event of kvsim's record in the stream.  Each
#      pair's events are stored in event_id order: a publish without an ack
#      is sent again only while nothing later of its pair was sent;
#      otherwise it is given up and the pair repaired (a barrier, then its
#      resident blocks), and the index a consumer builds from the stream, in
#      order, is the engine's.  What the stream already stored of them is
#      read back first (found stored: not sent again).  A resend stored after
#      later events shows as one of js_check's reorders.
# (the stream, not the sink's ordering logic, is what is checked)
#   b. kvbridge SIGKILLed under load and restarted with state.dir: the
#      events published after the last save are published again with the same
#      ids and dropped by the duplicate window: 0 lost, 0 stored twice.
#   c. the stream is created when missing with the configured subject,
#      retention, max_age_s, replicas and duplicate window; a stream that does
#      not take the subject, or a missing one with create: false, stops
#      kvbridge at start with exit 69 and says why.
source "$(dirname "$0")/lib.sh"

js_build || { finish; exit 1; }

# ---- JetStream carries dynamo-json only ------------------------------------
# Dynamo's JetStream consumers read one JSON RouterEvent per message: an
# event-plane envelope (or a raw batch) there would reach no router, so the
# combination is refused at load (exit 78) and the runs below use dynamo-json
# whatever KVB_FORMAT says (make integration-msgpack runs this test too).
for f in dynamo-msgpack raw; do
  cat >"$T/refuse-$f.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:5557
nats:
  format: $f
  jetstream:
    enabled: true
YAML
  RC=0; "$BIN/kvbridge" -c "$T/refuse-$f.yaml" --check >"$T/refuse-$f.out" 2>&1 || RC=$?
  expect_eq "$f with JetStream: refused at load (exit 78)" "$RC" 78
  expect_eq "$f with JetStream: says why" \
    "$(count_log "$T/refuse-$f.out" "nats.format: $f cannot be published through JetStream")" 1
done
st_stat() { grep '^stream:' "$T/$1.out" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# js_expect NAME WANT_MESSAGES: the stream holds exactly the engine's events
# (and the start barrier), each once, no event_id missing
js_expect() {
  local name=$1 want=$2
  echo "     $name: $(grep '^jscheck:' "$T/$name.out")"
  expect_eq "$name: messages in the stream = engine events + start barrier" "$(js_stat "$name" messages)" "$want"
  expect_eq "$name: no Nats-Msg-Id stored twice" "$(js_stat "$name" dup_ids)" 0
  expect_eq "$name: no event_id stored twice" "$(js_stat "$name" dup_events)" 0
  expect_eq "$name: no event_id missing" "$(js_stat "$name" holes)" 0
  expect_eq "$name: every message has a matching Nats-Msg-Id" \
    "$(( $(js_stat "$name" no_id) + $(js_stat "$name" bad_id) ))" 0
  expect_eq "$name: one event_id run per (worker_id, dp_rank)" "$(js_stat "$name" pairs)" 1
}

# ---- a. nats-server killed for 5 s -----------------------------------------
np=$(daemon_port); p=$(daemon_port 2); mp=$(daemon_port)
start "natsA" nats-server -a 127.0.0.1 -p "$np" -js -sd "$T/jsA"
nspid=$LAST_PID
wait_port "$np" 10 || { bad "nats-server -js did not start"; finish; exit 1; }
cat >"$T/a.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
nats:
  servers: [nats://127.0.0.1:$np]
  reconnect_wait_ms: 100
  reconnect_wait_max_ms: 300
  jetstream:
    enabled: true
    ack_timeout_ms: 1500
metrics:
  listen: 127.0.0.1:$mp
YAML
start_kvbridge kvbA "$T/a.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
kpid=$KVB_PID
expect_eq "a: stream created at start" "$(count_log "$T/kvbA.log" "created stream $STREAM")" 1
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
  --batches 12000 --rate 2000 --seed 31 --wait-subscribers 800 --linger 8000 \
  --record "$T/recA" 2>"$T/simA.log" &
spid=$!; PIDS+=("$spid")
# under load first (about 1.5 s of it), then the outage: it lasts until
# kvbridge's ack window filled and it paused reading (what case a is about)
wait_published "$mp" 8000 60 || bad "a: kvbridge did not publish 8000 router events: $(js_diag "$mp")"
signal_pid "$nspid" KILL 5
expect_eq "a: nats-server killed" "$RC" 137
wait_log "$T/kvbA.log" "pausing the engine streams" 30 \
  || echo "     a: no pause in 30 s after the kill: $(js_diag "$mp")"
start "natsA2" nats-server -a 127.0.0.1 -p "$np" -js -sd "$T/jsA"
nspid=$LAST_PID
wait_port "$np" 10 || bad "a: nats-server did not come back"
wait_pid "$spid" 60
wantA=$(rec_counts "$T/recA" all)
settle "$mp" "$(( $(field events "$wantA") + 1 ))" || true
for m in acks_total duplicates_total resends_total publish_errors_total \
         'ack_failures_total{reason="timeout"}' 'ack_failures_total{reason="no_responders"}'; do
  printf '     a: kvbridge_jetstream_%s %s\n' "$m" "$(metric "$mp" "kvbridge_jetstream_$m")"
done
expect_ge "a: kvbridge paused reading while the window was full" \
  "$(count_log "$T/kvbA.log" "pausing the engine streams")" 1
# what was in flight when the server died is taken back and sent again (none,
# when the kill fell between two bursts: a loaded machine)
# (or, when a later event of its pair went out before, given up and the
# pair repaired: counted in publish_errors_total, the stream refusing none)
taken=$(sed -n 's/.*JetStream: \([0-9]*\) router event(s) without an ack.*/\1/p' "$T/kvbA.log" | awk '{ n += $1 } END { print n + 0 }')
given_up=$(metric "$mp" kvbridge_jetstream_publish_errors_total)
found=$(sed -n 's/.*without an ack .*: \([0-9]*\) found stored.*/\1/p' "$T/kvbA.log" | awk '{ n += $1 } END { print n + 0 }')
if [ "$taken" -gt 0 ]; then
  echo "     a: $taken without an ack taken back: $found found stored, $given_up given up for order"
  expect_ge "a: publishes without an ack found stored, sent again, or given up for order" \
    "$(( $(metric "$mp" kvbridge_jetstream_resends_total) + given_up + found ))" "$taken"
else
  ok "a: nothing was in flight when the server died (nothing to send again)"
fi
expect_eq "a: nothing refused by the stream" "$(count_log "$T/kvbA.log" "JetStream refused a router event")" 0
expect_eq "a: no publish refused (window full)" "$(metric "$mp" kvbridge_nats_publish_errors_total)" 0
repairs=$(count_log "$T/kvbA.log" "lost on the NATS side")
if [ "$given_up" -gt 0 ]; then
  expect_ge "a: $given_up given up for order: the pair repaired" "$repairs" 1
else
  expect_eq "a: no NATS-side barrier" "$repairs" 0
fi
signal_pid "$kpid" TERM 15
expect_eq "a: kvbridge exit code" "$RC" 0
"$T/js_check" --server "nats://127.0.0.1:$np" --stream "$STREAM" --dump "$T/a.jsonl" >"$T/a.out" 2>"$T/a.err" \
  || bad_log "a: js_check failed" "$T/a.err"
echo "     a: engine: $wantA"
if [ "$repairs" = 0 ]; then
  js_expect a "$(( $(field events "$wantA") + 1 ))"
  expect_eq "a: the start barrier only" "$(js_stat a cleared)" "$(( $(field cleared "$wantA") + 1 ))"
else # the repair: its barrier and the pair's resident blocks, after the rest
  echo "     a: $(grep '^jscheck:' "$T/a.out")"
  expect_ge "a: messages in the stream >= engine events + start barrier + repair" \
    "$(js_stat a messages)" "$(( $(field events "$wantA") + 2 ))"
  for k in dup_ids dup_events; do expect_eq "a: $k" "$(js_stat a "$k")" 0; done
  expect_eq "a: event_ids missing = those given up (before the repair)" "$(js_stat a holes)" "$given_up"
  expect_eq "a: the start barrier and the repair's" "$(js_stat a cleared)" "$(( $(field cleared "$wantA") + 1 + repairs ))"
fi
expect_eq "a: stored out of order (a resend after later events of its pair)" "$(js_stat a reorders)" 0
# a consumer applying the stream in order ends with the engine's index
ip=$(daemon_port)
start "nats-indexA" nats-server -a 127.0.0.1 -p "$ip"
ipid_nats=$LAST_PID
wait_port "$ip" 10 || bad "a: the index nats-server did not start"
if start_kvtail indexA "$ip" --quiet --check --index --expect-record "$T/recA" --timeout 5000; then
  tpid=$TAIL_PID
  "$BIN/kvtail" --server "nats://127.0.0.1:$ip" --publish "$T/a.jsonl" >"$T/republishA.log" 2>&1 \
    || bad_log "a: republishing the stream failed" "$T/republishA.log"
  wait_pid "$tpid" 60
  echo "     a: index from the stream: $(grep '^kvtail: messages=' "$T/indexA.log" | tail -1)"
  expect_eq "a: index from the stream vs engine: wrong" "$(tail_stat indexA wrong)" 0
  expect_eq "a: index from the stream vs engine: missing" "$(tail_stat indexA missing)" 0
else
  bad "a: kvtail (index) not ready"
fi
signal_pid "$ipid_nats" TERM 10
signal_pid "$nspid" TERM 10

# ---- b. kvbridge killed, restarted with state.dir --------------------------
np=$(daemon_port); p=$(daemon_port 2); mp=$(daemon_port)
start "natsB" nats-server -a 127.0.0.1 -p "$np" -js -sd "$T/jsB"
nspid=$LAST_PID
wait_port "$np" 10 || { bad "nats-server -js did not start"; finish; exit 1; }
mkdir -p "$T/stateB"
cat >"$T/b.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
nats:
  servers: [nats://127.0.0.1:$np]
  jetstream:
    enabled: true
metrics:
  listen: 127.0.0.1:$mp
state:
  dir: $T/stateB
YAML
start_kvbridge kvbB1 "$T/b.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
k1=$KVB_PID
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
  --batches 16000 --rate 2000 --seed 32 --wait-subscribers 800 --linger 5000 \
  --mark-after 8000 --mark-file "$T/markB" --record "$T/recB" 2>"$T/simB.log" &
spid=$!; PIDS+=("$spid")
# killed under load once a state past seq 1000 was saved; restarted once the engine is at batch 8000: a gap of thousands
# of batches for the replay, events published after the save to send again
wait_published "$mp" 4500 60 || bad "b: kvbridge did not publish 4500 router events"
wait_state_stream() { # DIR [SECONDS]: until DIR/kvbridge.state has a stream past seq 1000
  local end=$((SECONDS + ${2:-20}))
  until [ "$(awk '$1 == "stream" { print $4 }' "$1/kvbridge.state" 2>/dev/null)" -ge 1000 ] 2>/dev/null; do
    [ $SECONDS -ge $end ] && return 1; sleep 0.1
  done
}
wait_state_stream "$T/stateB" 20 || echo "     b: no saved stream in 20 s"
signal_pid "$k1" KILL 5
expect_eq "b: kvbridge killed" "$RC" 137
saved=$(awk '$1 == "stream" { print $4 }' "$T/stateB/kvbridge.state" 2>/dev/null)
[ -n "$saved" ] && ok "b: state saved (seq $saved)" || bad "b: no state file"
wait_file "$T/markB" 30 || echo "     b: kvsim did not reach batch 8000 in 30 s"
start_kvbridge kvbB2 "$T/b.yaml" || { bad "kvbridge did not restart"; finish; exit 1; }
k2=$KVB_PID
# logged when the stream's first batch comes (a busy machine: not at once)
wait_log "$T/kvbB2.log" "resuming after seq $saved" 20 || true
expect_eq "b: restart resumes" "$(count_log "$T/kvbB2.log" "resuming after seq $saved")" 1
wait_pid "$spid" 40
wantB=$(rec_counts "$T/recB" all)
# (the second run publishes what the first had not saved: js_check below
# waits until the stream holds everything).  Wait until kvbridge has read the
# engine's last batch (it may still be working through its queue: a busy
# machine) and JetStream acknowledged everything: a SIGTERM drops what is
# still queued unread, and with no later batch nothing would show the gap.
last="kvbridge_source_last_seq{source=\"tcp://127.0.0.1:$p\",topic=\"\"}"
end=$((SECONDS + 40))
until { [ "$(metric "$mp" "$last")" = 15999 ] && [ "$(metric "$mp" kvbridge_jetstream_pending)" = 0 ]; } ||
  [ $SECONDS -ge $end ]; do sleep 0.2; done
expect_eq "b: kvbridge read the engine's last batch" "$(metric "$mp" "$last")" 15999
dupsB=$(metric "$mp" kvbridge_jetstream_duplicates_total)
echo "     b: events published again after the restart, dropped by the duplicate window: $dupsB"
expect_ge "b: the stream dropped the re-sent events" "$dupsB" 1
expect_eq "b: no publish refused (the replay's events fit)" \
  "$(metric "$mp" kvbridge_nats_publish_errors_total)" 0
signal_pid "$k2" TERM 15
expect_eq "b: kvbridge exit code" "$RC" 0
"$T/js_check" --server "nats://127.0.0.1:$np" --stream "$STREAM" --wait-msgs "$(( $(field events "$wantB") + 1 ))" \
  --wait-ms 20000 >"$T/b.out" 2>"$T/b.err" \
  || bad_log "b: js_check failed" "$T/b.err"
echo "     b: engine: $wantB"
js_expect b "$(( $(field events "$wantB") + 1 ))"
expect_eq "b: the first run's start barrier only" "$(js_stat b cleared)" "$(( $(field cleared "$wantB") + 1 ))"
expect_eq "b: one epoch (restored with the counter)" "$(js_stat b epochs)" 1
expect_eq "b: nothing out of order" "$(js_stat b reorders)" 0

# ---- c. stream creation and refusals ----------------------------------------
p=$(daemon_port 2); mpc=$(daemon_port)
cat >"$T/c.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
nats:
  servers: [nats://127.0.0.1:$np]
  namespace: test
  connect_timeout_ms: 3000
  jetstream:
    enabled: true
    stream: "kv-{namespace}-{worker_id}"
    subject: "kv.{namespace}.events"
    retention: workqueue
    max_age_s: 600
    replicas: 1
    duplicate_window_s: 60
metrics:
  listen: 127.0.0.1:$mpc
YAML
start_kvbridge kvbC "$T/c.yaml" || { bad "c: kvbridge did not start"; finish; exit 1; }
kc=$KVB_PID
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --batches 50 --rate 500 --seed 33 \
  --wait-subscribers 800 --linger 300 --record "$T/recC" 2>"$T/simC.log"
# a SIGTERM drops what is still queued unread: first kvbridge reads the last batch
lastc="kvbridge_source_last_seq{source=\"tcp://127.0.0.1:$p\",topic=\"\"}"
end=$((SECONDS + 20))
until [ "$(metric "$mpc" "$lastc")" = 49 ] || [ $SECONDS -ge $end ]; do sleep 0.1; done
expect_eq "c: kvbridge read the engine's last batch" "$(metric "$mpc" "$lastc")" 49
signal_pid "$kc" TERM 15
expect_eq "c: kvbridge exit code" "$RC" 0
"$T/js_check" --server "nats://127.0.0.1:$np" --stream kv-test-7 >"$T/c.out" 2>"$T/c.err" \
  || bad_log "c: js_check failed" "$T/c.err"
echo "     c: $(grep '^stream:' "$T/c.out")"
expect_eq "c: subject" "$(st_stat c subjects)" "kv.test.events"
expect_eq "c: retention" "$(st_stat c retention)" workqueue
expect_eq "c: max_age_s" "$(st_stat c max_age_s)" 600
expect_eq "c: replicas" "$(st_stat c replicas)" 1
expect_eq "c: duplicate window" "$(st_stat c duplicates_s)" 60
wantC=$(rec_counts "$T/recC" all)
js_expect c "$(( $(field events "$wantC") + 1 ))"

# the stream exists (the subject of case b) but does not take this subject
# (the runs below: no metrics listener)
sed -i -e "s/listen: 127.0.0.1:$mpc/listen: \"\"/" "$T/c.yaml"
sed -e "s/stream: \"kv-{namespace}-{worker_id}\"/stream: $STREAM/" "$T/c.yaml" >"$T/c2.yaml"
"$BIN/kvbridge" -c "$T/c2.yaml" >"$T/kvbC2.log" 2>&1 &
wait_pid $! 15
expect_eq "c: a stream without the subject: exit 69" "$RC" 69
expect_eq "c: ... and says why" "$(count_log "$T/kvbC2.log" "exists but does not take the subject kv.test.events")" 1
# missing, and create: false
sed -e 's/stream: "kv-{namespace}-{worker_id}"/stream: nope/' -e 's/retention: workqueue/create: false/' \
  "$T/c.yaml" >"$T/c3.yaml"
"$BIN/kvbridge" -c "$T/c3.yaml" >"$T/kvbC3.log" 2>&1 &
wait_pid $! 15
expect_eq "c: a missing stream with create: false: exit 69" "$RC" 69
expect_eq "c: ... and says why" "$(count_log "$T/kvbC3.log" "stream nope does not exist")" 1
signal_pid "$nspid" TERM 10
# no JetStream on the server at all
np2=$(daemon_port)
start_nats "$np2" || bad "c: nats-server (no JetStream) did not start"
nspid=$NATS_PID
sed -e "s/127.0.0.1:$np]/127.0.0.1:$np2]/" "$T/c.yaml" >"$T/c4.yaml"
"$BIN/kvbridge" -c "$T/c4.yaml" >"$T/kvbC4.log" 2>&1 &
wait_pid $! 15
expect_eq "c: no JetStream on the server: exit 69" "$RC" 69
expect_eq "c: ... and says why" "$(count_log "$T/kvbC4.log" "JetStream is not available")" 1
signal_pid "$nspid" TERM 10
finish
