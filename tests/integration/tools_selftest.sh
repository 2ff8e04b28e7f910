#!/usr/bin/env bash
# Self-test of the test instruments tools/kvsim and tools/kvtail.
#
#  1. kvtail against a real nats-server: kvtail --publish feeds hand-written
#     router events to a second kvtail with --check / --index / --expect-record
#     (exact counts, hole / duplicate / reorder / reset detection, malformed
#     messages, WRONG and missing entries, exit codes).
#  2. kvsim smoke test without any subscriber (record file, restart, options).
#  3. Optional, only when python3 with zmq + msgpack is installed (the project
#     does not depend on Python): a Python SUB/DEALER decodes kvsim's live and
#     replay traffic independently and compares it with the --record file;
#     then a reference bridge derived from the record goes through kvtail
#     --expect-record (correct barriers pass, missing barriers are caught).
#     KVB_SELFTEST_NO_PYTHON=1 skips this part.
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
    echo "{\"worker_id\":$W,\"storage_tier\":\"device\",\"event\":{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":0}}"
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

# --------------------------------------- 3. optional: kvsim on the wire
PY=
[ -n "${KVB_SELFTEST_NO_PYTHON:-}" ] ||
for c in /usr/bin/python3 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import zmq, msgpack' 2>/dev/null; then
        PY=$c
        break
    fi
done
if [ -z "$PY" ]; then
    echo "skip: kvsim wire checks need python3 with zmq and msgpack (optional)"
else
cat >"$TMP/kvsim_check.py" <<'PYEOF'
# Independent decoder: live framing, batch shape, values, record == normalized
# payload (tokens_hash via libxxhash through ctypes), replay layouts.
import ctypes, ctypes.util, json, os, struct, sys, time
import msgpack, zmq

MASK = (1 << 64) - 1
xx = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
xx.XXH3_64bits_withSeed.restype = ctypes.c_uint64
xx.XXH3_64bits_withSeed.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
def xxh3(b, seed): return xx.XXH3_64bits_withSeed(b, len(b), seed & MASK)
def tokens_hash(tok, lora):
    seed = 1337 + (xxh3(lora.encode(), 0) if lora else 0)
    return xxh3(struct.pack("<%dI" % len(tok), *tok), seed)
# known answers from docs/router-events.md
assert tokens_hash([1, 2, 3, 4], None) == 14643705804678351452
assert xxh3(b"test data", 1337) == 13226331709069118873
Q = [151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667]
assert tokens_hash(Q, None) == 7652252100776996844
assert tokens_hash(Q, "adapter-a") == 18179192224704087310

TIERS = {None: "device", "GPU": "device", "CPU": "host_pinned"}
POS_STORED = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
              "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
              "kv_cache_spec_sliding_window"]
fails = 0
def fail(msg):
    global fails
    fails += 1
    if fails <= 20: print("kvsim_check: FAIL:", msg)

def nh(h, kind):
    if kind == "bin":
        assert isinstance(h, bytes) and len(h) == 32, h
        return int.from_bytes(h[-8:], "big")
    assert isinstance(h, int) and not isinstance(h, bool), h
    if kind == "uint": assert h >= 0
    return h & MASK

def normalize(ev, a):
    bs, kind = a["bs"], a["hash"]
    if a["enc"] == "map":
        assert isinstance(ev, dict), ev
        d = ev
    else:
        assert isinstance(ev, list), ev
        n = {"BlockStored": 12, "BlockRemoved": 4, "AllBlocksCleared": 1}[ev[0]]
        assert len(ev) == n, ev
        d = dict(zip(POS_STORED if ev[0] == "BlockStored" else ["type", "block_hashes", "medium", "group_idx"], ev))
    t = d["type"]
    if t == "AllBlocksCleared": return {"type": "cleared"}
    g = d.get("group_idx") or 0
    if t == "BlockRemoved":
        assert d["block_hashes"]
        return {"type": "removed", "hashes": [nh(h, kind) for h in d["block_hashes"]],
                "tier": TIERS[d.get("medium")], "group": g}
    assert t == "BlockStored", t
    hs, tok, lora = d["block_hashes"], d["token_ids"], d.get("lora_name")
    assert d["block_size"] == bs and len(tok) == len(hs) * bs and hs
    assert all(type(x) is int and 0 <= x < 150000 for x in tok)
    assert d["kv_cache_spec_kind"] == ("full_attention" if g == 0 else "sliding_window")
    if lora: assert d["lora_id"] in (1, 2) and d["extra_keys"] == [[lora]] * len(hs)
    p = d["parent_block_hash"]
    return {"type": "stored", "parent": None if p is None else nh(p, kind),
            "hashes": [nh(h, kind) for h in hs],
            "tokens_hashes": [tokens_hash(tok[i * bs:(i + 1) * bs], lora) for i in range(len(hs))],
            "tier": TIERS[d.get("medium")], "group": g, "lora": lora}

