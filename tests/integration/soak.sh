#!/usr/bin/env bash
# soak.sh: kvbridge for SOAK_SECONDS (default 300; make soak-ci: 75) at 1000
# batches/s of kvsim's realistic mix, publishing through JetStream to a
# 3-node nats-server cluster (stream with 3 replicas), while faults come in
# turn:
#   - engine restarts: kvsim runs in SEGMENTS (default 3) processes one after
#     the other on the same ports, each a new engine (seq from 0);
#   - live drops recovered by replay: each segment drops 3 runs of 20 batches
#     live (kvsim --drop-live; its replay buffer keeps them);
#   - SIGHUP reloads (log.stats_interval_s changes);
#   - a NATS server restart (SIGTERM, back on its store) and a JetStream node
#     SIGKILLed and restarted once the stream elected a leader without it;
#     all of them twice (two cycles, see RSS below).
# At the end:
#   - the stream (js_check): 0 stored twice, 0 stored out of order (each
#     pair's events in event_id order: before, 0-23 resends per run landed
#     after later events), and no event_id missing except the publishes
#     given up because a leader change stored later events of their pair
#     first, each pair so concerned repaired (a nats_lost barrier, then its
#     resident blocks);
#   - the final index equals the engine's truth: the stream is replayed in
#     order to a kvtail --check --index --expect-record (the last engine's
#     record: earlier ones ended in restart barriers): wrong=0 missing=0;
#   - kvbridge's RSS and open fds flat: the faults come in two cycles, one per
#     half; the lowest sample over the quiet end of each cycle (from 5 s
#     after its last fault, at least 10 s, at most 60 s or 40% of the half)
#     within 5% (kvbridge gives a backlog's memory back 2 s after it is gone,
#     so RSS is a sawtooth whose floor is what is still in use: a leak raises
#     the floor);
#   - every warning and error kvbridge logged is explained by an injected
#     fault (the patterns below), none left over.
# One summary table; exit 0 only when every row is ok.  Processes are
# stopped by PID (lib.sh).  KEEP_TMP=1 keeps the logs.
source "$(dirname "$0")/lib.sh"

S=${SOAK_SECONDS:-300}
SEG=${SEGMENTS:-3}
RATE=${SOAK_RATE:-1000}
[ "$S" -ge 45 ] || { echo "soak: SOAK_SECONDS must be at least 45"; exit 2; }
echo "soak: $S s at $RATE batches/s, $SEG engine segments"
js_build || { finish; exit 1; }

# ---- the NATS cluster -------------------------------------------------------
js_cluster kvbsoak || { finish; exit 1; }
# stream_leader I: the stream's leader as node I sees it ("none" if it has none)
stream_leader() {
  timeout 15 "$T/js_check" --server "nats://127.0.0.1:${JS_PP[$1]}" --stream "$STREAM" --info 1 \
    >"$T/lead.out" 2>/dev/null || true
  local l; l=$(leader_of lead); echo "${l:-none}"
}
wait_stream_leader() { # wait_stream_leader SECONDS NODE...
  local end=$((SECONDS + $1)) i; shift
  while [ $SECONDS -lt "$end" ]; do
    for i in "$@"; do [ "$(stream_leader "$i")" != none ] && return 0; done
    sleep 0.5
  done
  return 1
}

