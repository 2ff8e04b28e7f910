#!/usr/bin/env bash
# run.sh TEST.sh...: the integration runner of `make integration`.
#
# Runs every test given (each under `timeout $IT_TIMEOUT`, default 300 s),
# whatever the ones before it did, then lists the failed ones and ends with
#   integration: N passed, N failed
# Exit 0 when none failed, 1 otherwise.
set -u

timeout_s=${IT_TIMEOUT:-300}
passed=0
failed=0
failures=()

for t in "$@"; do
  echo "== $t"
  start=$SECONDS
  rc=0
  timeout "$timeout_s" bash "$t" || rc=$?
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    why="exit $rc"
    [ "$rc" = 124 ] && why="timed out after ${timeout_s} s"
    failures+=("$t ($why, $((SECONDS - start)) s)")
    echo "== $t FAILED ($why)"
  fi
done

if [ "$failed" -gt 0 ]; then
  echo "failed:"
  for f in "${failures[@]}"; do echo "  $f"; done
fi
echo "integration: $passed passed, $failed failed"
[ "$failed" = 0 ]
