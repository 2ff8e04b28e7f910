#!/usr/bin/env bash
# make lint-graph: the call graph between the files of src/ must have no
# cycle.  A file A calls a file B when A's object needs a global symbol
# (function or data) that B's object defines (nm: undefined in A, defined in
# B).  Two files that call each other, or any longer loop, fail the check,
# each loop printed with its files and one symbol per step:
#
#   file-graph: cycle: src/config/check.c -> src/config/value.c (kvb_cfg_parse_u64)
#                      -> src/config/check.c (kvb_cfg_shown)
#
# What the files of a folder share goes to a leaf file that calls none of
# them (src/config/util.c, src/sink/conn.c); the graphs are drawn at the top
# of the folders' private headers.
#
# Usage: mk/file-graph.sh [--edges] OBJECT...   (objects of src/*/*.c, under
# build/obj/src/).  --edges: print every edge "A -> B (symbol)" and exit 0.
set -euo pipefail

edges_only=0
if [ "${1:-}" = --edges ]; then
  edges_only=1
  shift
fi
[ $# -gt 0 ] || { echo "usage: $0 [--edges] OBJECT..." >&2; exit 2; }

# "D file symbol" for each global definition, "U file symbol" for each need
for o in "$@"; do
  f=${o#*obj/}
  f=${f%.o}.c
  nm -g --defined-only "$o" | awk -v f="$f" 'NF == 3 { print "D", f, $3 }'
  nm -u "$o" | awk -v f="$f" 'NF >= 2 { print "U", f, $NF }'
done | awk -v edges_only="$edges_only" '
  $1 == "D" { def[$3] = $2; next }
  { need[++n] = $2 SUBSEP $3 }
  END {
    for (i = 1; i <= n; i++) {
      split(need[i], a, SUBSEP)
      to = def[a[2]]
      if (to == "" || to == a[1] || ((a[1], to) in sym)) continue
      sym[a[1], to] = a[2]
      adj[a[1]] = adj[a[1]] " " to
      nodes[a[1]] = 1
    }
    if (edges_only) {
      for (k in sym) { split(k, e, SUBSEP); print e[1] " -> " e[2] " (" sym[k] ")" }
      exit 0
    }
    bad = 0
    for (v in nodes) if (!color[v]) dfs(v, 0)
    exit bad ? 1 : 0
  }
  # color: 0 unseen, 1 on the path (stack), 2 done
  function dfs(v, depth,    list, m, j, w, k, msg) {
    color[v] = 1
    stack[depth] = v
    m = split(adj[v], list, " ")
    for (j = 1; j <= m; j++) {
      w = list[j]
      if (color[w] == 1) {
        for (k = depth; stack[k] != w; k--) {}
        msg = "file-graph: cycle: " w
        for (; k < depth; k++) msg = msg " -> " stack[k + 1] " (" sym[stack[k], stack[k + 1]] ")"
        msg = msg " -> " w " (" sym[v, w] ")"
        print msg
        bad = 1
      } else if (!color[w]) {
        dfs(w, depth + 1)
      }
    }
    color[v] = 2
  }
'
