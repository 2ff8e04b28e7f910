#!/usr/bin/env bash
# shellcheck disable=SC2016 # wait_until evaluates its condition later: single quotes on purpose
# Discovery (discovery.etcd.*): with nats.format dynamo-msgpack, kvbridge puts
# one EventSource record per (worker_id, dp_rank) in etcd (Debian's
# etcd-server, started here on free ports) under a lease it keeps alive.
#   1. etcd not there yet: /readyz 503, etcd errors counted, nothing published
#      (the engine's batches wait); etcd comes up: the records appear, /readyz
#      200, and kvtail gets every event (sequence from 0 per publisher)
#   2. each record's key and JSON are docs/dynamo-event-plane.md section 5's, for
#      the publisher_id kvtail saw; the lease outlives 3x its TTL
#   3. etcd killed and brought back empty: /readyz 503 once the lease could
#      not be kept alive, then a new lease and the records again
#   4. SIGTERM: the lease is revoked, the records are gone at once
source "$(dirname "$0")/lib.sh"
for prog in etcd etcdctl; do
  command -v $prog >/dev/null || { bad "$prog is not installed (make deps: etcd-server, etcd-client)"; finish; exit 1; }
done
export ETCDCTL_API=3
TTL=2

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
EP=$(daemon_port 2) # client EP, peer EP+1
P=$(daemon_port 2)  # engine rank 0, 1
MP=$(daemon_port)

# start_etcd NAME: a fresh single-member etcd on EP (data in $T/NAME)
start_etcd() {
  start "$1" etcd --name kvb --data-dir "$T/$1" \
    --listen-client-urls "http://127.0.0.1:$EP" --advertise-client-urls "http://127.0.0.1:$EP" \
    --listen-peer-urls "http://127.0.0.1:$((EP + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((EP + 1))" \
    --initial-cluster "kvb=http://127.0.0.1:$((EP + 1))"
  ETCD_PID=$LAST_PID
  local end=$((SECONDS + 20))
  until etcdctl --endpoints "127.0.0.1:$EP" endpoint health >/dev/null 2>&1; do
    [ $SECONDS -ge $end ] && return 1; sleep 0.1
  done
}
records() { etcdctl --endpoints "127.0.0.1:$EP" get --prefix v1/event_sources/ 2>/dev/null; }
n_records() { records | grep -c '^v1/event_sources/' || true; }
readyz() { http_get "$MP" /readyz; echo "$HTTP_STATUS"; }
wait_until() { # wait_until SECONDS 'SHELL CONDITION': evaluated every 0.1 s
  local end=$((SECONDS + $1))
  until eval "$2"; do [ $SECONDS -ge $end ] && return 1; sleep 0.1; done
}

cat >"$T/d.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$P
    dp_size: 2