# ---- kvbridge -----------------------------------------------------------------
p=$(daemon_port 2); mp=$(daemon_port)
kvb_yaml() { # kvb_yaml STATS_INTERVAL
  cat >"$T/k.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$p
    replay_endpoint: tcp://127.0.0.1:$((p + 1))
nats:
  servers: [nats://127.0.0.1:${JS_PP[1]}, nats://127.0.0.1:${JS_PP[2]}, nats://127.0.0.1:${JS_PP[3]}]
  connect_timeout_ms: 30000
  reconnect_wait_ms: 100
  reconnect_wait_max_ms: 500
  jetstream:
    enabled: true
    replicas: 3
    ack_timeout_ms: 2000
metrics:
  listen: 127.0.0.1:$mp
state:
  dir: $T/state
log:
  stats_interval_s: $1
YAML
}
kvb_yaml 10
start_kvbridge kvb "$T/k.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
kpid=$KVB_PID

# ---- samples: RSS (kB) and open fds of kvbridge, every 2 s ----------------------
samp_t0=$SECONDS
(
  t0=$samp_t0
  while kill -0 "$kpid" 2>/dev/null; do
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$kpid/status" 2>/dev/null)
    fds=$(find "/proc/$kpid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    [ -n "$rss" ] && echo "$((SECONDS - t0)) $rss $fds"
    sleep 2
  done
) >"$T/samples" &
PIDS+=("$!")

# ---- the fault schedule (seconds from the start of the load) -------------------
seg_s=$((S / SEG))
# two cycles, one per half of the run, the same faults in each: memory that a
# fault raises to a high-water mark (queues, buffers) is reached in the first
# cycle; growth from the first cycle's quiet end to the second's is a leak
half=$((S / 2))
declare -a FAULTS=()
for c in 0 1; do
  FAULTS+=("$((c * half + half * 10 / 100)) hup" "$((c * half + half * 20 / 100)) nats_restart"
           "$((c * half + half * 35 / 100)) node_kill" "$((c * half + half * 50 / 100)) hup")
done
faults_done=0; hups=0; nats_restarts=0; node_kills=0; node_restart_leader=""
hup_value=10
declare -a FAULT_T0=() FAULT_T1=() # when each fault began and ended (samples' clock)
do_fault() {
  FAULT_T0+=($((SECONDS - samp_t0)))
  case $1 in
    hup)
      hup_value=$(( hup_value == 10 ? 9 : 10 ))
      kvb_yaml "$hup_value"
      local before; before=$(count_log "$T/kvb.log" "reloaded ")
      kill -HUP "$kpid"
      local end=$((SECONDS + 20))
      until [ "$(count_log "$T/kvb.log" "reloaded ")" -gt "$before" ] || [ $SECONDS -ge $end ]; do sleep 0.1; done
      hups=$((hups + 1)) ;;
    nats_restart) # n1: SIGTERM, back on its store once it is gone
      signal_pid "${JS_PID[1]}" TERM 15
      node_start 1 "-again$nats_restarts"
      wait_port "${JS_PP[1]}" 15 || bad "n1 did not come back"
      nats_restarts=$((nats_restarts + 1)) ;;
    node_kill) # n2: SIGKILL; back once the others elected a stream leader (30 s at most)
      signal_pid "${JS_PID[2]}" KILL 5
      if wait_stream_leader 30 1 3; then
        [ -n "$node_restart_leader" ] || node_restart_leader=elected
      else node_restart_leader="none in 30 s"; fi
      node_start 2 "-again$node_kills"
      wait_port "${JS_PP[2]}" 15 || bad "n2 did not come back"
      node_kills=$((node_kills + 1)) ;;
  esac
  FAULT_T1+=($((SECONDS - samp_t0)))
  echo "     t=$((SECONDS - load_t0)) s: $1 done"
}

