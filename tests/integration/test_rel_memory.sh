#!/usr/bin/env bash
# Bounded memory under overload, with the default queue sizes: an engine
# publishing 10000 batches/s while NATS is stopped for 12 s (SIGSTOP: still
# connected, reading nothing) must not grow kvbridge past the bound
# kvbridge(8) states (MEMORY):
#   20 MiB + (rcvhwm + H + R) x (B + 2 KiB) + 2 x reconnect_buffer_bytes
# (H: live batches held during a replay, rcvhwm within 10000..100000)
# (B: the mean batch size, here kvsim's bytes / batches; R: the engine's
# replay buffer, kvsim's 10000 as vLLM's).  Before the defaults were bounded
# (rcvhwm 1,000,000, 64 MiB) the same burst took kvbridge to about 300 MB.
# The overflow takes the usual path: the engine drops what the SUB cannot
# queue, kvbridge sees the seq gap once NATS is back, asks the engine's replay
# and publishes a barrier for what the replay buffer no longer holds.  At the
# end kvtail's index matches the engine's (nothing WRONG), event_ids have no
# hole, no duplicate, no reordering.
# kvbridge's peak memory is VmHWM from /proc/PID/status, read before it stops
# (checked against the bound for the normal build only, not under ASan or
# valgrind, whose own memory counts there).  Once the backlog is gone,
# kvbridge gives its memory back: RSS at most 3/4 of the peak.
source "$(dirname "$0")/lib.sh"

RCVHWM=10000 RBUF=16777216 REPLAY=10000 BATCHES=150000 RATE=10000 STOP_BATCHES=120000
np=$(daemon_port); p=$(daemon_port 2); mp=$(daemon_port)
start_nats "$np" || { bad "nats-server did not start"; finish; exit 1; }
NPID=$NATS_PID
# the defaults (no rcvhwm, no reconnect_buffer_bytes in the file)
cat >"$T/kvb.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
nats:
  servers: [nats://127.0.0.1:$np]
metrics:
  listen: 127.0.0.1:$mp
YAML
start_kvtail tail "$np" --quiet --check --index --expect-record "$T/rec" --timeout 15000 \
  || { bad "kvtail not ready"; finish; exit 1; }
TPID=$TAIL_PID
start_kvbridge kvb "$T/kvb.yaml" || { bad_log "kvbridge did not start" "$T/kvb.log"; finish; exit 1; }
KPID=$KVB_PID
hwm_kb() { awk '/^VmHWM:/ { print $2 }' "/proc/$KPID/status" 2>/dev/null || echo 0; }
echo "     kvbridge at start: VmHWM $(hwm_kb) kB"

# the burst: kvsim at RATE batches/s (far more than a stopped NATS takes);
# NATS stopped from its first batch until STOP_BATCHES are out (kvsim writes
# its record as it goes), then the engine goes on at the same rate: the
# batches after the pause are what reveals the gap, as with a real engine
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
  --replay-buffer "$REPLAY" --batches "$BATCHES" --rate "$RATE" --seed 21 \
  --wait-subscribers 1000 --linger 3000 --record "$T/rec" 2>"$T/sim.log" &
SPID=$!
PIDS+=("$SPID")
sleep 0.9   # kvsim waits 1 s for subscribers before its first batch
kill -STOP "$NPID"
t0=$SECONDS
until [ "$(wc -l <"$T/rec" 2>/dev/null || echo 0)" -ge "$STOP_BATCHES" ]; do
  { [ $((SECONDS - t0)) -ge 60 ] || ! kill -0 "$SPID" 2>/dev/null; } && break
  sleep 0.1
done
echo "     NATS stopped for about $((SECONDS - t0)) s"
paused=$(count_log "$T/kvb.log" "pausing the engine streams")
kill -CONT "$NPID"
expect_ge "kvbridge paused reading while NATS was stopped" "$paused" 1

wait_pid "$SPID" 120
expect_eq "kvsim exit code" "$RC" 0
wait_pid "$TPID" 90
TRC=$RC
HWM=$(hwm_kb)
kill -0 "$KPID" 2>/dev/null && ok "kvbridge alive" || bad "kvbridge died"

sent=$(sed -n 's/.*total batches=\([0-9]*\).*/\1/p' "$T/sim.log" | tail -1)
bytes=$(sed -n 's/.*total batches=[0-9]* events=[0-9]* bytes=\([0-9]*\).*/\1/p' "$T/sim.log" | tail -1)
[ -n "$sent" ] && [ "${sent:-0}" -gt 0 ] || { sent=$BATCHES; bytes=$((BATCHES * 2048)); }
B=$((bytes / sent))
BOUND_KB=$(((20 * 1048576 + 2 * RCVHWM * (B + 2048) + REPLAY * (B + 2048) + 2 * RBUF) / 1024))
echo "     burst: $sent batches of $B bytes on average; kvbridge VmHWM $HWM kB, bound $BOUND_KB kB"
if [ "$BIN" = "$ROOT/build" ]; then
  expect_le "kvbridge peak memory (VmHWM, kB) within the documented bound" "$HWM" "$BOUND_KB"
  # the backlog is gone (kvtail has everything): 2 s later kvbridge gives
  # its memory back (malloc_trim), RSS falls from the burst's peak
  wait_log "$T/kvb.log" "backlog gone: [0-9]* KiB of memory returned" 20 \
    || bad_log "kvbridge did not give the backlog's memory back" "$T/kvb.log"
  RSS=$(awk '/^VmRSS:/ { print $2 }' "/proc/$KPID/status" 2>/dev/null || echo 0)
  echo "     after the backlog: RSS $RSS kB (peak $HWM kB)"
  # (measured: without the trim 74652 kB of a 77840 kB peak; with it about
  # 30 MB of 78-86 MB)
  expect_le "kvbridge RSS after the backlog (kB) at most 3/4 of its peak" "$RSS" "$((HWM * 3 / 4))"
else
  # ASan's shadow memory or valgrind's own (make check-asan,
  # check-valgrind-integration) are not kvbridge's: the bound is for the
  # normal build; the rest of the test still runs
  echo "     (KVB_BIN=$BIN is not the normal build: memory bound not checked)"
fi

# the overflow went the usual way: a gap, replay asked, a barrier for the rest
expect_ge "seq gap seen after the pause" "$(count_log "$T/kvb.log" 'seq gap')" 1
expect_ge "replay asked or barrier published" \
  "$(count_log "$T/kvb.log" 'requesting seq\|not recovered\|publishing barrier')" 1
# the index ends right
expect_eq "kvtail exit code (checks and index)" "$TRC" 0
expect_tail_clean tail holes dups bad reorders wrong badtok
expect_ge "barrier(s) published (start + gap)" "$(tail_stat tail cleared)" 1

signal_pid "$KPID" TERM 20
expect_eq "kvbridge exit code" "$RC" 0
finish
