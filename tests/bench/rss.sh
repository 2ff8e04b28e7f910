#!/usr/bin/env bash
# make bench-rss: kvbridge fed EVENTS (default 10M) engine events of kvsim's
# decode mix (1-block store + 1-hash remove per batch) at the highest rate it
# sustains (bench-pub closed loop, at most 4096 batches in flight, so that
# what grows is kvbridge and not a ZMQ queue in front of it), VmRSS sampled
# every second.  Flat: after WARM_S (default 5) seconds, the median of the
# last 5 samples is at most FLAT_KB (default 1024 kB) above the median of the
# first 5 (single samples move by about 1 MB with the messages in flight in
# ZMQ and nats.c buffers; a leak of even 1 byte per event would add 8 MB).
#
# WINDOW=N: at most N batches in flight instead of 4096; a huge N is an open
# loop like kvsim --rate 0 --lossless (the publisher runs several times faster
# than kvbridge converts, the backlog piles up in kvbridge's ZMQ receive queue,
# up to sources[].rcvhwm = 1000000 messages): what an overload costs.
# (kvsim itself is not used as the feed: at exit it gives queued messages only
# 2 s, so most of an open-loop backlog would be dropped.)
#
# Output also in $B/bench/rss.txt.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
EVENTS=${EVENTS:-10000000}
WARM_S=${WARM_S:-5}
FLAT_KB=${FLAT_KB:-1024}
need kvbridge kvsim bench/bench-pub bench/count-sub bench/capture
command -v nats-server >/dev/null || { log "nats-server not installed (make deps)"; exit 2; }

BUSY=$(machine_busy)
start_nats
capture_mix decode
zport=$(free_port)
start_sub rss 1
start_kvbridge rss "$zport"

WINDOW=${WINDOW:-4096}
"$BIN/bench/bench-pub" --endpoint "tcp://127.0.0.1:$zport" --shm "$SHM" --capture "$T/decode.cap" \
  --expect kvbridge --rate 0 --window "$WINDOW" --warmup-s 0 --total-events "$EVENTS" \
  --watch-pid "$BRIDGE_PID" --label kvbridge/decode/rss >"$T/pub.out" 2>"$T/pub.log" &
pub_pid=$!; PIDS+=("$pub_pid")

# one sample per second while the feed runs (bounded: 15 minutes)
: >"$T/rss.series"
t=0
while kill -0 "$pub_pid" 2>/dev/null && [ $t -lt 900 ]; do
  sleep 1; t=$((t + 1))
  kill -0 "$BRIDGE_PID" 2>/dev/null || { log "kvbridge died"; break; }
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$BRIDGE_PID/status" 2>/dev/null || echo 0)
  echo "$t $rss" >>"$T/rss.series"
done
rc=0; wait "$pub_pid" || rc=$?
hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$BRIDGE_PID/status" 2>/dev/null || echo 0)
stop "$BRIDGE_PID"
stop "$SUB_PID"
line=$(cat "$T/pub.out")

{
  echo "kvbridge (commit $(version)) RSS over $(field events "$line") engine events ($(field batches "$line") batches, decode mix, window $WINDOW batches) in $(field secs "$line") s at $(field events_per_s "$line") events/s; other load before: $BUSY"
  echo "VmRSS (kB), one sample per second:"
  awk '{ printf "%s%s", (NR > 1 ? " " : "  "), $2 } END { print "" }' "$T/rss.series"
  awk -v warm="$WARM_S" -v tol="$FLAT_KB" -v hwm="$hwm" -v rc="$rc" '
    function median(a, lo, hi,    i, j, t, n, b) {
      n = 0; for (i = lo; i <= hi; i++) b[++n] = a[i]
      for (i = 2; i <= n; i++) { t = b[i]; for (j = i - 1; j >= 1 && b[j] > t; j--) b[j + 1] = b[j]; b[j + 1] = t }
      return (n % 2) ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2
    }
    $1 > warm { s[++n] = $2; if (min == "" || $2 < min) min = $2; if ($2 > max) max = $2 }
    END {
      if (n < 10) { print "RSS flat: n/a (fewer than 10 samples after warm-up)"; exit }
      k = 5; m1 = median(s, 1, k); m2 = median(s, n - k + 1, n); d = m2 - m1
      printf "after %d s of warm-up (%d samples): first %d kB, last %d kB; min %d, max %d, VmHWM %d kB\n",
        warm, n, s[1], s[n], min, max, hwm
      printf "RSS flat: %s (median of the last %d samples - median of the first %d: %+d kB, limit %d)%s\n",
        ((d <= tol) ? "yes" : "NO"), k, k, d, tol, ((rc != 0) ? "  [feed incomplete: bench-pub rc " rc "]" : "")
    }' "$T/rss.series"
} | tee "$OUT/rss.txt"
[ "$rc" = 0 ] || { log "bench-pub: $(tail -2 "$T/pub.log" | tr '\n' ' ')"; exit 1; }
