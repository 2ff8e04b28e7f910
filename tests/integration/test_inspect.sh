#!/usr/bin/env bash
# kvbridge-inspect over every real capture reproduces expected.jsonl byte for
# byte; --decoded shows every batch; bad input gives a barrier, not a crash.
set -euo pipefail
cd "$(dirname "$0")/../.."
# the binary under test: build/ by default, KVB_BIN for another build (make
# check-asan: build/asan)
bin=${KVB_BIN:-build}/kvbridge-inspect
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok()  { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

for d in tests/data/*/; do
  [ -f "$d/expected.jsonl" ] || continue
  name=$(basename "$d")
  "$bin" --worker-id 7587890738027725506 --block-size 16 "$d" >"$tmp/$name.jsonl"
  if cmp -s "$tmp/$name.jsonl" "$d/expected.jsonl"; then ok "capture $name"; else bad "capture $name"; diff "$tmp/$name.jsonl" "$d/expected.jsonl" | head -5; fi
  # block_size auto gives the same result on these captures
  "$bin" --worker-id 7587890738027725506 "$d" >"$tmp/$name.auto"
  if cmp -s "$tmp/$name.auto" "$d/expected.jsonl"; then ok "capture $name (auto)"; else bad "capture $name (auto)"; fi
  n=$("$bin" --decoded "$d" | grep -c '"events":\[' || true)
  if [ "$n" = 12 ]; then ok "decoded $name"; else bad "decoded $name: $n batches"; fi
done

# a truncated payload among good files: barrier, the rest goes on
f=tests/data/vllm-main
head -c 100 "$f/000003.msgpack" >"$tmp/cut.msgpack"
"$bin" --worker-id 1 --block-size 16 "$f/000000.msgpack" "$tmp/cut.msgpack" "$f/000002.msgpack" >"$tmp/cut.out" 2>"$tmp/cut.err"
if [ "$(grep -c '"cleared"' "$tmp/cut.out")" = 2 ] && [ "$(wc -l <"$tmp/cut.out")" = 4 ] && grep -q "malformed batch" "$tmp/cut.err"; then
  ok "truncated payload: barrier"
else
  bad "truncated payload"; cat "$tmp/cut.out" "$tmp/cut.err"
fi
"$bin" --decoded "$tmp/cut.msgpack" | grep -q '"error":"truncated' && ok "decoded error" || bad "decoded error"

# usage errors
set +e
"$bin" >/dev/null 2>&1; rc1=$?
"$bin" --block-size 0 "$f" >/dev/null 2>&1; rc2=$?
"$bin" /nonexistent.msgpack >/dev/null 2>&1; rc3=$?
set -e
[ "$rc1" = 2 ] && [ "$rc2" = 2 ] && [ "$rc3" = 1 ] && ok "usage errors" || bad "usage errors ($rc1 $rc2 $rc3)"

echo "inspect: $pass passed, $fail failed"
[ "$fail" = 0 ]
