#!/usr/bin/env bash
# make bench: end-to-end benchmark of kvbridge against a raw forwarder.
#
#   engine (bench-pub) --zmq--> kvbridge | forwarder --nats--> nats-server --> count-sub
#
# Everything on 127.0.0.1, free ports, processes started and stopped by PID,
# every wait bounded.  The batches are kvsim's own (--workload decode |
# prefill | realistic, --rate 0 --lossless), captured once at start (capture.c)
# and replayed by bench-pub, so that generating them costs nothing during a
# measurement (kvsim at full speed would take one of the two cores; it has no
# option to emit pre-encoded payloads or send timestamps).
#
# Per mix:
#   tput    max rate, closed loop (at most 4096 batches in flight), 1 s
#           warm-up + DUR seconds: batches/s, events/s, CPU us per engine event
#           (utime+stime of the bridge from /proc/PID/stat), max RSS (VmHWM);
#           REPS times, alternating kvbridge and baseline: medians (the
#           machine is shared, single runs swing by 2x)
#   lat     2000 batches/s, 0.5 s warm-up + LAT_DUR seconds: p50/p99/p99.9
#           from send to the receive of the batch's last router event (matched
#           by order after the start barrier); REPS times alternated: medians
#           (one stall of the machine would otherwise set a run's p99)
#   cpu1k   1000 batches/s: CPU of the bridge in % of one core
# for kvbridge and for the baseline forwarder (tests/bench/forwarder.c).
# One table on stdout and in $B/bench/results.txt (raw result lines in
# $B/bench/raw.txt).  Environment: DUR (default 3), REPS (3), LAT_DUR (2),
# CPU_DUR (4), MIXES ("decode prefill realistic").
# Extra row (decode only; WHATIF=0 skips it): the baseline forwarder with
# nats.c's SendAsap (each publish written to the socket at once, no flusher
# thread and its ~1 ms coalescing), next to kvbridge, which writes what each
# turn of its loop published with one send() (nats.c in event-loop mode).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DUR=${DUR:-3}
REPS=${REPS:-3}
LAT_DUR=${LAT_DUR:-2}
CPU_DUR=${CPU_DUR:-4}
MIXES=${MIXES:-decode prefill realistic}
WHATIF=${WHATIF:-1}
need kvbridge kvsim bench/bench-pub bench/count-sub bench/forwarder bench/capture
command -v nats-server >/dev/null || { log "nats-server not installed (make deps)"; exit 2; }

BUSY_BEFORE=$(machine_busy)
start_nats
for mix in $MIXES; do capture_mix "$mix"; done

