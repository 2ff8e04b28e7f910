#!/usr/bin/env bash
# kvbridge's command line and exit codes (docs/configuration.md): --check 0 / 78 with
# FILE:LINE:COL for each error, --version and --help 0, usage errors 1, a bad
# file at start 78, no NATS within nats.connect_timeout_ms 69 (in about that
# time), a source that cannot bind 1, an unusable state.dir 73; ${VAR} in
# values and --check -v.
source "$(dirname "$0")/lib.sh"

KVB=$BIN/kvbridge
run() { # run NAME ARGS...: output in $T/NAME.out, exit code in RC (bounded: 20 s)
  local name=$1; shift
  RC=0; timeout 20 "$KVB" "$@" >"$T/$name.out" 2>&1 </dev/null || RC=$?
}

run version --version
expect_eq "--version exit code" "$RC" 0
expect_eq "--version prints the version" "$(grep -c '^kvbridge [0-9][0-9.]*' "$T/version.out")" 1
run help --help
expect_eq "--help exit code" "$RC" 0
expect_eq "--help prints the usage" "$(grep -c '^usage: kvbridge -c FILE' "$T/help.out")" 1
run h -h
expect_eq "-h exit code" "$RC" 0
run noargs
expect_eq "no arguments: exit code 1" "$RC" 1
run badopt --bogus
expect_eq "unknown option: exit code 1" "$RC" 1

# a valid file
P=$(daemon_port)
SOURCES="  - endpoint: tcp://127.0.0.1:$P" NATS_URLS="nats://127.0.0.1:$P" kvbridge_config "$T/good.yaml"
run good -c "$T/good.yaml" --check
expect_eq "--check good file: exit code" "$RC" 0
expect_eq "--check good file: says ok" "$(cat "$T/good.out")" "$T/good.yaml: ok"
run example -c "$ROOT/conf/kvbridge.yaml" --check
expect_eq "--check conf/kvbridge.yaml: exit code" "$RC" 0

# a file with two errors: both reported with FILE:LINE:COL
cat >"$T/bad.yaml" <<YAML
worker_id: 7
block_size: sixteen
sources:
  - endpoint: tcp://127.0.0.1:$P
    bogus_key: 1
nats:
  servers: [nats://127.0.0.1:$P]
YAML
run bad -c "$T/bad.yaml" --check
expect_eq "--check bad file: exit code 78" "$RC" 78
expect_eq "--check bad file: block_size error at 2:13" \
  "$(grep -c "^$T/bad.yaml:2:13: block_size: " "$T/bad.out")" 1
expect_eq "--check bad file: unknown key at 5:5" \
  "$(grep -c "^$T/bad.yaml:5:5: unknown key 'sources\[0\].bogus_key'" "$T/bad.out")" 1

printf 'worker_id: 7\nblock_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:1\n   nats: [\n' >"$T/syntax.yaml"
run syntax -c "$T/syntax.yaml" --check
expect_eq "--check YAML syntax error: exit code 78" "$RC" 78
expect_eq "--check YAML syntax error: FILE:LINE:COL" "$(grep -c "^$T/syntax.yaml:[0-9]*:[0-9]*: " "$T/syntax.out")" 1

printf 'block_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:1\nnats:\n  servers: [nats://127.0.0.1:1]\n' >"$T/noworker.yaml"
run noworker -c "$T/noworker.yaml" --check
expect_eq "--check missing worker_id: exit code 78" "$RC" 78
expect_eq "--check missing worker_id: FILE:1:1" "$(grep -c "^$T/noworker.yaml:1:1: missing required key 'worker_id'" "$T/noworker.out")" 1

run missing -c "$T/does-not-exist.yaml" --check
expect_eq "--check missing file: exit code 78" "$RC" 78

run badrun -c "$T/bad.yaml"
expect_eq "running with a bad file: exit code 78" "$RC" 78

# ${VAR} in values; --check -v prints the effective values, secrets redacted
cat >"$T/env.yaml" <<'YAML'
worker_id: ${KVB_CLI_WORKER}
block_size: ${KVB_CLI_UNSET:-32}
sources:
  - endpoint: "tcp://127.0.0.1:${KVB_CLI_PORT}"
nats:
  servers: ["nats://u:${KVB_CLI_PW}@127.0.0.1:4222"]
  token: ${KVB_CLI_PW}
metrics:
  listen: ""
YAML
RC=0; KVB_CLI_WORKER=4242 KVB_CLI_PORT=$P KVB_CLI_PW=pw-s3cret timeout 20 "$KVB" -c "$T/env.yaml" --check -v \
  >"$T/env.out" 2>&1 </dev/null || RC=$?
expect_eq "--check -v with \${VAR}: exit code" "$RC" 0
expect_eq "--check -v: worker_id from the environment" "$(grep -cx 'worker_id: 4242' "$T/env.out")" 1
expect_eq "--check -v: block_size from the default" "$(grep -cx 'block_size: 32' "$T/env.out")" 1
expect_eq "--check -v: endpoint expanded" \
  "$(grep -cx "sources\[0\].endpoint: \"tcp://127.0.0.1:$P\"" "$T/env.out")" 1
