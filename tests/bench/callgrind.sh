#!/usr/bin/env bash
# make bench-callgrind: instructions per engine event of the pure pipeline
# (decode -> convert -> encode, tests/bench/pipeline_bench.c) under
# valgrind --tool=callgrind, for each mix, counted only inside run_measured()
# (deterministic: the same binary and input give the same count).  Then the
# top functions by exclusive cost (callgrind_annotate), the hotspots to work on.
#
# Mixes: decode, prefill, realistic (self-encoded by benchgen.c, shapes as
# kvsim), and realistic-kvsim: the same pipeline over a capture of kvsim's own
# realistic stream (skipping its first 5000 batches, while its cache fills).
# Each also as MIX-msgpack: nats.format dynamo-msgpack (the event-plane
# batcher, a message per engine batch) instead of dynamo-json, over the same
# batches: Ir/rev of the two rows compares the formats exactly.
# Output files in $B/bench/callgrind/; the summary also in
# $B/bench/callgrind/results.txt.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CG=$OUT/callgrind
TOP=${TOP:-12}
mkdir -p "$CG"
need kvsim bench/capture bench/pipeline-bench
command -v valgrind >/dev/null || { log "valgrind is not installed (make deps)"; exit 2; }

# kvsim's realistic stream, captured (about 1 s)
CAP=$T/realistic.cap
capture_mix realistic || CAP=

summary=$CG/results.txt
{
  echo "pipeline (decode -> convert -> encode) under callgrind, commit $(version): instructions (Ir) in run_measured()"
  printf '%-24s %8s %9s %9s %13s %9s %9s %10s %9s\n' mix batches events rev Ir \
    Ir/event Ir/batch Ir/rev Ir/in_B
} >"$summary"

runs=(decode decode-msgpack prefill prefill-msgpack realistic realistic-msgpack)
[ -n "$CAP" ] && runs+=(realistic-kvsim realistic-kvsim-msgpack)
for run in "${runs[@]}"; do
  base=${run%-msgpack}
  args=(--mix "${base%-kvsim}")
  [ "$base" = realistic-kvsim ] && args+=(--capture "$CAP")
  [ "$run" != "$base" ] && args+=(--format dynamo-msgpack)
  cg=$CG/callgrind.$run.out
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect=run_measured \
    --callgrind-out-file="$cg" "$BIN/bench/pipeline-bench" "${args[@]}" \
    >"$CG/$run.txt" 2>"$CG/$run.valgrind.log" ||
    { log "callgrind: $run failed"; tail -5 "$CG/$run.valgrind.log" >&2; exit 1; }
  line=$(cat "$CG/$run.txt")
  ir=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p; s/^totals: *\([0-9]*\).*/\1/p' "$cg" | tail -1)
  batches=$(field batches "$line"); events=$(field engine_events "$line")
  rev=$(field router_events "$line"); inb=$(field in_bytes "$line")
  awk -v m="$run" -v b="$batches" -v e="$events" -v r="$rev" -v i="$ir" -v n="$inb" 'BEGIN {
    printf "%-24s %8d %9d %9d %13d %9.0f %9.0f %10.0f %9.1f\n", m, b, e, r, i, i / e, i / b, i / r, i / n }' \
    >>"$summary"
done
cat "$summary"

# callgrind_annotate's function table: the lines after the "file:function"
# header (and its rule), TOP of them; PATTERN keeps only matching ones.
table() { # table FILE TOP [PATTERN]
  awk -v top="$2" -v pat="${3:-}" '
    /file:function/ { on = 1; getline; next }
    on && NF && index($0, " [") && (pat == "" || $0 ~ pat) { if (n++ < top) print }' "$1"
}

for run in "${runs[@]}"; do
  cg=$CG/callgrind.$run.out
  callgrind_annotate --threshold=100 "$cg" >"$CG/$run.annotate.txt" 2>/dev/null || true
  callgrind_annotate --inclusive=yes --threshold=100 "$cg" >"$CG/$run.annotate-incl.txt" 2>/dev/null || true
done

# inclusive Ir of one function (as callgrind_annotate prints it), 0 if absent
incl() { # incl FILE FUNCTION
  awk -v f="$2" 'index($0, ":" f " [") { gsub(/,/, "", $1); print $1; found = 1; exit }
    END { if (!found) print 0 }' "$1"
}
{
  echo
  echo "per engine event, by stage (inclusive Ir): decode = kvb_decode_batch (msgpack_unpack inside),"
  echo "convert = kvb_convert_event (XXH3 inside), encode = kvb_encode (JSON) or kvb_mp_batcher_add +"
  echo "kvb_mp_batcher_flush (msgpack: events and envelopes), rest = the other (seq, glue)"
  printf '%-24s %9s %9s %9s %9s %9s %9s\n' mix Ir/event decode unpack convert encode rest
  for run in "${runs[@]}"; do
    f=$CG/$run.annotate-incl.txt
    line=$(cat "$CG/$run.txt")
    awk -v m="$run" -v e="$(field engine_events "$line")" -v tot="$(sed -n 's/^summary: *\([0-9]*\).*/\1/p; s/^totals: *\([0-9]*\).*/\1/p' "$CG/callgrind.$run.out" | tail -1)" \
        -v d="$(incl "$f" kvb_decode_batch)" -v u="$(incl "$f" msgpack_unpack)" \
        -v c="$(incl "$f" kvb_convert_event)" \
        -v n="$(( $(incl "$f" kvb_encode) + $(incl "$f" kvb_mp_batcher_add) + $(incl "$f" kvb_mp_batcher_flush) ))" 'BEGIN {
      printf "%-24s %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f\n", m, tot / e, d / e, u / e, c / e, n / e, (tot - d - c - n) / e }'
  done
} | tee -a "$summary"

for run in "${runs[@]}"; do
  echo
  echo "== $run: top $TOP functions by exclusive Ir (??? in libmsgpackc = its unpack state machine)"
  table "$CG/$run.annotate.txt" "$TOP"
done | tee "$CG/hotspots.txt"
