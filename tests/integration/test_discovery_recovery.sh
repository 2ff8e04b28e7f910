#!/usr/bin/env bash
# shellcheck disable=SC2016 # wait_until evaluates its condition later: single quotes on purpose
# Dynamo's recovery query (discovery.recovery.*, docs/dynamo-event-plane.md
# section 9): with a real etcd and nats-server, kvbridge (nats.format
# dynamo-msgpack) registers for each (worker_id, dp_rank) an Instance record
# and an EventSource record whose recovery_target is that Instance, and
# answers a router (dyn_router.c, written from Dynamo's wire forms) exactly
# as a Dynamo worker's local indexer does:
#   a. the TCP request plane, response mux v1: a full restore is a TreeDump of
#      the mirror (the same blocks and tokens_hash as /v1/dump, last_event_id
#      the pair's last event); a start in the ring: Events from it through
#      the last, original ids; past the last: TooNew; end before start:
#      InvalidRange; older than the ring: TreeDump; another worker_id: Error;
#      a pre-kind request: TreeDump; QUIC: refused at once; the call-home
#      response plane too; each answer counted
#   b. the NATS request plane (request/reply on kvbridge's connection)
source "$(dirname "$0")/lib.sh"
for prog in etcd etcdctl gcc; do
  command -v $prog >/dev/null || { bad "$prog is not installed (make deps)"; finish; exit 1; }
done
export ETCDCTL_API=3
# shellcheck disable=SC2046
gcc -O1 -o "$T/dyn_router" "$ROOT/tests/integration/dyn_router.c" \
  $(pkg-config --cflags --libs libnats json-c) 2>"$T/gcc.log" ||
  { bad_log "dyn_router did not build" "$T/gcc.log"; finish; exit 1; }

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
EP=$(daemon_port 2)
start etcd etcd --name kvb --data-dir "$T/etcd" \
  --listen-client-urls "http://127.0.0.1:$EP" --advertise-client-urls "http://127.0.0.1:$EP" \
  --listen-peer-urls "http://127.0.0.1:$((EP + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((EP + 1))" \
  --initial-cluster "kvb=http://127.0.0.1:$((EP + 1))"
end=$((SECONDS + 20))
until etcdctl --endpoints "127.0.0.1:$EP" endpoint health >/dev/null 2>&1; do
  [ $SECONDS -ge $end ] && { bad "etcd did not start"; finish; exit 1; }; sleep 0.1
done
wait_until() { # wait_until SECONDS 'SHELL CONDITION'
  local end=$((SECONDS + $1))
  until eval "$2"; do [ $SECONDS -ge $end ] && return 1; sleep 0.1; done
}
get() { etcdctl --endpoints "127.0.0.1:$EP" get --prefix "$1" 2>/dev/null; }
# quiet MPORT: until kvbridge's router event count stays the same for 0.5 s
# (the engine has stopped and everything it sent is published; bounded)
quiet() {
  local end=$((SECONDS + 20)) a b
  a=$(published "$1")
  while [ $SECONDS -lt $end ]; do
    sleep 0.5
    b=$(published "$1")
    [ "$a" = "$b" ] && [ "$b" -gt 0 ] && return 0
    a=$b
  done
  echo "     (still publishing after 20 s: $b)"
  return 1
}