def check_payload(payload, rank, want, a, what):
    try:
        b = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        assert isinstance(b, list) and len(b) == 3, "batch shape"
        assert isinstance(b[0], float) and abs(b[0] - time.time()) < 600, "ts"
        assert b[2] == rank, "dp_rank %r != %d" % (b[2], rank)
        got = [normalize(e, a) for e in b[1]]
    except Exception as e:
        fail("%s rank %d seq %d: %r" % (what, rank, want["seq"], e)); return
    if got != want["events"]:
        fail("%s rank %d seq %d: events differ from the record" % (what, rank, want["seq"]))

def main():
    a = dict(x.split("=", 1) for x in sys.argv[1:])
    a["bs"] = int(a.get("bs", "16"))
    eps = a["live"].split(",")
    reps = a["replay"].split(",") if a.get("replay") else []
    topic = a.get("topic", "").encode()
    nlines = int(a["record_lines"])
    ctx = zmq.Context()
    subs = []
    for ep in eps:
        s = ctx.socket(zmq.SUB); s.setsockopt(zmq.RCVHWM, 0); s.setsockopt(zmq.SUBSCRIBE, b""); s.connect(ep)
        subs.append(s)
    time.sleep(0.2)
    open(a["ready"], "w").close()
    poller = zmq.Poller()
    for s in subs: poller.register(s, zmq.POLLIN)
    live = [[] for _ in eps]     # (seq, payload) or ("Nframes", last frame)
    t_end = time.time() + 20
    while time.time() < t_end:
        ev = dict(poller.poll(300))
        if not ev:
            # done when the record is complete and the wire has been quiet a while
            if os.path.exists(a["record"]) and sum(1 for _ in open(a["record"])) >= nlines and \
               sum(map(len, live)) > 0 and time.time() > t_end - 18.5: break
            continue
        t_end = time.time() + 20
        for r, s in enumerate(subs):
            while s in ev and s.poll(0):
                f = s.recv_multipart()
                if f[0] != topic: fail("topic %r" % f[0])
                if len(f) == 3 and len(f[1]) == 8: live[r].append((struct.unpack(">Q", f[1])[0], f[2]))
                else: live[r].append(("%dframes" % len(f), f[-1]))
    recs = [json.loads(l) for l in open(a["record"])]
    if len(recs) != nlines: fail("record has %d lines, want %d" % (len(recs), nlines))
    per_rank = [[x for x in recs if x["rank"] == r] for r in range(len(eps))]
    nlive = nbad = 0
    for r in range(len(eps)):
        sent = [x for x in per_rank[r] if not x.get("restart") and x.get("fault") not in ("drop-live", "drop-forever")]
        if len(sent) != len(live[r]):
            fail("rank %d: %d live messages, record says %d" % (r, len(live[r]), len(sent))); continue
        for want, (seq, payload) in zip(sent, live[r]):
            fault = want.get("fault")
            if fault == "bad-frames":
                if seq != "2frames": fail("rank %d seq %d: want 2 frames" % (r, want["seq"]))
                nbad += 1; continue
            if seq != want["seq"]: fail("rank %d: seq %r, record %d" % (r, seq, want["seq"])); continue
            if fault == "malformed":
                if payload[:1] != b"\xc1": fail("malformed payload expected")
                nbad += 1; continue
            if not want["live"]: fail("record live flag")
            check_payload(payload, r, want, a, "live"); nlive += 1
    # replay: a junk request (ignored), then one from a third of the buffer
    nrep = 0
    for r, rep in enumerate(reps):
        incarnation = per_rank[r]
        for i, x in enumerate(incarnation):
            if x.get("restart"): incarnation = per_rank[r][i + 1:]
        buffered = [x for x in incarnation if x.get("fault") != "drop-forever"]
        buffered = buffered[-int(a.get("replay_buffer", "10000")):]
        start = buffered[len(buffered) // 3]["seq"] if buffered else 0
        want = [x for x in buffered if x["seq"] >= start]
        d = ctx.socket(zmq.DEALER); d.setsockopt(zmq.RCVHWM, 0); d.connect(rep)
        d.send_multipart([b"junk"])
        d.send_multipart([b"", struct.pack(">Q", start)])
        got = []
        while True:
            if not d.poll(5000): fail("rank %d: replay timed out" % r); break
            f = d.recv_multipart()
            if a.get("layout", "old") == "new":
                if len(f) != 4 or f[0] != b"": fail("new layout: %d frames" % len(f)); break
                if f[2] == b"\xff" * 8:
                    if f[1] != b"" or f[3] != b"": fail("new layout end marker")
                    break
                if f[1] != topic: fail("replay topic")
                seq, payload = f[2], f[3]
            else:
                if len(f) != 3 or f[0] != b"": fail("old layout: %d frames" % len(f)); break
                if f[1] == b"\xff" * 8:
                    if f[2] != b"": fail("old layout end marker")
                    break
                seq, payload = f[1], f[2]
            got.append((struct.unpack(">Q", seq)[0], payload))
        if [s for s, _ in got] != [x["seq"] for x in want]:
            fail("rank %d: replay seqs %s.. want %s.." % (r, [s for s, _ in got][:8], [x["seq"] for x in want][:8]))
            continue
        for x, (seq, payload) in zip(want, got):
            if x.get("fault") == "malformed":
                if payload[:1] != b"\xc1": fail("replayed malformed payload")
            else:
                check_payload(payload, r, x, a, "replay")
            nrep += 1
    ctx.destroy(linger=0)
    print("kvsim_check: ranks=%d live_checked=%d faulty=%d replay_checked=%d fails=%d"
          % (len(eps), nlive, nbad, nrep, fails))
    sys.exit(1 if fails or nlive == 0 else 0)

main()
PYEOF
cat >"$TMP/refbridge.py" <<'PYEOF'
# Router events a correct bridge publishes for a kvsim record: replay fills
# drop-live / bad-frames gaps; drop-forever, malformed and restarts give
# "cleared".  mode=buggy forgets those barriers (kvtail must catch it).
import json, sys
rec, worker, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
nxt = {}
def pub(r, data):
    i = nxt.get(r, 0); nxt[r] = i + 1
    print(json.dumps({"worker_id": worker, "event": {"event_id": i, "data": data, "dp_rank": r}},
                     separators=(",", ":")))
for line in open(rec):
    x = json.loads(line); r = x["rank"]
    if r not in nxt: pub(r, "cleared")                      # start barrier
    if x.get("restart") or x.get("fault") in ("drop-forever", "malformed"):
        if mode == "correct": pub(r, "cleared")
        continue
    for e in x["events"]:
        if e["type"] == "cleared": pub(r, "cleared"); continue
        if e["group"] != 0 or e["tier"] != "device": continue
        if e["type"] == "stored":
            pub(r, {"stored": {"parent_hash": e["parent"], "blocks": [
                {"block_hash": h, "tokens_hash": t} for h, t in zip(e["hashes"], e["tokens_hashes"])]}})
        else:
            pub(r, {"removed": {"block_hashes": e["hashes"]}})
PYEOF

    # @P/@P1 = live ports of ranks 0/1, @R/@R1 = replay ports
    subst() {
        local x=$1 p=$2
        x=${x//@P1/$((p + 1))}
        x=${x//@R1/$((p + 101))}
        x=${x//@R/$((p + 100))}
        echo "${x//@P/$p}"
    }
    # wire NAME RECORD_LINES "checker args" kvsim args...
    wire() {
        local name=$1 lines=$2 cargs kp pp rc x
        local kargs=()
        kp=$(free_port) || { fail "$name: no free port"; return; }
        cargs=$(subst "$3" "$kp")
        shift 3
        for x in "$@"; do
            kargs+=("$(subst "$x" "$kp")")
        done
        # shellcheck disable=SC2086
        timeout 60 "$PY" "$TMP/kvsim_check.py" $cargs record="$TMP/$name.rec" \
            record_lines="$lines" ready="$TMP/$name.ready" >"$TMP/$name.check" 2>&1 &
        pp=$!
        PIDS+=("$pp")
        wait_file "$TMP/$name.ready" 10 || { fail "$name: checker not ready"; kill "$pp"; return; }
        timeout 60 "$B/kvsim" --endpoint "tcp://127.0.0.1:$kp" --record "$TMP/$name.rec" \
            --wait-subscribers 300 --lossless "${kargs[@]}" 2>"$TMP/$name.kvsim" ||
            fail "$name: kvsim exit $?"
        wait "$pp"
        rc=$?
        if [ $rc = 0 ]; then
            pass "$name: $(tail -n1 "$TMP/$name.check")"
        else
            fail "$name: $(cat "$TMP/$name.check")"
        fi
    }
    wire wire-positional-uint 300 \
        "live=tcp://127.0.0.1:@P replay=tcp://127.0.0.1:@R enc=positional hash=uint" \
        --replay tcp://127.0.0.1:@R --batches 300 --linger 4000
    # 2 ranks x 120 batches + 2 restart lines; every fault kind
    wire wire-faults 242 \
        "live=tcp://127.0.0.1:@P,tcp://127.0.0.1:@P1 replay=tcp://127.0.0.1:@R,tcp://127.0.0.1:@R1 enc=map hash=int layout=new topic=eng-a" \
        --replay tcp://127.0.0.1:@R --dp-size 2 --topic eng-a --encoding map --hash int \
        --replay-layout new --batches 120 --rate 2000 --cache-blocks 64 --linger 4000 \
        --drop-live 5,7-9 --drop-forever 20 --malformed-at 30 --bad-frames-at 40 --restart-at 80
    wire wire-bin-decode 500 \
        "live=tcp://127.0.0.1:@P replay=tcp://127.0.0.1:@R enc=positional hash=bin bs=32" \
        --replay tcp://127.0.0.1:@R --hash bin --block-size 32 --workload decode --batches 500 \
        --seq-start 1000000 --linger 4000
    wire wire-map-prefill 50 "live=tcp://127.0.0.1:@P enc=map hash=uint" \
        --encoding map --workload prefill --batches 50 --linger 0

    # a reference bridge derived from the faulty run's record, through kvtail
    if [ -s "$TMP/wire-faults.rec" ]; then
        for mode in correct buggy; do
            timeout 60 "$PY" "$TMP/refbridge.py" "$TMP/wire-faults.rec" "$W" $mode \
                >"$TMP/ref-$mode.jsonl" || fail "refbridge $mode"
        done
        n=$(wc -l <"$TMP/ref-correct.jsonl")
        run_case e2e-correct 0 "$TMP/ref-correct.jsonl" --check --quiet \
            --expect-record "$TMP/wire-faults.rec" --count "$n" --timeout 10000 &&
            expect e2e-correct "messages=$n holes=0 dups=0 wrong=0 bad=0 badtok=0"
        n=$(wc -l <"$TMP/ref-buggy.jsonl")
        run_case e2e-buggy 1 "$TMP/ref-buggy.jsonl" --check --quiet \
            --expect-record "$TMP/wire-faults.rec" --count "$n" --timeout 10000 &&
            if grep -Eq " wrong=[1-9]" "$TMP/e2e-buggy.out"; then
                pass "e2e-buggy: missing barriers caught ($(grep -o 'wrong=[0-9]*' "$TMP/e2e-buggy.out"))"
            else
                fail "e2e-buggy: no WRONG entries: $(tail -n1 "$TMP/e2e-buggy.out")"
            fi
    fi
fi

if [ "$FAILS" -eq 0 ]; then
    echo "tools_selftest: PASS"
    exit 0
fi
echo "tools_selftest: $FAILS failure(s)"
exit 1
