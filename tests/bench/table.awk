# table.awk: the benchmark table from bench-pub's result lines (raw.txt).
#   awk -v mixes="decode prefill realistic" -f table.awk raw.txt
# A label is IMPL/MIX/KIND, or IMPL/MIX/KIND#REP for repeated runs.  One row
# per (mix, impl): throughput columns = medians over the IMPL/MIX/tput runs,
# latency percentiles = medians over the IMPL/MIX/lat runs, cpu% from
# IMPL/MIX/cpu1k; rss = the largest VmHWM
# of the lat and cpu1k runs (steady load), rss_tput = the largest of the tput
# runs (with up to 4096 batches queued in front of the bridge: its ZMQ receive
# queue and the buffers of a saturated process count too); ratio = median over
# the repetitions k of batches/s(IMPL, k) / batches/s(baseline, k) (adjacent
# runs: drifting load on the machine cancels out); other% = the most CPU
# used by other processes during any of the row's runs; rq = median over the
# lat runs of the time the bridge's threads waited for a CPU, ms per second
# (near 0 on an idle machine; it is what turns into latency).  Then the team's
# targets.  (mawk-compatible.)

function ok(v) { return v != "" && v != "nan" && v != "-nan" && v != "inf" }
function fmt(f, v) { return ok(v) ? sprintf(f, v) : "-" }

# values of (base label, key) over its runs, into A[1..n]; returns n
function vals(base, key, A,    r, n) {
  n = 0
  for (r = 1; r <= NREP[base]; r++)
    if (((base, r, key) in V) && ok(V[base, r, key])) A[++n] = V[base, r, key] + 0
  return n
}
function median_of(A, n,    i, j, t) {
  if (n == 0) return ""
  for (i = 2; i <= n; i++) { t = A[i]; for (j = i - 1; j >= 1 && A[j] > t; j--) A[j + 1] = A[j]; A[j + 1] = t }
  return (n % 2) ? A[(n + 1) / 2] : (A[n / 2] + A[n / 2 + 1]) / 2
}
function med(base, key,    A, n) { n = vals(base, key, A); return median_of(A, n) }
function maxv(base, key,    A, n, i, m) {
  n = vals(base, key, A); m = ""
  for (i = 1; i <= n; i++) if (m == "" || A[i] > m) m = A[i]
  return m
}
function failed(base,    r) {
  for (r = 1; r <= NREP[base]; r++) if (V[base, r, "failed"] == "1") return 1
  return 0
}
function ratio(mix, impl,    a, b, r, n, R) {
  a = impl "/" mix "/tput"; b = "baseline/" mix "/tput"; n = 0
  for (r = 1; r <= NREP[a]; r++)
    if (ok(V[a, r, "batches_per_s"]) && ok(V[b, r, "batches_per_s"]) && V[b, r, "batches_per_s"] > 0)
      R[++n] = V[a, r, "batches_per_s"] / V[b, r, "batches_per_s"]
  return median_of(R, n)
}

/^result / {
  label = ""
  split("", kv)
  for (i = 2; i <= NF; i++) {
    eq = index($i, "=")
    if (!eq) continue
    k = substr($i, 1, eq - 1); kv[k] = substr($i, eq + 1)
    if (k == "label") label = kv[k]
  }
  if (label == "") next
  base = label; rep = 1
  if ((h = index(label, "#")) > 0) { base = substr(label, 1, h - 1); rep = substr(label, h + 1) + 0 }
  if (rep > NREP[base] + 0) NREP[base] = rep
  for (k in kv) V[base, rep, k] = kv[k]
  seen[base] = 1
}

function row(mix, impl,    t, l, c, hwm, h, st, fo, f, ht, rt, kinds, i, lab) {
  t = impl "/" mix "/tput"; l = impl "/" mix "/lat"; c = impl "/" mix "/cpu1k"
  if (!((t in seen) || (l in seen) || (c in seen))) return
  st = (failed(t) || failed(l) || failed(c)) ? "FAILED" : "ok"
  hwm = 0
  h = maxv(l, "hwm_kb"); if (h != "" && h > hwm) hwm = h
  h = maxv(c, "hwm_kb"); if (h != "" && h > hwm) hwm = h
  ht = maxv(t, "hwm_kb")
  fo = -1
  split("tput lat cpu1k", kinds, " ")
  for (i = 1; i <= 3; i++) {
    f = maxv(impl "/" mix "/" kinds[i], "foreign_pct")
    if (f != "" && f > fo) fo = f
  }
  rt = ratio(mix, impl)
  printf "%-10s %-13s %10s %10s %10s %9s %6s %8s %8s %8s %7s %6s %8s %6s %5s %s\n", mix, impl,
    fmt("%.0f", med(t, "batches_per_s")), fmt("%.0f", med(t, "events_per_s")),
    fmt("%.0f", med(t, "msgs_per_s")), fmt("%.3f", med(t, "cpu_us_per_event")),
    fmt("%.2f", rt), fmt("%.1f", med(l, "p50_us")), fmt("%.1f", med(l, "p99_us")),
    fmt("%.1f", med(l, "p999_us")), fmt("%.2f", med(c, "cpu_pct")),
    ((hwm > 0) ? sprintf("%.1f", hwm / 1024) : "-"), ((ht != "") ? sprintf("%.1f", ht / 1024) : "-"),
    ((fo >= 0) ? sprintf("%.0f", fo) : "-"), fmt("%.0f", med(l, "runq_wait_ms_per_s")), st
  RSS[impl, mix] = hwm; RSST[impl, mix] = ht; RATIO[impl, mix] = rt
}

