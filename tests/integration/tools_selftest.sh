#!/usr/bin/env bash
# Self-test of the test instruments tools/kvsim and tools/kvtail.
#
#  1. kvtail against a real nats-server: kvtail --publish feeds hand-written
#     router events to a second kvtail with --check / --index / --expect-record
#     (exact counts, hole / duplicate / reorder / reset detection, malformed
#     messages, WRONG and missing entries, exit codes).
#  2. kvsim smoke test without any subscriber (record file, restart, options).
#
# Everything on 127.0.0.1, free ports picked here, every process bounded by
# `timeout` and killed by PID.  Run from anywhere: bash tests/integration/tools_selftest.sh
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
B=$ROOT/build
TMP=$(mktemp -d /tmp/kvb-tools-selftest.XXXXXX) || exit 2
PIDS=()
FAILS=0
W=7587890738027725506

# shellcheck disable=SC2317  # invoked through trap
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null
    done
    if [ "$FAILS" -eq 0 ]; then
        rm -rf "$TMP"
    else
        echo "(logs kept in $TMP)"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
pass() { echo "ok: $*"; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A base port P with P, P+1, P+100 and P+101 all free (kvsim dp 2 + replay).
free_port() {
    local p _
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 30000))
        port_free $p && port_free $((p + 1)) && port_free $((p + 100)) &&
            port_free $((p + 101)) && { echo $p; return 0; }
    done
    return 1
}

wait_file() {   # path seconds
    local _
    for _ in $(seq $(($2 * 20))); do
        [ -e "$1" ] && return 0
        sleep 0.05
    done
    return 1
}

# ---------------------------------------------------------------- build
build_tool() {  # name libs...
    local name=$1
    shift
    if [ -x "$B/$name" ] && [ "$B/$name" -nt "tools/$name.c" ] &&
        [ "$B/$name" -nt tools/tools_common.h ]; then
        return 0
    fi
    timeout 120 make -s "build/$name" >"$TMP/make-$name.log" 2>&1 && return 0
    # the library build may be broken by work in progress elsewhere: the tools
    # need nothing from src/ nor include/, so compile them alone
    mkdir -p "$B"
    # shellcheck disable=SC2046  # pkg-config output is a list of flags
    timeout 120 gcc -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wshadow \
        -Wstrict-prototypes -Wmissing-prototypes \
        $(pkg-config --cflags libzmq msgpack libnats libxxhash 2>/dev/null) \
        "tools/$name.c" -o "$B/$name" "$@"
}
build_tool kvsim -lzmq -lmsgpackc -lxxhash || { echo "FAIL: cannot build kvsim"; exit 1; }
build_tool kvtail -lnats || { echo "FAIL: cannot build kvtail"; exit 1; }
command -v nats-server >/dev/null || { echo "FAIL: nats-server not installed"; exit 1; }

# ---------------------------------------------------------- nats-server
NATS_PID=
for _ in 1 2 3; do
    NP=$(free_port) || break
    timeout 600 nats-server -a 127.0.0.1 -p "$NP" >"$TMP/nats.log" 2>&1 &
    NATS_PID=$!
    PIDS+=("$NATS_PID")
    for _ in $(seq 100); do
        port_free "$NP" || break
        sleep 0.05
    done
    if kill -0 "$NATS_PID" 2>/dev/null && ! port_free "$NP"; then
        break
    fi
    kill "$NATS_PID" 2>/dev/null
    NATS_PID=
done
[ -n "$NATS_PID" ] || { echo "FAIL: cannot start nats-server"; exit 1; }
NURL=nats://127.0.0.1:$NP
echo "nats-server pid $NATS_PID on $NURL"

# ------------------------------------------------------ kvtail helpers
# run_case NAME WANT_RC INPUT [kvtail subscriber args...]
# Starts a subscriber, publishes INPUT with kvtail --publish, waits for it.
run_case() {
    local name=$1 want=$2 input=$3 subj="selftest.$1.$RANDOM" tp rc
    shift 3
    timeout 30 "$B/kvtail" --server "$NURL" --subject "$subj" \
        --ready-file "$TMP/$name.ready" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    tp=$!
    PIDS+=("$tp")
    if ! wait_file "$TMP/$name.ready" 10; then
        fail "$name: subscriber never became ready"
        kill "$tp" 2>/dev/null
        return
    fi
    timeout 30 "$B/kvtail" --server "$NURL" --subject "$subj" --publish "$input" \
        2>>"$TMP/$name.err" || fail "$name: publish failed"
    wait "$tp"
    rc=$?
    if [ "$rc" != "$want" ]; then
        fail "$name: exit $rc, want $want ($(tail -n1 "$TMP/$name.out"))"
        return 1
    fi
    return 0
}