# ---- the engine segments, with the faults in between ------------------------------
# The quiet end of a cycle, where RSS and fds are measured (below), starts
# QUIET_AFTER_S after its last fault ended and lasts at least MIN_QUIET s.
QUIET_AFTER_S=5 MIN_QUIET=10
quiet_from() { echo $(( FAULT_T1[$1] + QUIET_AFTER_S )); } # quiet_from FAULT_INDEX (samples' clock)
# fault_due [ON_TIME]: the next fault's time has come (ON_TIME 0: it is late
# anyway); the second cycle begins only after the first one's quiet end
fault_due() {
  local at; read -r at _ <<<"${FAULTS[$faults_done]}"
  [ "${1:-1}" = 0 ] || [ $((SECONDS - load_t0)) -ge "$at" ] || return 1
  [ "$faults_done" != $(( ${#FAULTS[@]} / 2 )) ] ||
    [ $((SECONDS - samp_t0)) -ge $(( $(quiet_from $((faults_done - 1))) + MIN_QUIET )) ]
}
load_t0=$SECONDS
for k in $(seq 1 "$SEG"); do
  n=$((seg_s * RATE))
  drops="$((n / 4))-$((n / 4 + 19)),$((n / 2))-$((n / 2 + 19)),$((n * 3 / 4))-$((n * 3 / 4 + 19))"
  "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$p" --replay "tcp://127.0.0.1:$((p + 1))" \
    --batches "$n" --rate "$RATE" --seed $((60 + k)) --wait-subscribers 300 --linger 3000 \
    --drop-live "$drops" --record "$T/rec.$k" 2>"$T/sim.$k.log" &
  spid=$!; PIDS+=("$spid")
  while kill -0 "$spid" 2>/dev/null; do
    if [ "$faults_done" -lt "${#FAULTS[@]}" ] && fault_due; then
      read -r _ what <<<"${FAULTS[$faults_done]}"
      do_fault "$what"; faults_done=$((faults_done + 1)); continue
    fi
    sleep 0.2
  done
  wait_pid "$spid" 5
  [ "$RC" = 0 ] || bad "kvsim segment $k exit code $RC"
  echo "     t=$((SECONDS - load_t0)) s: engine segment $k done ($n batches)"
done
while [ "$faults_done" -lt "${#FAULTS[@]}" ]; do # a slow run: the faults left
  fault_due 0 || { sleep 0.2; continue; }
  read -r _ what <<<"${FAULTS[$faults_done]}"; do_fault "$what"; faults_done=$((faults_done + 1))
done
load_s=$((SECONDS - load_t0))
# the second cycle's quiet end, as long as the first one's at least
while [ $((SECONDS - samp_t0)) -lt $(( $(quiet_from $((${#FAULTS[@]} - 1))) + MIN_QUIET )) ]; do sleep 0.5; done

# ---- settle, stop ------------------------------------------------------------
want_total=0
for k in $(seq 1 "$SEG"); do want_total=$((want_total + $(field events "$(rec_counts "$T/rec.$k" all)"))); done
# everything the engines sent, plus barriers (start, restarts): at least that many
SETTLE_S=120 settle "$mp" "$want_total" || true
pending=$(metric "$mp" kvbridge_jetstream_pending)
stalls=$(metric "$mp" kvbridge_jetstream_stalls_total)
resends=$(metric "$mp" kvbridge_jetstream_resends_total)
replays_filled=$(metric "$mp" kvbridge_replays_filled_total)
replays_failed=$(metric "$mp" kvbridge_replays_failed_total)
restarts=$(metric "$mp" kvbridge_engine_restarts_total)
bar_gap=$(metric "$mp" 'kvbridge_barriers_total{cause="gap"}')
bar_nats=$(metric "$mp" 'kvbridge_barriers_total{cause="nats_lost"}')
# publishes without an ack that could not be sent again in order (a later
# event of their pair was stored first: a leader change dropped them): given
# up, each an event_id missing before its pair's repair (a nats_lost barrier,
# then the pair's resident blocks); the stream refuses none here
given_up=$(metric "$mp" kvbridge_jetstream_publish_errors_total)
save_fail=$(metric "$mp" kvbridge_state_save_failures_total)
stop_t=$SECONDS
signal_pid "$kpid" TERM 20
kvb_rc=$RC

# ---- the stream, then the index from it ---------------------------------------
up=1; for i in 1 3; do kill -0 "${JS_PID[$i]}" 2>/dev/null && up=$i && break; done
"$T/js_check" --server "nats://127.0.0.1:${JS_PP[$up]}" --stream "$STREAM" --dump "$T/stream.jsonl" \
  >"$T/js.out" 2>"$T/js.err" || bad_log "js_check failed" "$T/js.err"
ip=$(daemon_port)
start "nats-index" nats-server -a 127.0.0.1 -p "$ip"
wait_port "$ip" 10 || bad "the index nats-server did not start"
start_kvtail index "$ip" --quiet --check --index --expect-record "$T/rec.$SEG" --timeout 5000 \
  || bad "kvtail (index) not ready"
ipid=$TAIL_PID
"$BIN/kvtail" --server "nats://127.0.0.1:$ip" --publish "$T/stream.jsonl" >"$T/republish.log" 2>&1 \
  || bad_log "republishing the stream failed" "$T/republish.log"
wait_pid "$ipid" 120

# ---- RSS and fds: the quiet end of each cycle ----------------------------------
# Each window starts QUIET_AFTER_S after its cycle's last fault ended (the
# backlog read back, its memory given back: kvbridge trims 2 s after a
# backlog) and ends where the next cycle's first fault begins, or where
# kvbridge was stopped; its last WIN seconds count (sample times: seconds
# from samp_t0).
win=$(( half * 4 / 10 < 60 ? half * 4 / 10 : 60 ))
nf=$(( ${#FAULTS[@]} / 2 ))
a1=$(quiet_from $((nf - 1))); e1=${FAULT_T0[nf]}
a2=$(quiet_from $((2 * nf - 1))); e2=$((stop_t - samp_t0))
lowest() { sort -n | awk 'NR == 1 { v = $1 } END { print NR ? v : 0 }'; }
window() { # window FROM TO COLUMN: the lowest COLUMN over the last WIN seconds of FROM..TO
  local a=$(( $2 - win > $1 ? $2 - win : $1 ))
  awk -v a="$a" -v b="$2" -v c="$3" '$1 >= a && $1 <= b { print $c }' "$T/samples" | lowest
}
rss1=$(window "$a1" "$e1" 2); rss2=$(window "$a2" "$e2" 2)
fd1=$(window "$a1" "$e1" 3); fd2=$(window "$a2" "$e2" 3)
pct() { awk -v x="$1" -v y="$2" 'BEGIN { if (x <= 0) print 999; else { d = (y - x) * 100 / x; printf "%.1f", d < 0 ? -d : d } }'; }
flat() { awk -v d="$1" 'BEGIN { exit !(d <= 5) }'; }

# ---- warnings: each explained by an injected fault -----------------------------
explained='disconnected from NATS|reconnected to NATS|JetStream stores none of our publishes|JetStream still stores none|unacknowledged, 3/4 of nats.jetstream.max_pending|pausing the engine streams|JetStream: stream .*: (Timeout|No responders|.*temporarily unavailable)|seq gap: [0-9]+ missing before|engine connection dropped|engine reconnected and seq|the engine no longer holds our last seq|the engine.s batch at our last seq differs|seq went back|engine restart|similar messages suppressed|not sent again, so that the stream keeps the pair.s order|were lost on the NATS side: publishing (their )?barriers|cannot read back what the stream stored'
grep -E '\] (warn|error):' "$T/kvb.log" | grep -vE "$explained" >"$T/unexplained" || true
nwarn=$(grep -cE '\] (warn|error):' "$T/kvb.log" || true)
nunexp=$(wc -l <"$T/unexplained")

# ---- the table -----------------------------------------------------------------
row() { # row WHAT VALUE WANT OK(0|1)
  printf '  %-44s %-22s %-16s %s\n' "$1" "$2" "$3" "$([ "$4" = 1 ] && echo ok || echo FAIL)"
  if [ "$4" = 1 ]; then PASS=$((PASS + 1)); else FAIL=$((FAIL + 1)); fi
}
holes=$(js_stat js holes); dups=$(js_stat js dup_ids); dupe=$(js_stat js dup_events)
msgs=$(js_stat js messages)
echo
echo "soak summary ($load_s s of load, $S s planned, load average $(cut -d' ' -f1-3 /proc/loadavg))"
printf '  %-44s %-22s %-16s %s\n' "check" "value" "want" "result"
row "engine segments (restarts between them)" "$SEG ($restarts restarts seen)" ">= $((SEG - 1))" "$( { [ "$restarts" -ge $((SEG - 1)) ]; } && echo 1 || echo 0)"
row "SIGHUP reloads" "$hups ($(count_log "$T/kvb.log" 'reloaded ') logged)" "4" "$( { [ "$(count_log "$T/kvb.log" 'reloaded ')" = 4 ]; } && echo 1 || echo 0)"
row "NATS server restarts (SIGTERM)" "$nats_restarts" "2" "$( { [ "$nats_restarts" = 2 ]; } && echo 1 || echo 0)"
row "JetStream node SIGKILLed and restarted" "$node_kills (leader: $node_restart_leader)" "2, elected" "$( { [ "$node_kills" = 2 ] && [ "$node_restart_leader" = elected ]; } && echo 1 || echo 0)"
row "live drops filled by replay" "$replays_filled filled, $replays_failed failed" ">= $((SEG * 3)), 0" "$( { [ "$replays_filled" -ge $((SEG * 3)) ] && [ "$replays_failed" = 0 ]; } && echo 1 || echo 0)"
row "gap / nats_lost barriers (repairs)" "$bar_gap / $bar_nats" "0 / 0 (1+ if given up)" "$( { [ "$bar_gap" = 0 ] && { [ "$bar_nats" = 0 ] || [ "$given_up" -gt 0 ]; } && { [ "$given_up" = 0 ] || [ "$bar_nats" -ge 1 ]; }; } && echo 1 || echo 0)"
row "JetStream stalls (recovered), resends" "$stalls, $resends" "-" 1
row "unacknowledged at the end" "$pending" "0" "$( { [ "$pending" = 0 ]; } && echo 1 || echo 0)"
row "stream: router events" "$msgs" ">= $want_total" "$( { [ "$msgs" -ge "$want_total" ]; } && echo 1 || echo 0)"
row "stream: event_ids missing (given up, repaired)" "$holes ($given_up given up)" "= given up" "$( { [ "$holes" = "$given_up" ]; } && echo 1 || echo 0)"
row "stream: stored twice (Nats-Msg-Id / event_id)" "$dups / $dupe" "0 / 0" "$( { [ "$dups" = 0 ] && [ "$dupe" = 0 ]; } && echo 1 || echo 0)"
row "index from the stream vs engine: wrong" "$(tail_stat index wrong)" "0" "$( { [ "$(tail_stat index wrong)" = 0 ]; } && echo 1 || echo 0)"
row "index from the stream vs engine: missing" "$(tail_stat index missing)" "0" "$( { [ "$(tail_stat index missing)" = 0 ]; } && echo 1 || echo 0)"
# kvtail counts a hole when an event_id is skipped (given up, before its
# pair's repair), and late ids apart (stored out of order: none may be)
hole_ids=$(sed -n 's/.*holes=[0-9]* (\([0-9]*\) ids).*/\1/p' "$T/index.err" | tail -1)
row "index: ids skipped (then late), dups, bad hash" "${hole_ids:-0} ($(tail_stat index reorders) late), $(tail_stat index dups), $(tail_stat index badtok)" \
  "given up (0 late), 0, 0" \
  "$( { [ "${hole_ids:-0}" = "$given_up" ] && [ "$(tail_stat index reorders)" = 0 ] && [ "$(tail_stat index dups)" = 0 ] && [ "$(tail_stat index badtok)" = 0 ]; } && echo 1 || echo 0)"
row "stream: stored out of order (resends)" "$(js_stat js reorders)" "0" "$( { [ "$(js_stat js reorders)" = 0 ]; } && echo 1 || echo 0)"
d=$(pct "$rss1" "$rss2"); row "RSS kB, quiet end of cycle 1 vs 2 (lowest)" "$rss1 -> $rss2 ($d%)" "within 5%" "$( { flat "$d"; } && echo 1 || echo 0)"
d=$(pct "$fd1" "$fd2"); row "open fds, quiet end of cycle 1 vs 2 (lowest)" "$fd1 -> $fd2 ($d%)" "within 5%" "$( { flat "$d"; } && echo 1 || echo 0)"
row "state.dir save failures" "$save_fail" "0" "$( { [ "$save_fail" = 0 ]; } && echo 1 || echo 0)"
row "warnings/errors logged, unexplained" "$nwarn, $nunexp" "-, 0" "$( { [ "$nunexp" = 0 ]; } && echo 1 || echo 0)"
row "kvbridge exit code (SIGTERM)" "$kvb_rc" "0" "$( { [ "$kvb_rc" = 0 ]; } && echo 1 || echo 0)"
if [ "$nunexp" -gt 0 ]; then echo "  unexplained:"; head -n 10 "$T/unexplained" | sed 's/^/    /'; fi
for i in 1 2 3; do signal_pid "${JS_PID[$i]}" TERM 10; done
echo "soak: $PASS ok, $FAIL failed"
[ "$FAIL" = 0 ]
