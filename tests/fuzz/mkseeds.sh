#!/usr/bin/env bash
# mkseeds.sh OUT: seed corpora for the fuzz targets, from the real captures
# and configuration files (generated under build/, never committed):
#   OUT/fuzz_decode   every tests/data/*/*.msgpack payload
#   OUT/fuzz_frames   each capture folder as one record sequence (see
#                     fuzz_frames.c for the format): in order, with a gap,
#                     going back (restart), with a garbage batch, reconfigured,
#                     a batch repeated (the same bytes: a duplicate; others:
#                     a restart)
#   OUT/fuzz_config   tests/data/config/*.yaml and conf/kvbridge.yaml
#   OUT/fuzz_promtext tests/data/metrics/*.txt (engine /metrics pages, edge cases)
#   OUT/fuzz_replay   op sequences (see fuzz_replay.c): in order, gaps filled,
#                     cut replies, timeouts, restarts, blips, two streams
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:?usage: mkseeds.sh OUT}
mkdir -p "$OUT/fuzz_decode" "$OUT/fuzz_frames" "$OUT/fuzz_config" "$OUT/fuzz_promtext" "$OUT/fuzz_replay"

for f in "$ROOT"/tests/data/*/*.msgpack; do
  d=$(basename "$(dirname "$f")")
  cp "$f" "$OUT/fuzz_decode/$d-$(basename "$f")"
done
cp "$ROOT"/tests/data/config/*.yaml "$OUT/fuzz_config/"
cp "$ROOT"/conf/kvbridge.yaml "$OUT/fuzz_config/conf-kvbridge.yaml"
cp "$ROOT"/tests/data/metrics/*.txt "$OUT/fuzz_promtext/"

byte() { printf '%b' "\\x$(printf %02x "$1")"; }
# record CODE FILE: seq code, 16-bit little-endian length, payload
record() {
  local n
  n=$(stat -c %s "$2")
  [ "$n" -le 65535 ] || return 0
  byte "$1"; byte $((n & 255)); byte $((n >> 8)); cat "$2"
}
# garbage: a payload that is not msgpack
garbage() { byte 0; byte 3; byte 0; printf '\xc1\x00\x01'; }

for dir in "$ROOT"/tests/data/*/; do
  d=$(basename "$dir")
  files=("$dir"*.msgpack)
  [ -e "${files[0]}" ] || continue
  # config bytes: 0x08 auto block size + every tier; 0x0e block 16 + salt + tiers
  { byte 8; byte 0; for f in "${files[@]}"; do record 0 "$f"; done; } >"$OUT/fuzz_frames/$d-inorder"
  { byte 14; byte 1; i=0; for f in "${files[@]}"; do
      i=$((i + 1)); case $i in 4) record 5 "$f" ;; 8) record 250 "$f" ;; *) record 0 "$f" ;; esac
    done; } >"$OUT/fuzz_frames/$d-gap-restart"
  { byte 6; byte 2; i=0; for f in "${files[@]}"; do
      i=$((i + 1)); [ $i = 6 ] && garbage; [ $i = 9 ] && { byte 127; byte 24; }
      record 0 "$f"
    done; } >"$OUT/fuzz_frames/$d-garbage-reconf"
  # rejected (oversize) batches: in order, then after a gap
  { byte 8; byte 0; i=0; for f in "${files[@]}"; do
      i=$((i + 1)); case $i in 3) byte 126; record 0 "$f" ;; 7) byte 126; record 2 "$f" ;; *) record 0 "$f" ;; esac
    done; } >"$OUT/fuzz_frames/$d-reject"
  # the 3rd batch sent twice (a duplicate), then the 7th at the 6th's seq
  # (another batch at the same seq: a restart)
  { byte 8; byte 0; i=0; for f in "${files[@]}"; do
      i=$((i + 1)); record 0 "$f"; [ $i = 3 ] && record 255 "$f"
      [ $i = 6 ] && { record 255 "${files[6]}"; }
    done; } >"$OUT/fuzz_frames/$d-repeat"
  # absolute seq near the 64-bit wrap
  { byte 8; byte 0; byte 128; printf '\xff\xff\xff\xff\xff\xff\xff\xfe'
    n=$(stat -c %s "${files[0]}"); byte $((n & 255)); byte $((n >> 8)); cat "${files[0]}"
    for f in "${files[@]:1:3}"; do record 0 "$f"; done; } >"$OUT/fuzz_frames/$d-wrap"
done

# fuzz_replay: flags byte, then ops (bits 0-2 op, bit 3 stream, bits 4-7 arg)
replay_seed() { local name=$1; shift; printf '%b' "$*" >"$OUT/fuzz_replay/$name"; }
replay_seed inorder      '\x00\x00\x00\x00\x00\x00\x00\x00\x00'
replay_seed gap-filled   '\x00\x00\x00\x01\x01\x00\x00\x72\x00\x00'
replay_seed gap-timeout  '\x00\x00\x01\x00\xf4\x00\xf4'
replay_seed cut-reply    '\x00\x00\x01\x01\x01\x00\x12\x03\x72\x34\xf4\x72'
replay_seed hole-in-held '\x00\x00\x01\x00\x00\x01\x00\x00\x12\x72\x72\x72'
replay_seed restart      '\x00\x00\x00\x00\x05\x00\x00\x00'
replay_seed two-streams  '\x00\x00\x08\x01\x09\x00\x08\x72\x08\x72'
replay_seed clock-seq    '\x01\x00\x00\x01\x00\x72\x05\x00\x00'
replay_seed wrap         '\x02\x00\x00\x01\x00\x00\x00\x72\x00'
replay_seed oversize     '\x00\x00\x16\x01\x00\x16\x72\x06\x00'
replay_seed req-fails    '\x00\x00\x07\x01\x00\x00'
replay_seed blip         '\x00\x00\x00\x00\x25\x01\x00\x72\x72\x00'
replay_seed proc-restart '\x00\x00\x00\x00\x00\x05\x01\x01\x00\x72\x72\x72\x00'
replay_seed inproc-restart-in-replay '\x00\x00\x01\x00\x00\x15\x00\x00\xf4\x00'