nats:
  servers: [nats://127.0.0.1:$NP]
  format: dynamo-msgpack
discovery:
  etcd:
    endpoints: [http://127.0.0.1:$EP]
    lease_ttl_s: $TTL
metrics:
  listen: 127.0.0.1:$MP
YAML

# ---- 1. etcd away at start ----------------------------------------------------
start_kvbridge kvb "$T/d.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
start_kvtail tail "$NP" --format dynamo-msgpack --check --index --expect-record "$T/d.rec" \
  --timeout 60000 || bad "kvtail not ready"
TPID=$TAIL_PID
timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --dp-size 2 --batches 300 --rate 1000 \
  --seed 9 --wait-subscribers 2000 --linger 500 --record "$T/d.rec" 2>"$T/sim.log" &
SIM=$!
PIDS+=("$SIM")
wait_until 10 '[ "$(metric "$MP" kvbridge_discovery_etcd_errors_total)" -ge 2 ]' \
  && ok "etcd unreachable: errors counted" || bad "etcd unreachable: no errors counted"
expect_eq "etcd unreachable: /readyz 503" "$(readyz)" 503
wait_pid "$SIM" 60
expect_eq "kvsim published its batches meanwhile" "$RC" 0
expect_eq "etcd unreachable: nothing published" \
  "$(metric "$MP" 'kvbridge_messages_published_total{format="dynamo-msgpack"}')" 0
start_etcd etcd1 || { bad "etcd did not start"; finish; exit 1; }
wait_until 15 '[ "$(n_records)" = 2 ]' && ok "etcd up: 2 records" || bad "etcd up: records $(n_records), want 2"
wait_until 5 '[ "$(readyz)" = 200 ]' && ok "registered: /readyz 200" || bad "registered: /readyz $(readyz)"

# ---- 2. the records -----------------------------------------------------------
records >"$T/records"
for r in 0 1; do
  # etcdctl prints each key, then its value, on lines of their own
  key=$(awk -v r="$r" 'NR % 2 == 1 { k = $0 } NR % 2 == 0 && $0 ~ "\"dp_rank\":" r "}}}$" { print k }' "$T/records")
  val=$(awk -v r="$r" 'NR % 2 == 0 && $0 ~ "\"dp_rank\":" r "}}}$" { print }' "$T/records")
  hex=${key##*/}
  pid=$((16#${hex:-0}))
  expect_eq "rank $r: key" "$key" \
    "v1/event_sources/namespace/dynamo/component/backend/endpoint/generate/topic/kv-events/$hex"
  expect_eq "rank $r: value" "$val" \
    "{\"type\":\"EventSource\",\"scope\":{\"kind\":\"endpoint\",\"endpoint\":{\"namespace\":\"dynamo\",\"component\":\"backend\",\"name\":\"generate\"}},\"topic\":\"kv-events\",\"publisher_id\":$pid,\"metadata\":{\"kv_state_endpoint\":{\"namespace\":\"dynamo\",\"component\":\"backend\",\"name\":\"generate\"},\"publisher_id\":$pid,\"worker\":{\"worker_id\":7,\"dp_rank\":$r}}}"
done
lease=$(etcdctl --endpoints "127.0.0.1:$EP" get --prefix v1/event_sources/ -w json |
  sed -n 's/.*"lease":\([0-9]*\).*/\1/p' | head -1)
[ -n "$lease" ] && ok "records hang off a lease" || bad "records have no lease"
# the lease outlives 3 x its TTL: the records stay, the lease is not replaced
end=$((SECONDS + 3 * TTL + 1)); gone=0
while [ $SECONDS -lt $end ]; do [ "$(n_records)" = 2 ] || gone=1; sleep 0.2; done
expect_eq "records present throughout 3 x TTL" "$gone" 0
expect_eq "same lease after 3 x TTL" "$(etcdctl --endpoints "127.0.0.1:$EP" get --prefix v1/event_sources/ -w json |
  sed -n 's/.*"lease":\([0-9]*\).*/\1/p' | head -1)" "$lease"
regs=$(metric "$MP" kvbridge_discovery_registrations_total)
expect_eq "2 registrations so far" "$regs" 2

# ---- 3. etcd killed, back empty --------------------------------------------------
stop_pid "$ETCD_PID" KILL >/dev/null
wait_until $((TTL + 10)) '[ "$(readyz)" = 503 ]' && ok "lease lost: /readyz 503" || bad "lease lost: /readyz stays $(readyz)"
start_etcd etcd2 || { bad "etcd did not start again"; finish; exit 1; }
wait_until 15 '[ "$(n_records)" = 2 ]' && ok "etcd back: records put again" || bad "etcd back: records $(n_records)"
wait_until 5 '[ "$(readyz)" = 200 ]' && ok "re-registered: /readyz 200" || bad "re-registered: /readyz $(readyz)"
expect_eq "4 registrations" "$(metric "$MP" kvbridge_discovery_registrations_total)" 4
expect_eq "same keys (publisher ids) as before" "$(records | grep '^v1/' | sort)" "$(grep '^v1/' "$T/records" | sort)"

# ---- 4. clean stop ----------------------------------------------------------------
signal_pid "$KVB_PID" TERM 15
expect_eq "kvbridge exit code after SIGTERM" "$RC" 0
expect_eq "clean stop: records removed" "$(n_records)" 0
expect_eq "kvbridge log: lease revoked" "$(count_log "$T/kvb.log" 'revoked: records removed')" 1
stop_pid "$TPID" TERM >/dev/null
expect_eq "kvtail: no sequence error, hole or bad message" \
  "$(tail_stat tail seqerr)+$(tail_stat tail holes)+$(tail_stat tail bad)+$(tail_stat tail wrong)" "0+0+0+0"
expect_eq "kvtail: 2 publishers" "$(tail_stat tail publishers)" 2
want=$(rec_counts "$T/d.rec" live)
expect_eq "kvtail: every event (record + 2 start barriers)" "$(tail_stat tail messages)" \
  "$(($(field events "$want") + 2))"
stop_pid "$ETCD_PID" >/dev/null
stop_pid "$NATS_PID" >/dev/null
finish