# expect NAME "k=v k=v ...": each must appear in the final stdout line
expect() {
    local last kv
    last=" $(tail -n1 "$TMP/$1.out") "
    for kv in $2; do
        case "$last" in
        *" $kv "*) ;;
        *) fail "$1: want $kv in:$last"; return 1 ;;
        esac
    done
    pass "$1: $2"
}

ev_cleared() { echo "{\"worker_id\":$W,\"event\":{\"event_id\":$1,\"data\":\"cleared\",\"dp_rank\":${2:-0}}}"; }
ev_stored() {   # id parent "h:t,h:t" [rank]
    local blocks="" b
    for b in ${3//,/ }; do
        blocks="$blocks${blocks:+,}{\"block_hash\":${b%%:*},\"tokens_hash\":${b##*:}}"
    done
    echo "{\"worker_id\":$W,\"event\":{\"event_id\":$1,\"data\":{\"stored\":{\"parent_hash\":$2,\"blocks\":[$blocks]}},\"dp_rank\":${4:-0}}}"
}
ev_removed() { echo "{\"worker_id\":$W,\"event\":{\"event_id\":$1,\"data\":{\"removed\":{\"block_hashes\":[$2]}},\"dp_rank\":${3:-0}}}"; }

# ---------------------------------------------------- 1. kvtail cases
{
    ev_cleared 0
    ev_stored 1 null 15760518052499183552:7652252100776996844
    ev_stored 2 15760518052499183552 2:20,3:30
    ev_stored 3 999 4:40                                    # unknown parent: dropped
    ev_removed 4 15760518052499183552,777                   # 777 unknown: ignored
    echo "{\"worker_id\":$W,\"storage_tier\":\"host_pinned\",\"event\":{\"event_id\":5,\"data\":{\"stored\":{\"parent_hash\":null,\"blocks\":[{\"block_hash\":18446744073709551615,\"tokens_hash\":0}]}},\"dp_rank\":0}}"
    ev_cleared 0 1
} >"$TMP/ok.jsonl"
run_case ok 0 "$TMP/ok.jsonl" --check --index --count 7 --timeout 10000 &&
    expect ok "messages=7 stored=4 removed=1 cleared=2 holes=0 dups=0 bad=0 orphans=1 unknown_removes=1"
if head -n 7 "$TMP/ok.out" | cmp -s - "$TMP/ok.jsonl"; then
    pass "ok: messages printed verbatim, one per line"
else
    fail "ok: printed messages differ from the published ones"
fi

{ ev_cleared 0; ev_stored 1 null 1:1; ev_stored 3 1 2:2; ev_cleared 0 1; ev_cleared 1 1; } >"$TMP/hole.jsonl"
if run_case hole 1 "$TMP/hole.jsonl" --check --count 5 --timeout 10000 --quiet &&
    expect hole "messages=5 holes=1 dups=0 reorders=0"; then
    if grep -q "HOLE .*dp_rank=0 event_id 2..2" "$TMP/hole.err"; then
        pass "hole: reported on stderr"
    else
        fail "hole: no HOLE report"
    fi
fi

{ ev_cleared 0; ev_cleared 1; ev_cleared 1; ev_cleared 0 1; ev_cleared 2 1; ev_cleared 1 1; } >"$TMP/dup.jsonl"
run_case dup 1 "$TMP/dup.jsonl" --check --count 6 --timeout 10000 --quiet &&
    expect dup "messages=6 holes=1 dups=1 reorders=1"

{ ev_cleared 5; ev_cleared 6; } >"$TMP/offset.jsonl"
run_case offset 1 "$TMP/offset.jsonl" --check --count 2 --timeout 10000 --quiet &&
    expect offset "holes=1 dups=0"
run_case offset-allowed 0 "$TMP/offset.jsonl" --check --allow-start-offset --count 2 --timeout 10000 --quiet &&
    expect offset-allowed "holes=0 dups=0"

{ ev_cleared 0; ev_stored 1 null 1:1; ev_cleared 0; ev_stored 1 null 1:1; } >"$TMP/reset.jsonl"
run_case reset 0 "$TMP/reset.jsonl" --check --count 4 --timeout 10000 --quiet &&
    expect reset "holes=0 dups=0 resets=1"

{
    echo "{\"worker_id\": $W,\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0}}"          # space
    echo "{\"worker_id\":$W,\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0}} "           # trailing
    echo "{\"worker_id\":-1,\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0}}"            # negative
    echo "{\"worker_id\":1.5,\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0}}"           # float
    echo "{\"worker_id\":18446744073709551616,\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0}}"  # 2^64
    echo "{\"worker_id\":07,\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0}}"            # leading 0
    echo "{\"worker_id\":$W,\"storage_tier\":\"device\",\"event\":{\"event_id\":0,\"data\":{\"removed\":{\"block_hashes\":[1]}},\"dp_rank\":0}}"  # device is implicit
    echo "{\"worker_id\":$W,\"event\":{\"event_id\":0,\"data\":{\"stored\":{\"parent_hash\":null,\"blocks\":[]}},\"dp_rank\":0}}"
    echo "{\"worker_id\":$W,\"event\":{\"event_id\":0,\"data\":{\"removed\":{\"block_hashes\":[]}},\"dp_rank\":0}}"
    echo "{\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0},\"worker_id\":$W}"            # order
    echo "not json"
    echo "{\"worker_id\":18446744073709551615,\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0}}"  # valid
} >"$TMP/bad.jsonl"
run_case bad 1 "$TMP/bad.jsonl" --check --count 12 --timeout 10000 --quiet &&
    expect bad "messages=12 cleared=1 bad=11 holes=0"

# --expect-record: a hand-written kvsim record (engine view) ...
cat >"$TMP/rec.jsonl" <<'EOF'
{"seq":0,"rank":0,"live":true,"replay":false,"events":[{"type":"stored","parent":null,"hashes":[101,102],"tokens_hashes":[1001,1002],"tier":"device","group":0,"lora":null}]}
{"seq":1,"rank":0,"live":true,"replay":false,"events":[{"type":"stored","parent":102,"hashes":[103],"tokens_hashes":[1003],"tier":"device","group":0,"lora":"adapter-a"},{"type":"stored","parent":null,"hashes":[201],"tokens_hashes":[2001],"tier":"device","group":1,"lora":null}]}
{"seq":2,"rank":0,"live":false,"replay":false,"fault":"drop-forever","events":[{"type":"removed","hashes":[101],"tier":"device","group":0}]}
{"seq":3,"rank":0,"live":true,"replay":false,"events":[]}
EOF
# ... what a correct bridge publishes (barrier for the lost seq 2) ...
{ ev_cleared 0; ev_stored 1 null 101:1001,102:1002; ev_stored 2 102 103:1003; ev_cleared 3; } >"$TMP/good.jsonl"
run_case record-good 0 "$TMP/good.jsonl" --check --expect-record "$TMP/rec.jsonl" --count 4 --timeout 10000 --quiet &&
    expect record-good "wrong=0 missing=2 badtok=0 indexed=0"
# ... one without the barrier: 101 stays indexed although the engine evicted it
{ ev_cleared 0; ev_stored 1 null 101:1001,102:1002; ev_stored 2 102 103:1003; } >"$TMP/stale.jsonl"
run_case record-stale 1 "$TMP/stale.jsonl" --check --expect-record "$TMP/rec.jsonl" --count 3 --timeout 10000 --quiet &&
    expect record-stale "wrong=1 missing=0 indexed=3"
# ... a wrong tokens_hash, and a secondary-group block that leaked through
{ ev_cleared 0; ev_stored 1 null 102:999; ev_stored 2 null 201:2001; } >"$TMP/badtok.jsonl"
run_case record-badtok 1 "$TMP/badtok.jsonl" --check --expect-record "$TMP/rec.jsonl" --count 3 --timeout 10000 --quiet &&
    expect record-badtok "wrong=1 badtok=1"

# a scoped "cleared" (storage_tier named): that tier alone; the record's
# tier clear and an AllBlocksCleared naming a medium (the bridge drops it)
cat >"$TMP/rec-tier.jsonl" <<'EOF'
{"seq":0,"rank":0,"live":true,"replay":false,"events":[{"type":"stored","parent":null,"hashes":[101,102],"tokens_hashes":[1001,1002],"tier":"device","group":0,"lora":null},{"type":"stored","parent":null,"hashes":[101,102],"tokens_hashes":[1001,1002],"tier":"host_pinned","group":0,"lora":null}]}
{"seq":1,"rank":0,"live":true,"replay":false,"events":[{"type":"cleared","tier":"device","scoped":true}]}
{"seq":2,"rank":0,"live":true,"replay":false,"events":[{"type":"cleared","medium":"GPU","drop":"ambiguous_scoped_clear"}]}
EOF
ev_host() { ev_stored "$@" | sed 's/^{"worker_id":[0-9]*/&,"storage_tier":"host_pinned"/'; }
ev_tier_cleared() { echo "{\"worker_id\":$W,\"storage_tier\":\"$2\",\"event\":{\"event_id\":$1,\"data\":\"cleared\",\"dp_rank\":0}}"; }
{ ev_cleared 0; ev_stored 1 null 101:1001,102:1002; ev_host 2 null 101:1001,102:1002; ev_tier_cleared 3 device; } >"$TMP/tier.jsonl"
run_case record-tier 0 "$TMP/tier.jsonl" --check --expect-record "$TMP/rec-tier.jsonl" --count 4 --timeout 10000 --quiet &&
    expect record-tier "cleared=2 bad=0 wrong=0 missing=0 indexed=2"
# ... without the tier clear the device copies stay indexed: wrong
{ ev_cleared 0; ev_stored 1 null 101:1001,102:1002; ev_host 2 null 101:1001,102:1002; } >"$TMP/tier-stale.jsonl"
run_case record-tier-stale 1 "$TMP/tier-stale.jsonl" --check --expect-record "$TMP/rec-tier.jsonl" --count 3 --timeout 10000 --quiet &&
    expect record-tier-stale "wrong=2 missing=0 indexed=4"
# ... a clear of the host tier instead: device copies wrong, host ones missing
{ ev_cleared 0; ev_stored 1 null 101:1001,102:1002; ev_host 2 null 101:1001,102:1002; ev_tier_cleared 3 host_pinned; } >"$TMP/tier-host.jsonl"
run_case record-tier-host 1 "$TMP/tier-host.jsonl" --check --expect-record "$TMP/rec-tier.jsonl" --count 4 --timeout 10000 --quiet &&
    expect record-tier-host "wrong=2 missing=2 indexed=2"

{ ev_cleared 0; } >"$TMP/short.jsonl"
run_case short 1 "$TMP/short.jsonl" --count 3 --timeout 1000 --quiet &&
    expect short "messages=1"

timeout 20 "$B/kvtail" --server "nats://127.0.0.1:$(free_port)" --timeout 500 >/dev/null 2>&1
rc=$?
is_rc() {   # got want what
    if [ "$1" = "$2" ]; then pass "$3 -> exit $2"; else fail "$3 -> exit $1, want $2"; fi
}
is_rc $rc 2 "kvtail: no server"
timeout 5 "$B/kvtail" --bogus >/dev/null 2>&1
rc=$?
is_rc $rc 2 "kvtail: bad option"

# ------------------------------------------------------- 2. kvsim smoke
if timeout 5 "$B/kvsim" --help | grep -q -- "--drop-forever"; then pass "kvsim: --help"; else fail "kvsim: --help"; fi
# the multimodal / EAGLE tokens_hash oracle against the known answers of docs/router-events.md section 3.4
if timeout 5 "$B/kvsim" --oracle-selftest 2>"$TMP/oracle.err"; then pass "kvsim: --oracle-selftest"
else fail "kvsim: --oracle-selftest: $(tr '\n' ' ' <"$TMP/oracle.err")"; fi
timeout 5 "$B/kvsim" --encoding nope >/dev/null 2>&1
rc=$?
is_rc $rc 2 "kvsim: bad option"

KP=$(free_port)
timeout 30 "$B/kvsim" --endpoint "tcp://127.0.0.1:$KP" --dp-size 2 --batches 100 --restart-at 49 \
    --wait-subscribers 0 --linger 0 --record "$TMP/smoke.jsonl" --seed 3 2>"$TMP/smoke.err"
rc=$?
lines=$(wc -l <"$TMP/smoke.jsonl" 2>/dev/null || echo 0)
restarts=$(grep -c '"restart":true' "$TMP/smoke.jsonl" 2>/dev/null)
if [ $rc = 0 ] && [ "$lines" = 202 ] && [ "$restarts" = 2 ] &&
    grep -q "kvsim: rank 1 .*batches=100 .*next_seq=50" "$TMP/smoke.err" &&
    grep -q "kvsim: total batches=200" "$TMP/smoke.err"; then
    pass "kvsim: 2 ranks x 100 batches, restart after 49, record and summary"
else
    fail "kvsim smoke: rc=$rc lines=$lines restarts=$restarts: $(cat "$TMP/smoke.err")"
fi
# the record parses, and with nothing published every engine block is 'missing'
timeout 20 "$B/kvtail" --server "$NURL" --subject selftest.none --timeout 300 --quiet \
    --expect-record "$TMP/smoke.jsonl" >"$TMP/smoke-tail.out" 2>"$TMP/smoke-tail.err"
rc=$?
if [ $rc = 0 ] && grep -Eq "messages=0 .*wrong=0 missing=[1-9]" "$TMP/smoke-tail.out"; then
    pass "kvtail reads kvsim's record ($(grep -o 'missing=[0-9]*' "$TMP/smoke-tail.out"))"
else
    fail "kvtail --expect-record on kvsim's record: rc=$rc $(cat "$TMP/smoke-tail.out" "$TMP/smoke-tail.err")"
fi

if [ "$FAILS" -eq 0 ]; then
    echo "tools_selftest: PASS"
    exit 0
fi
echo "tools_selftest: $FAILS failure(s)"
exit 1
