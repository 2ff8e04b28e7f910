#!/usr/bin/env bash
# make demo: the whole chain on this machine for about 15 seconds.
#   kvsim (a simulated vLLM engine: PUB + replay ROUTER)
#     -> kvbridge -> nats-server -> kvtail (prints router events, checks ids)
# Everything on 127.0.0.1, free ports, processes stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
B=build
DUR=${DEMO_SECONDS:-15}
T=$(mktemp -d /tmp/kvbridge-demo.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT INT TERM

free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 30000))
    (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && continue
    (exec 3<>/dev/tcp/127.0.0.1/$((p + 1))) 2>/dev/null && continue
    echo $p; return 0
  done
  return 1
}
NATS=$(free_port); ENG=$(free_port)

echo "== nats-server on 127.0.0.1:$NATS"
nats-server -a 127.0.0.1 -p "$NATS" >"$T/nats.log" 2>&1 & PIDS+=("$!")
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$NATS") 2>/dev/null && break; sleep 0.1; done

cat >"$T/kvbridge.yaml" <<YAML
worker_id: 7587890738027725506
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$ENG
    replay_endpoint: tcp://127.0.0.1:$((ENG + 1))
nats:
  servers: [nats://127.0.0.1:$NATS]
metrics:
  listen: ""
YAML

echo "== kvtail subscribed to namespace.dynamo.component.backend.kv_events"
"$B/kvtail" --server "nats://127.0.0.1:$NATS" --check --index --ready-file "$T/ready" \
  >"$T/events.jsonl" 2>"$T/kvtail.err" & TAIL=$!; PIDS+=("$TAIL")
for _ in $(seq 100); do [ -e "$T/ready" ] && break; sleep 0.1; done

echo "== kvbridge -c kvbridge.yaml"
"$B/kvbridge" -c "$T/kvbridge.yaml" 2>"$T/kvbridge.log" & KVB=$!; PIDS+=("$KVB")
sleep 0.5

N=$((DUR * 40))
echo "== kvsim: simulated engine, $N batches at 40/s, seq 200-204 dropped live (replay recovers them)"
"$B/kvsim" --endpoint "tcp://127.0.0.1:$ENG" --replay "tcp://127.0.0.1:$((ENG + 1))" \
  --workload realistic --rate 40 --batches "$N" --drop-live 200-204 2>"$T/kvsim.err" &
SIM=$!; PIDS+=("$SIM")

echo "== router events arriving (first 8 lines, then a count every 3 s):"
sleep 2
head -n 8 "$T/events.jsonl" | cut -c1-220
while kill -0 $SIM 2>/dev/null; do
  sleep 3
  echo "   ... $(wc -l <"$T/events.jsonl") router events so far"
done
sleep 1
kill -TERM $KVB; wait $KVB || true
kill -TERM $TAIL; wait $TAIL || true
echo "== kvbridge log:"
sed 's/^/   /' "$T/kvbridge.log"
echo "== kvsim: $(tail -n 1 "$T/kvsim.err")"
echo "== kvtail: $(tail -n 1 "$T/events.jsonl")"
grep -q "holes=0" "$T/events.jsonl" && echo "== every event_id arrived, in order (holes=0)"