# config FILE ENGINE_PORT METRICS_PORT PLANE [RECOVERY_PORT]
config() {
  cat >"$1" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$2
nats:
  servers: [nats://127.0.0.1:$NP]
  format: dynamo-msgpack
discovery:
  etcd:
    endpoints: [http://127.0.0.1:$EP]
  recovery:
    enabled: true
    request_plane: $4
    listen: "${5:+127.0.0.1:$5}"
metrics:
  listen: 127.0.0.1:$3
YAML
}

# run NAME [dyn_router options]: its summary line in $T/NAME.out, exit code in RC
run() {
  local name=$1; shift
  RC=0
  "$T/dyn_router" "$@" >"$T/$name.out" 2>"$T/$name.err" || RC=$?
  [ "$RC" = 0 ] || [ "$RC" = 3 ] || sed 's/^/     | /' "$T/$name.err"
}
val() { sed -n "s/.* $2=\\([^ ]*\\).*/\\1/p" "$T/$1.out"; }
pairs_of_dump() { grep -o '"block_hash":[0-9]*,"tokens_hash":[0-9]*' "$1" | sed 's/"block_hash"://; s/,"tokens_hash":/ /' | sort; }

# ---- a. the TCP request plane -------------------------------------------------
P=$(daemon_port); MP=$(daemon_port); RP=$(daemon_port)
config "$T/a.yaml" "$P" "$MP" tcp "$RP"
start_kvbridge kvb-a "$T/a.yaml" || { bad "kvbridge did not start"; finish; exit 1; }
KPID=$KVB_PID
expect_eq "a: the TCP request plane listens" "$(count_log "$T/kvb-a.log" "TCP request plane at 127.0.0.1:$RP")" 1
timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --batches 2000 --rate 2000 --seed 5 \
  --wait-subscribers 1500 --linger 300 --record "$T/a.rec" 2>"$T/sim-a.log" ||
  bad_log "a: kvsim failed" "$T/sim-a.log"
wait_until 10 '[ "$(get v1/event_sources/ | grep -c recovery_target)" -ge 1 ]' ||
  bad "a: no EventSource record with a recovery_target"
quiet "$MP" || true
rec=$(get v1/event_sources/ | grep recovery_target | head -n 1)
target=$(echo "$rec" | grep -o '"transport":{"tcp":"[^"]*"}' | sed 's/.*"tcp":"\([^"]*\)".*/\1/')
endpoint=$(echo "$rec" | grep -o '"endpoint":"worker_kv_query_source_[0-9a-f]*"' | sed 's/.*"\(worker_kv[^"]*\)"/\1/')
iid=$(echo "$rec" | grep -o '"instance_id":[0-9]*' | cut -d: -f2)
echo "     recovery_target: $endpoint at $target (instance $iid)"
case "$target" in
  127.0.0.1:$RP/*/kvbridge/7/0) ok "a: the target is the TCP plane's address and the pair ($target)" ;;
  *) bad "a: the target: got '$target'" ;;
esac
inst=$(get "v1/instances/dynamo/backend/$endpoint/" | tail -n 1)
expect_eq "a: the Instance record is the recovery_target, typed" \
  "$inst" "$(echo "$rec" | grep -o '"recovery_target":{[^}]*}}' | sed 's/"recovery_target":{/{"type":"Endpoint",/')"
expect_eq "a: the Instance record's key holds the instance id" \
  "$(get "v1/instances/dynamo/backend/$endpoint/" | head -n 1)" \
  "v1/instances/dynamo/backend/$endpoint/$(printf '%x' "$iid")"

http_get "$MP" "/v1/dump?worker_id=7&dp_rank=0"
cp "$T/http.body" "$T/dump.ndjson"
last=$(tail -n 1 "$T/dump.ndjson" | sed 's/[^0-9]//g')
R=(--plane tcp --target "$target" --worker 7 --rank 0)
run full "${R[@]}" --blocks "$T/full.blocks"
expect_eq "a: full restore: a TreeDump" "$(val full variant)" TreeDump
expect_eq "a: ... of this pair's events only" "$(val full pair_ok)" 1
expect_eq "a: ... last_event_id = the pair's last" "$(val full last_event_id)" "$last"
expect_eq "a: ... reset_scope all" "$(val full reset_scope)" '"all"'
expect_eq "a: ... synthetic ids from 0" "$(val full first_id)" 0
expect_eq "a: ... the mirror's blocks (= /v1/dump, tokens_hash too)" \
  "$(sort "$T/full.blocks" | md5sum)" "$(pairs_of_dump "$T/dump.ndjson" | md5sum)"
expect_eq "a: ... as many as kvbridge_mirror_resident_blocks" "$(val full blocks)" \
  "$(metric "$MP" 'kvbridge_mirror_resident_blocks{tier="device"}')"
expect_ge "a: ... not empty" "$(val full blocks)" 100
run events "${R[@]}" --start $((last - 5)) --ids "$T/events.ids"
expect_eq "a: start in the ring: Events" "$(val events variant)" Events
expect_eq "a: ... from start through the last, original ids" \
  "$(tr '\n' ' ' <"$T/events.ids")" "$(seq -s ' ' $((last - 5)) "$last") "
expect_eq "a: ... last_event_id" "$(val events last_event_id)" "$last"
run toonew "${R[@]}" --start $((last + 5))
expect_eq "a: start past the last: TooNew" "$(val toonew variant)" TooNew
expect_eq "a: ... newest_available" "$(val toonew newest_available)" "$last"
run range "${R[@]}" --start 9 --end 3
expect_eq "a: end before start: InvalidRange" "$(val range variant)" InvalidRange
run old "${R[@]}" --start 1
expect_eq "a: older than the ring: TreeDump" "$(val old variant)" TreeDump
run wrong --plane tcp --target "$target" --worker 8 --rank 0
expect_eq "a: another worker_id: Error" "$(val wrong variant)" Error
check "a: ... Dynamo's words" grep -q "worker_id mismatch: request.worker_id=8 this.worker_id=7" "$T/wrong.out"
run prekind "${R[@]}" --old-request
expect_eq "a: a request of before kind: TreeDump" "$(val prekind variant)" TreeDump
run quic "${R[@]}" --transport quic_response_v1
expect_eq "a: QUIC response plane: refused at once (exit 3)" "$RC" 3
check "a: ... saying why" grep -q "Server unavailable: response plane quic_response_v1 is not served" "$T/quic.out"
run callhome "${R[@]}" --response callhome --blocks "$T/ch.blocks"
expect_eq "a: call-home response plane: TreeDump" "$(val callhome variant)" TreeDump
expect_eq "a: ... the same blocks" "$(sort "$T/ch.blocks" | md5sum)" "$(sort "$T/full.blocks" | md5sum)"
expect_ge "a: counted: tree_dump" "$(metric "$MP" 'kvbridge_recovery_requests_total{result="tree_dump"}')" 4
expect_eq "a: counted: events" "$(metric "$MP" 'kvbridge_recovery_requests_total{result="events"}')" 1
expect_eq "a: counted: too_new" "$(metric "$MP" 'kvbridge_recovery_requests_total{result="too_new"}')" 1
expect_eq "a: counted: invalid_range" "$(metric "$MP" 'kvbridge_recovery_requests_total{result="invalid_range"}')" 1
expect_eq "a: counted: error" "$(metric "$MP" 'kvbridge_recovery_requests_total{result="error"}')" 1
expect_eq "a: counted: refused" "$(metric "$MP" 'kvbridge_recovery_requests_total{result="refused"}')" 1
expect_eq "a: counted: undelivered" "$(metric "$MP" 'kvbridge_recovery_requests_total{result="undelivered"}')" 0
expect_ge "a: queries_total{op=recover}" "$(metric "$MP" 'kvbridge_queries_total{op="recover"}')" 7
signal_pid "$KPID" TERM 15
expect_eq "a: kvbridge exit code" "$RC" 0
expect_eq "a: the records went with the lease" "$(get v1/instances/ | grep -c "$endpoint")" 0

# ---- b. the NATS request plane --------------------------------------------------
P=$(daemon_port); MP=$(daemon_port)
config "$T/b.yaml" "$P" "$MP" nats
start_kvbridge kvb-b "$T/b.yaml" || { bad "b: kvbridge did not start"; finish; exit 1; }
KPID=$KVB_PID
timeout 60 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$P" --batches 500 --rate 2000 --seed 6 \
  --wait-subscribers 1500 --linger 300 2>"$T/sim-b.log" || bad_log "b: kvsim failed" "$T/sim-b.log"
wait_until 10 '[ "$(get v1/event_sources/ | grep -c "nats_tcp")" -ge 1 ]' ||
  bad "b: no EventSource record with a NATS recovery_target"
quiet "$MP" || true
subj=$(get v1/event_sources/ | grep -o '"transport":{"nats_tcp":"[^"]*"}' | head -n 1 | sed 's/.*"nats_tcp":"\([^"]*\)".*/\1/')
case "$subj" in
  dynamo_backend.kvbridge-*.7.0) ok "b: the target is a subject of the pair ($subj)" ;;
  *) bad "b: the target: got '$subj'" ;;