END {
  printf "%-10s %-13s %10s %10s %10s %9s %6s %8s %8s %8s %7s %6s %8s %6s %5s %s\n", "mix", "impl",
    "batches/s", "events/s", "rev/s", "cpu_us/ev", "ratio", "p50_us", "p99_us", "p999_us",
    "cpu%@1k", "rss_MB", "rss_tput", "other%", "rq", "status"
  n = split(mixes, M, " ")
  for (i = 1; i <= n; i++) {
    row(M[i], "kvbridge"); row(M[i], "kvbridge-msgpack"); row(M[i], "baseline"); row(M[i], "baseline-asap")
  }
  print "targets (kvbridge):"
  r = RATIO["kvbridge", "decode"]
  if (ok(r))
    printf "  decode batches/s >= 0.60 x baseline: %.2f %s\n", r, ((r >= 0.60) ? "PASS" : "FAIL")
  else
    print "  decode batches/s >= 0.60 x baseline: n/a"
  for (i = 1; i <= n; i++) {
    p = med("kvbridge/" M[i] "/lat", "p99_us"); c = med("kvbridge/" M[i] "/cpu1k", "cpu_pct")
    h = RSS["kvbridge", M[i]] + 0; ht = RSST["kvbridge", M[i]] + 0
    printf "  %-10s p99 <= 200 us: %s %s | cpu <= 2%% @1k: %s %s | rss <= 20 MB: %s %s (at max rate: %s %s)\n", M[i],
      fmt("%.1f", p), (ok(p) ? ((p + 0 <= 200) ? "PASS" : "FAIL") : "n/a"),
      fmt("%.2f", c), (ok(c) ? ((c + 0 <= 2) ? "PASS" : "FAIL") : "n/a"),
      ((h > 0) ? sprintf("%.1f", h / 1024) : "-"), ((h > 0) ? ((h <= 20480) ? "PASS" : "FAIL") : "n/a"),
      ((ht > 0) ? sprintf("%.1f", ht / 1024) : "-"), ((ht > 0) ? ((ht <= 20480) ? "PASS" : "FAIL") : "n/a")
  }
  print "  (RSS flat over 10M events: make bench-rss)"
  print "targets (kvbridge-msgpack, dynamo-event-plane, decode mix):"
  r = RATIO["kvbridge-msgpack", "decode"]
  printf "  batches/s >= 0.90 x baseline: %s %s\n", fmt("%.2f", r), (ok(r) ? ((r >= 0.90) ? "PASS" : "FAIL") : "n/a")
  a = med("kvbridge-msgpack/decode/tput", "cpu_us_per_event"); b = med("kvbridge/decode/tput", "cpu_us_per_event")
  if (ok(a) && ok(b) && b > 0)
    printf "  cpu per router event <= 0.50 x dynamo-json's: %.3f / %.3f = %.2f %s\n", a, b, a / b, ((a / b <= 0.5) ? "PASS" : "FAIL")
  else
    print "  cpu per router event <= 0.50 x dynamo-json's: n/a"
  h = RSST["kvbridge-msgpack", "decode"] + 0; if (RSS["kvbridge-msgpack", "decode"] + 0 > h) h = RSS["kvbridge-msgpack", "decode"] + 0
  printf "  rss <= 20 MB: %s %s\n", ((h > 0) ? sprintf("%.1f", h / 1024) : "-"), ((h > 0) ? ((h <= 20480) ? "PASS" : "FAIL") : "n/a")
  w = med("kvbridge-msgpack/decode/tput", "wire_msgs"); e = med("kvbridge-msgpack/decode/tput", "sub_msgs")
  if (ok(w) && ok(e) && e > 0) printf "  (NATS messages per router event at max rate: %.3f)\n", w / e
}
