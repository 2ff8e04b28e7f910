#!/usr/bin/env bash
# kvbridge SIGKILLed under load (2000 batches/s) and restarted with the same
# state.dir: it resumes after the last saved seq with the saved event_id
# counters, asks the engine to replay what it missed while down, and
# publishes no start barrier.  With core NATS the events published after the
# last save are published again with the same event_ids (JetStream drops
# them by Nats-Msg-Id: test_rel_jetstream.sh): here 0 are lost and every
# duplicate is an exact re-send.
# Then a hybrid model's stream (kvsim --workload hybrid: two KV cache groups,
# one hash in both) cut by a restart with state.dir: the block tracker saved
# with the cursors decides the rest as the uncut stream would (kvtail's
# index equals kvsim's truth): no group-1 remove dropped as an unlearned
# group, no block released while another group still holds it.
source "$(dirname "$0")/lib.sh"

np=$(daemon_port); p=$(daemon_port 2); mp=$(daemon_port)
start_nats "$np" || { bad "nats-server did not start"; finish; exit 1; }
mkdir -p "$T/state"
cat >"$T/k.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
nats:
  servers: [nats://127.0.0.1:$np]
replay:
  timeout_ms: 5000
metrics:
  listen: 127.0.0.1:$mp
state:
  dir: $T/state
YAML
start_kvtail tail "$np" --check --index --expect-record "$T/rec" --timeout 10000 \
  || { bad "kvtail not ready"; finish; exit 1; }
tpid=$TAIL_PID
start_kvbridge kvb1 "$T/k.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
k1=$KVB_PID
expect_eq "first run: no saved state" "$(count_log "$T/kvb1.log" 'no saved state')" 1
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
  --batches 16000 --rate 2000 --seed 21 --wait-subscribers 800 --linger 5000 \
  --mark-after 8000 --mark-file "$T/mark" --record "$T/rec" 2>"$T/sim.log" &
spid=$!; PIDS+=("$spid")
# killed under load once a state past seq 1000 was saved; restarted once
# the engine is at batch 8000 (a gap for replay)
wait_published "$mp" 4500 60 || bad "kvbridge did not publish 4500 router events"
end=$((SECONDS + 20))
until [ "$(awk '$1 == "stream" { print $4 }' "$T/state/kvbridge.state" 2>/dev/null)" -ge 1000 ] 2>/dev/null ||
  [ $SECONDS -ge $end ]; do sleep 0.1; done
signal_pid "$k1" KILL 5
expect_eq "kvbridge killed" "$RC" 137
[ -s "$T/state/kvbridge.state" ] && ok "state file written" || bad "no state file"
saved=$(awk '$1 == "stream" { print $4 }' "$T/state/kvbridge.state")
echo "     saved seq: $saved"
wait_file "$T/mark" 30 || echo "     kvsim did not reach batch 8000 in 30 s"
start_kvbridge kvb2 "$T/k.yaml" || { bad "kvbridge did not restart"; finish; exit 1; }
k2=$KVB_PID
# logged when the stream's first batch comes (a busy machine: not at once)
wait_log "$T/kvb2.log" "resuming after seq $saved" 20 || true
expect_eq "restart resumes" "$(count_log "$T/kvb2.log" "resuming after seq $saved")" 1
wait_pid "$spid" 40
wait_pid "$tpid" 40
expect_eq "kvtail: no event_id hole (0 lost)" "$(tail_stat tail holes)" 0
expect_eq "kvtail: index matches the engine (wrong)" "$(tail_stat tail wrong)" 0
# (orphan stores are possible here: kvtail applies core NATS's re-sent
# duplicates, so a re-sent store may come after its parent's removal)
expect_eq "only the first run's start barrier" "$(tail_stat tail cleared)" \
  "$(( $(field cleared "$(rec_counts "$T/rec" all)") + 1 ))"
expect_ge "replay asked for what was missed while down" "$(count_log "$T/kvb2.log" 'requesting seq')" 1
expect_eq "replay filled it" "$(count_log "$T/kvb2.log" 'not recovered')" 0
want=$(rec_counts "$T/rec" all)
msgs=$(tail_stat tail messages); dups=$(tail_stat tail dups)
echo "     router events: received $msgs, duplicates (re-sent after the last save) $dups"
expect_eq "received - duplicates = engine events + start barrier" "$((msgs - dups))" \
  "$(($(field events "$want") + 1))"
signal_pid "$k2" TERM 15
expect_eq "kvbridge exit code" "$RC" 0
# a clean stop saves the final cursor
last=$(awk '$1 == "stream" { print $4 }' "$T/state/kvbridge.state")
expect_eq "state after a clean stop: the last seq" "$last" 15999

# ---- a hybrid stream across a restart ------------------------------------
p=$(daemon_port 2); mp=$(daemon_port)
mkdir -p "$T/hstate"
cat >"$T/h.yaml" <<YAML
worker_id: 8
block_size: 16
forward_tiers: [device, host_pinned, disk, external]
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
nats:
  servers: [nats://127.0.0.1:$np]
$(kvb_format_yaml)
replay:
  timeout_ms: 5000
metrics:
  listen: 127.0.0.1:$mp
state:
  dir: $T/hstate
YAML
start_kvtail htail "$np" --check --index --index-set --expect-record "$T/hrec" --timeout 10000 \
  || { bad "hybrid: kvtail not ready"; finish; exit 1; }
tpid=$TAIL_PID
start_kvbridge hkvb1 "$T/h.yaml" || { bad "hybrid: kvbridge did not start"; finish; exit 1; }
k1=$KVB_PID
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
  --workload hybrid --batches 3000 --rate 1000 --seed 23 --wait-subscribers 800 \
  --linger 5000 --mark-after 1500 --mark-file "$T/hmark" --record "$T/hrec" 2>"$T/hsim.log" &
spid=$!; PIDS+=("$spid")
wait_file "$T/hmark" 30 || echo "     kvsim did not reach batch 1500 in 30 s"
signal_pid "$k1" TERM 15
expect_eq "hybrid: first kvbridge stopped cleanly" "$RC" 0
expect_ge "hybrid: the tracker was saved with the cursors" \
  "$(grep -c '^copy ' "$T/hstate/kvbridge.state")" 1
expect_ge "hybrid: group kinds saved" "$(grep -c '^kind ' "$T/hstate/kvbridge.state")" 2
start_kvbridge hkvb2 "$T/h.yaml" || { bad "hybrid: kvbridge did not restart"; finish; exit 1; }
k2=$KVB_PID
wait_log "$T/hkvb2.log" "resuming after seq" 20 || true
expect_eq "hybrid: restart resumes" "$(count_log "$T/hkvb2.log" "resuming after seq")" 1
expect_eq "hybrid: the tracker restored" \
  "$(count_log "$T/hkvb2.log" "tracker entries$")" 1
wait_pid "$spid" 40
wait_pid "$tpid" 40
expect_eq "hybrid: kvtail checks pass (exit code)" "$RC" 0
for s in holes dups wrong missing orphans; do
  expect_eq "hybrid: kvtail $s across the restart" "$(tail_stat htail "$s")" 0
done
expect_ge "hybrid: blocks indexed and compared" "$(tail_stat htail indexed)" 20
want=$(rec_counts "$T/hrec" all)
expect_eq "hybrid: published stores = the record's" "$(tail_stat htail stored)" "$(field stored "$want")"
expect_eq "hybrid: published removes = the record's" "$(tail_stat htail removed)" \
  "$(field removed "$want")"
expect_eq "hybrid: only the first run's start barrier" "$(tail_stat htail cleared)" \
  "$(( $(field cleared "$(rec_counts "$T/hrec" all)") + 1 ))"
signal_pid "$k2" TERM 15
expect_eq "hybrid: kvbridge exit code" "$RC" 0
finish