esac
http_get "$MP" "/v1/dump?worker_id=7&dp_rank=0"
cp "$T/http.body" "$T/dump-b.ndjson"
last=$(tail -n 1 "$T/dump-b.ndjson" | sed 's/[^0-9]//g')
B=(--plane nats --nats "nats://127.0.0.1:$NP" --target "$subj" --worker 7 --rank 0)
run bfull "${B[@]}" --blocks "$T/bfull.blocks"
expect_eq "b: full restore over NATS: TreeDump" "$(val bfull variant)" TreeDump
expect_eq "b: ... the mirror's blocks" "$(sort "$T/bfull.blocks" | md5sum)" "$(pairs_of_dump "$T/dump-b.ndjson" | md5sum)"
run bevents "${B[@]}" --start "$last" --response callhome
expect_eq "b: the last event, call-home: Events" "$(val bevents variant)" Events
expect_eq "b: ... one" "$(val bevents events)" 1
run bnone --plane nats --nats "nats://127.0.0.1:$NP" --target "${subj%.7.0}.9.9" --worker 9 --rank 9
expect_eq "b: a pair with no event yet: an empty TreeDump" "$(val bnone variant) $(val bnone events) $(val bnone last_event_id)" "TreeDump 0 0"

signal_pid "$KPID" TERM 15
expect_eq "b: kvbridge exit code" "$RC" 0
finish