expect_eq "--check -v: token redacted" "$(grep -cx 'nats.token: (redacted)' "$T/env.out")" 1
expect_eq "--check -v: no secret printed" "$(grep -c 'pw-s3cret' "$T/env.out")" 0
expect_eq "--check -v: still says ok" "$(tail -n 1 "$T/env.out")" "$T/env.yaml: ok"
RC=0; KVB_CLI_PORT=$P KVB_CLI_PW=x timeout 20 "$KVB" -c "$T/env.yaml" --check >"$T/envunset.out" 2>&1 </dev/null || RC=$?
expect_eq "--check unset variable: exit code 78" "$RC" 78
expect_eq "--check unset variable: FILE:LINE:COL and its name" \
  "$(grep -c "^$T/env.yaml:1:12: environment variable KVB_CLI_WORKER is not set" "$T/envunset.out")" 1
run verbose-alone -c "$T/good.yaml" -v
expect_eq "-v without --check: exit code 1" "$RC" 1

# state.dir: a missing one is created (mode 0700, parents too); one that
# cannot be created (under a regular file: fails as root as well) is 73, with
# --check and at start
EXTRA="state:
  dir: $T/state/a/b" SOURCES="  - endpoint: tcp://127.0.0.1:$P" NATS_URLS="nats://127.0.0.1:$P" \
  kvbridge_config "$T/statedir.yaml"
run statedir -c "$T/statedir.yaml" --check
expect_eq "--check missing state.dir: exit code 0" "$RC" 0
expect_eq "--check missing state.dir: created, mode 0700" "$(stat -c %a "$T/state/a/b" 2>&1)" 700
expect_eq "--check missing state.dir: parents 0700" "$(stat -c %a "$T/state" 2>&1)" 700
touch "$T/plainfile"
EXTRA="state:
  dir: $T/plainfile/sub" SOURCES="  - endpoint: tcp://127.0.0.1:$P" NATS_URLS="nats://127.0.0.1:$P" \
  kvbridge_config "$T/statebad.yaml"
run statebad -c "$T/statebad.yaml" --check
expect_eq "--check unusable state.dir: exit code 73" "$RC" 73
expect_eq "--check unusable state.dir: path and reason" \
  "$(grep -c "state.dir: cannot create '$T/plainfile/sub': Not a directory" "$T/statebad.out")" 1
run statebadrun -c "$T/statebad.yaml"
expect_eq "start with unusable state.dir: exit code 73" "$RC" 73
expect_eq "start with unusable state.dir: logged" \
  "$(grep -c "state.dir: cannot create '$T/plainfile/sub': Not a directory" "$T/statebadrun.out")" 1

# no NATS server within connect_timeout_ms: 69, after about that long
NP=$(daemon_port)
cat >"$T/nonats.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$P
nats:
  servers: [nats://127.0.0.1:$NP]
  connect_timeout_ms: 500
metrics:
  listen: ""
YAML
t0=$(date +%s%N)
run nonats -c "$T/nonats.yaml"
ms=$((($(date +%s%N) - t0) / 1000000))
expect_eq "no NATS within 500 ms: exit code 69" "$RC" 69
expect_ge "no NATS: waited the timeout (ms)" "$ms" 450
expect_lt "no NATS: not much longer (ms)" "$ms" 5000
expect_eq "no NATS: logged" "$(grep -c 'no NATS server reachable within 500 ms' "$T/nonats.out")" 1

# a bind source on a port that is taken: exit code 1
start_nats "$NP" || bad "nats-server did not start"
SOURCES="  - endpoint: tcp://127.0.0.1:$NP
    mode: bind" NATS_URLS="nats://127.0.0.1:$NP" kvbridge_config "$T/taken.yaml"
run taken -c "$T/taken.yaml"
expect_eq "source cannot bind: exit code 1" "$RC" 1
expect_eq "source cannot bind: logged" "$(grep -c "tcp://127.0.0.1:$NP: cannot bind" "$T/taken.out")" 1
stop_pid "$NATS_PID" >/dev/null
finish