# ---- one measurement -------------------------------------------------------------
# measure IMPL MIX KIND [REP]: IMPL kvbridge | kvbridge-msgpack (nats.format
# dynamo-msgpack, batched; count-sub --events counts its router events) |
# baseline | baseline-asap, KIND
# tput | lat | cpu1k.  Prints bench-pub's result line (and appends it to
# raw.txt); its label is IMPL/MIX/KIND (#REP when given).
measure() {
  local impl=$1 mix=$2 kind=$3 name=$1.$2.$3${4:+.$4} zport rc=0 line args label=$1/$2/$3${4:+#$4}
  zport=$(free_port)
  # receive times are needed for latency only (rate runs)
  local cap
  cap=$([ "$kind" = tput ] && echo 1 || echo 1000000)
  if [ "$impl" = kvbridge-msgpack ]; then
    start_sub "$name" "$cap" "$MP_SUBJECT" --events || return 1
  else
    start_sub "$name" "$cap" || return 1
  fi
  case $impl in
    kvbridge) start_kvbridge "$name" "$zport" || return 1 ;;
    kvbridge-msgpack) start_kvbridge "$name" "$zport" dynamo-msgpack || return 1 ;;
    baseline) start_forwarder "$name" "$zport" || return 1 ;;
    baseline-asap) start_forwarder "$name" "$zport" --send-asap || return 1 ;;
  esac
  case $kind in
    tput) args=(--rate 0 --warmup-s 1 --duration-s "$DUR") ;;
    lat) args=(--rate 2000 --warmup-s 0.5 --duration-s "$LAT_DUR") ;;
    cpu1k) args=(--rate 1000 --warmup-s 0.5 --duration-s "$CPU_DUR") ;;
  esac
  line=$(timeout 120 "$BIN/bench/bench-pub" --endpoint "tcp://127.0.0.1:$zport" --shm "$SHM" \
    --capture "$T/$mix.cap" --max-batches 1000000 \
    --expect "$(case $impl in kvbridge*) echo kvbridge ;; *) echo raw ;; esac)" \
    --watch-pid "$BRIDGE_PID" --own-pids "$SUB_PID,$NATS_PID" --label "$label" "${args[@]}" 2>"$T/pub.$name.log") || rc=$?
  stop "$BRIDGE_PID"
  stop "$SUB_PID"
  rm -f "$SHM"
  if [ -z "$line" ]; then
    log "$label: no result (rc $rc): $(tail -2 "$T/pub.$name.log" | tr '\n' ' ')"
    line="result label=$label failed=1"
  elif [ "$rc" != 0 ]; then
    log "$label: rc $rc: $(tail -2 "$T/pub.$name.log" | tr '\n' ' ')"
    line="$line failed=1"
  fi
  echo "$line" >>"$OUT/raw.txt"
  echo "$line"
}

: >"$OUT/raw.txt"
start=$SECONDS
for mix in $MIXES; do
  # throughput and latency: kvbridge and baseline alternately, REPS times
  # each (the table takes medians, and the median of the pairwise ratios)
  for kind in tput lat; do
    for rep in $(seq "$REPS"); do
      for impl in kvbridge kvbridge-msgpack baseline; do
        log "$mix: $impl $kind ($rep/$REPS)"
        measure "$impl" "$mix" "$kind" "$rep" >/dev/null
      done
    done
  done
  for impl in kvbridge kvbridge-msgpack baseline; do
    log "$mix: $impl cpu1k"
    measure "$impl" "$mix" cpu1k >/dev/null
  done
  if [ "$WHATIF" = 1 ] && [ "$mix" = decode ]; then
    for kind in tput lat cpu1k; do
      log "$mix: baseline-asap $kind"
      measure baseline-asap "$mix" "$kind" >/dev/null
    done
  fi
done
BUSY_AFTER=$(machine_busy)

# ---- the table -------------------------------------------------------------------
{
  echo "kvbridge benchmark $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(version); $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "other load on the machine: before ${BUSY_BEFORE}, after ${BUSY_AFTER}"
  echo "tput: max rate (closed loop, <= 4096 batches in flight), ${DUR} s after 1 s warm-up, median of $REPS alternated runs | latency: send -> subscriber at 2000 batches/s, ${LAT_DUR} s, median of $REPS alternated runs | cpu%: at 1000 batches/s, ${CPU_DUR} s"
  echo "kvbridge-msgpack = nats.format dynamo-msgpack (batched envelopes; rev/s counts the router events in them, msgs/ev = NATS messages per router event)"
  echo "events = engine events in; rev/s = NATS messages out; cpu_us/ev = bridge utime+stime per engine event in the tput runs; ratio = median of batches/s / baseline's, run by run; rss_MB = max VmHWM at 1-2k batches/s, rss_tput = VmHWM in the tput run"
  echo "other% = most CPU (of all CPUs) used by other processes during the row's runs (above ~10 the row is skewed); rq = ms per second the bridge's threads waited for a CPU in the lat runs (~0 on an idle machine)"
  awk -v mixes="$MIXES" -f tests/bench/table.awk "$OUT/raw.txt"
} >"$OUT/results.txt"
cat "$OUT/results.txt"
log "measurements took $((SECONDS - start)) s; raw result lines in $OUT/raw.txt"
