#!/usr/bin/env bash
# make bench-query: what serving a 1M-block dump costs the live stream.
# Two engines: rank 0 (kvsim prefill, 32-block stores) fills the residency
# mirror to BLOCKS (default 1000000) blocks; rank 1 (kvsim decode, RATE
# batches/s, default 1000: a 1-block store and a 1-hash remove each) is the
# live stream.  kvbridge's publish delay
# (engine timestamp to publish, kvbridge_publish_delay_seconds) is read
# from /metrics over DUR seconds (default 8) twice: quiet, then while
# GET /v1/dump of rank 0 is served back to back.  Prints p50/p99/p999 of
# each phase (interpolated in the histogram's buckets) and the dumps' size
# and time.  Output also in $B/bench/query_dump.txt.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BLOCKS=${BLOCKS:-1000000}
RATE=${RATE:-1000}
DUR=${DUR:-8}
need kvbridge kvsim
command -v nats-server >/dev/null || { log "nats-server not installed (make deps)"; exit 2; }
command -v curl >/dev/null || { log "curl not installed"; exit 2; }

start_nats
# the live engine is kvsim --dp-size 2 on base, base+1: kvbridge reads only
# rank 1 (base+1), so that rank 0's mirror stays the filled one
e0=$(free_port); mp=$(free_port)
for _ in $(seq 50); do
  base=$(free_port); (exec 3<>/dev/tcp/127.0.0.1/$((base + 1))) 2>/dev/null || break
done
e1=$((base + 1))
cat >"$T/k.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$e0
    dp_rank: 0
  - endpoint: tcp://127.0.0.1:$e1
    dp_rank: 1
nats:
  servers: [$NATS_URL]
metrics:
  listen: "127.0.0.1:$mp"
limits:
  max_resident_blocks: $((BLOCKS + 100000))
query:
  subject: ""
YAML
"$BIN/kvbridge" -c "$T/k.yaml" >"$T/kvb.log" 2>&1 &
KVB=$!; PIDS+=("$KVB")
wait_log "$T/kvb.log" "running:" 15 || { log "kvbridge did not start"; exit 1; }

log "filling the mirror with $BLOCKS blocks"
"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$e0" --workload prefill --batches $((BLOCKS / 32)) \
  --rate 20000 --wait-subscribers 2000 --linger 500 >"$T/fill.log" 2>&1
gauge() { curl -s "http://127.0.0.1:$mp/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
end=$((SECONDS + 60))
until [ "$(gauge 'kvbridge_mirror_resident_blocks{tier="device"}')" -ge $((BLOCKS / 32 * 32)) ]; do
  [ $SECONDS -ge $end ] && { log "mirror not filled: $(gauge 'kvbridge_mirror_resident_blocks{tier="device"}')"; exit 1; }
  sleep 0.5
done
log "mirror: $(gauge 'kvbridge_mirror_resident_blocks{tier="device"}') blocks, $(gauge kvbridge_mirror_bytes) bytes"

"$BIN/kvsim" --endpoint "tcp://127.0.0.1:$base" --dp-size 2 --workload decode --rate "$RATE" --seed 2 \
  --wait-subscribers 2000 >"$T/live.log" 2>&1 &
SIM=$!; PIDS+=("$SIM")
sleep 3 # the live stream settles

# hist: the publish delay histogram's cumulative buckets, "le count" lines
hist() {
  curl -s "http://127.0.0.1:$mp/metrics" |
    awk '/^kvbridge_publish_delay_seconds_bucket/ { match($1, /le="[^"]*"/); le = substr($1, RSTART + 4, RLENGTH - 5); print le, $2 }'
}
# quantiles BEFORE AFTER: p50 p99 p999 of the observations in between (ms)
quantiles() {
  join <(sort "$1") <(sort "$2") | sort -g | awk '
    { le[NR] = $1; c[NR] = $3 - $2 } END {
      n = c[NR]; printf "n=%d", n
      split("0.5 0.99 0.999", q, " "); split("50 99 999", name, " ")
      for (k = 1; k <= 3; k++) {
        want = q[k] * n; lo = 0; prev = 0
        for (i = 1; i <= NR; i++) {
          if (c[i] >= want) {
            hi = (le[i] == "+Inf") ? lo : le[i]; f = (c[i] > prev) ? (want - prev) / (c[i] - prev) : 1
            printf " p%s=%.3fms", name[k], (lo + f * (hi - lo)) * 1000; break
          }
          lo = le[i]; prev = c[i]
        }
      }
      printf "\n" }'
}

hist >"$T/h0"; sleep "$DUR"; hist >"$T/h1"
quiet=$(quantiles "$T/h0" "$T/h1")
log "quiet:        $quiet"

dumps=0; bytes=0; t0=$(date +%s.%N)
hist >"$T/h2"
end=$((SECONDS + DUR))
while [ $SECONDS -lt $end ]; do
  n=$(curl -s "http://127.0.0.1:$mp/v1/dump?worker_id=7&dp_rank=0" | wc -c)
  bytes=$((bytes + n)); dumps=$((dumps + 1))
done
hist >"$T/h3"
t1=$(date +%s.%N)
busy=$(quantiles "$T/h2" "$T/h3")
per=$(awk -v a="$t0" -v b="$t1" -v n="$dumps" 'BEGIN { printf "%.0f", (b - a) * 1000 / n }')
log "during dumps: $busy"
{
  echo "query dump bench: $(gauge 'kvbridge_mirror_resident_blocks{tier="device"}') blocks in the mirror, live $RATE batches/s, $(machine_busy)"
  echo "dumps: $dumps back to back, $((bytes / dumps)) bytes each, ${per} ms each"
  echo "publish delay, quiet:        $quiet"
  echo "publish delay, during dumps: $busy"
} | tee "$OUT/query_dump.txt"
