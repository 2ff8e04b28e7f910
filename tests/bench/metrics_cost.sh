#!/usr/bin/env bash
# Cost of metrics collection on the hot path, in instructions (callgrind):
# the pure pipeline (decode -> convert -> encode) over the same batches, built
# as usual and with -DKVB_NO_METRICS (every counter update compiled out).
#   make bench-metrics-cost
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build}
make -s B="$B" "$B/bench/pipeline-bench" >/dev/null
make -s B="$B/nometrics" OPT="-O2 -g -DKVB_NO_METRICS" "$B/nometrics/bench/pipeline-bench" >/dev/null
printf '%-10s %16s %16s %12s\n' mix Ir_metrics_on Ir_metrics_off on/off
for mix in decode prefill realistic; do
  ir=()
  for bin in "$B/bench/pipeline-bench" "$B/nometrics/bench/pipeline-bench"; do
    out=$(mktemp)
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=run_measured \
      --callgrind-out-file="$out" "$bin" --mix "$mix" >/dev/null 2>&1
    ir+=("$(sed -n 's/^summary: *\([0-9]*\).*/\1/p; s/^totals: *\([0-9]*\).*/\1/p' "$out" | tail -1)")
    rm -f "$out"
  done
  awk -v m="$mix" -v a="${ir[0]}" -v b="${ir[1]}" \
    'BEGIN { printf "%-10s %16d %16d %12.4f\n", m, a, b, a / b }'
done
