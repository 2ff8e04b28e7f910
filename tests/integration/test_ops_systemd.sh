#!/usr/bin/env bash
# kvbridge under systemd, without systemd: the sd_notify protocol read from a
# NOTIFY_SOCKET this test binds (a tiny C listener compiled here, which also
# reports each sender's pid through SCM_CREDENTIALS):
#   READY=1 once the sources are set up, from kvbridge's own pid (NotifyAccess=main)
#   WATCHDOG=1 repeatedly, never WATCHDOG_USEC apart, only when WATCHDOG_PID is ours
#   SIGHUP: RELOADING=1 + MONOTONIC_USEC (CLOCK_MONOTONIC now), then READY=1,
#           for a valid file and for an invalid one (the running config stays)
#   SIGTERM: STOPPING=1, exit 0
# Journal log format: with JOURNAL_STREAM naming stderr's dev:inode every line
# starts with a "<N>" syslog priority; with another value the plain format.
# The units: systemd-analyze verify and security (exposure below 2.0) on both,
# copied into a temporary tree where their paths exist (skipped, with a
# message, when systemd-analyze is missing).
source "$(dirname "$0")/lib.sh"

# ---- the NOTIFY_SOCKET listener ---------------------------------------------
cat >"$T/notify_listen.c" <<'C'
/* notify_listen PATH: bind an AF_UNIX datagram socket at PATH and print one
 * line per datagram: "<CLOCK_MONOTONIC usec> <sender pid> <payload, \n -> |>". */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", argv[1]);
    unlink(argv[1]);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) { perror("notify_listen"); return 1; }
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (;;) {
        char buf[4096], cbuf[CMSG_SPACE(sizeof(struct ucred))];
        struct iovec iov = {buf, sizeof(buf) - 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                            .msg_controllen = sizeof(cbuf)};
        ssize_t n = recvmsg(fd, &mh, 0);
        if (n < 0) continue;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long pid = -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS)
                pid = ((struct ucred *)CMSG_DATA(c))->pid;
        buf[n] = 0;
        for (char *p = buf; *p; p++) if (*p == '\n') *p = '|';
        printf("%lld %ld %s\n", (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000, pid, buf);
    }
}
C
HAVE_CC=1
gcc -O1 -Wall -o "$T/notify_listen" "$T/notify_listen.c" 2>"$T/cc.log" || HAVE_CC=0

NP=$(daemon_port)
start_nats "$NP" || { bad "nats-server did not start"; finish; exit 1; }
P=$(daemon_port)
cat >"$T/good.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$P
nats:
  servers: [nats://127.0.0.1:$NP]
  flush_timeout_ms: 1000
metrics:
  listen: ""
YAML
"$BIN/kvbridge" -c "$T/good.yaml" --check >/dev/null 2>&1 || { bad "test config invalid"; cat "$T/good.yaml"; finish; exit 1; }

# notify lines: "usec pid payload"
nlines() { grep -c -- "$2" "$T/$1.notify" 2>/dev/null || true; }

# run_notified NAME WATCHDOG_PID_MODE(self|other|none) [VAR=VALUE...]: kvbridge
# with NOTIFY_SOCKET=$T/NAME.sock and WATCHDOG_USEC=400000; its pid in KVB_PID
run_notified() {
  local name=$1 wd=$2; shift 2
  rm -f "$T/$name.sock"
  start "$name-listen" "$T/notify_listen" "$T/$name.sock"
  local lpid=$LAST_PID
  wait_file "$T/$name.sock" 5 || { bad "$name: notify listener did not bind"; return 1; }
  # exec in a subshell: the daemon keeps the subshell's pid, which is $! here
  (
    export NOTIFY_SOCKET=$T/$name.sock WATCHDOG_USEC=400000
    case $wd in
      self) export WATCHDOG_PID=$BASHPID ;;
      other) export WATCHDOG_PID=1 ;;
      none) unset WATCHDOG_USEC ;;
    esac
    for kv in "$@"; do export "${kv?}"; done
    exec "$BIN/kvbridge" -c "$T/good.yaml"
  ) >"$T/$name.log" 2>&1 &
  KVB_PID=$!
  PIDS+=("$KVB_PID")
  LISTEN_PID=$lpid
  ln -sf "$name-listen.log" "$T/$name.notify"
}

if [ "$HAVE_CC" = 0 ]; then
  bad "cannot compile the NOTIFY_SOCKET listener (gcc)"; sed 's/^/     | /' "$T/cc.log"
else
  # ---- READY, WATCHDOG, RELOADING, STOPPING -----------------------------------
  run_notified main self
  if wait_log "$T/main.notify" 'READY=1' 15; then ok "READY=1 sent"; else bad "no READY=1"; fi
  expect_eq "READY=1 comes with STATUS=running" "$(nlines main 'READY=1|STATUS=running')" 1
  # kvbridge logs "running:" once the sources are set up, then sends READY=1
  expect_eq "READY=1 only once the sources are set up (already logged 'running:')" \
    "$(grep -c 'running: worker_id' "$T/main.log")" 1
  expect_eq "READY=1 sent by kvbridge's own pid (NotifyAccess=main)" \
    "$(awk '/READY=1/ { print $2; exit }' "$T/main.notify")" "$KVB_PID"
  sleep 2.5
  n=$(nlines main 'WATCHDOG=1')
  expect_ge "WATCHDOG=1 repeated (WATCHDOG_USEC 400 ms: every 200 ms; in 2.5 s)" "$n" 8
  maxgap=$(awk '/ WATCHDOG=1$/ { if (last) { g = $1 - last; if (g > m) m = g } last = $1 } END { print int(m / 1000) }' "$T/main.notify")
  expect_lt "largest interval between two WATCHDOG=1, ms (< WATCHDOG_USEC)" "$maxgap" 400
  expect_eq "every datagram comes from kvbridge's pid" \
    "$(awk -v p="$KVB_PID" '$2 != p' "$T/main.notify" | wc -l)" 0

  # reload with a valid file
  before=$(wc -l <"$T/main.notify")
  kill -HUP "$KVB_PID"
  wait_log "$T/main.log" 'reloaded' 10 || bad "no 'reloaded' in the log"
  sleep 0.3
  tail -n +"$((before + 1))" "$T/main.notify" | grep -v ' WATCHDOG=1$' >"$T/reload1.notify" || true
  expect_eq "SIGHUP: RELOADING=1 then READY=1 (valid file)" \
    "$(awk '{ sub(/\|MONOTONIC_USEC=[0-9]*/, "", $3); sub(/\|STATUS=running/, "", $3); printf "%s ", $3 }' "$T/reload1.notify")" \
    "RELOADING=1 READY=1 "
  # MONOTONIC_USEC: CLOCK_MONOTONIC at the reload, close to when it arrived
  skew=$(awk '/RELOADING=1/ { if (match($3, /MONOTONIC_USEC=[0-9]+/)) { m = substr($3, RSTART + 15, RLENGTH - 15); d = $1 - m; if (d < 0) d = -d; print int(d / 1000) } else print "none"; exit }' "$T/reload1.notify")
  expect_lt "RELOADING=1 carries MONOTONIC_USEC within 1 s of CLOCK_MONOTONIC (ms off)" "$skew" 1000

  # reload with an invalid file: still RELOADING=1 + READY=1, kvbridge stays up
  cp "$T/good.yaml" "$T/good.yaml.ok"
  printf 'worker_id: 7\nblock_size: sixteen\n' >>"$T/good.yaml"
  before=$(wc -l <"$T/main.notify")
  kill -HUP "$KVB_PID"
  wait_log "$T/main.log" 'keeping the running configuration' 10 || bad "invalid reload not logged"
  sleep 0.3
  tail -n +"$((before + 1))" "$T/main.notify" | grep -v ' WATCHDOG=1$' >"$T/reload2.notify" || true
  expect_eq "SIGHUP with an invalid file: RELOADING=1 then READY=1" \
    "$(awk '{ sub(/\|MONOTONIC_USEC=[0-9]*/, "", $3); sub(/\|STATUS=running/, "", $3); printf "%s ", $3 }' "$T/reload2.notify")" \
    "RELOADING=1 READY=1 "
  kill -0 "$KVB_PID" 2>/dev/null && ok "kvbridge still running after an invalid reload" || bad "kvbridge died on an invalid reload"
  cp "$T/good.yaml.ok" "$T/good.yaml"
  # watchdog still going after the reloads
  n1=$(nlines main 'WATCHDOG=1'); sleep 0.6; n2=$(nlines main 'WATCHDOG=1')
  expect_ge "WATCHDOG=1 continues after the reloads (in 0.6 s)" "$((n2 - n1))" 2

  # SIGTERM
  signal_pid "$KVB_PID" TERM 15
  expect_eq "SIGTERM: exit code" "$RC" 0
  expect_eq "SIGTERM: STOPPING=1 sent" "$(nlines main 'STOPPING=1')" 1
  expect_eq "SIGTERM: STOPPING=1 is the last message" \
    "$(grep -v ' WATCHDOG=1$' "$T/main.notify" | tail -1 | awk '{ print $3 }' | cut -d'|' -f1)" "STOPPING=1"
  stop_pid "$LISTEN_PID" >/dev/null

  # ---- WATCHDOG_PID names another process: no WATCHDOG=1 ----------------------
  run_notified other other
  wait_log "$T/other.notify" 'READY=1' 15 || bad "other: no READY=1"
  sleep 1
  expect_eq "WATCHDOG_PID of another process: no WATCHDOG=1" "$(nlines other 'WATCHDOG=1')" 0
  signal_pid "$KVB_PID" TERM 15
  expect_eq "other: exit code" "$RC" 0
  stop_pid "$LISTEN_PID" >/dev/null

  # ---- no WATCHDOG_USEC: READY and STOPPING only ------------------------------
  run_notified nowd none
  wait_log "$T/nowd.notify" 'READY=1' 15 || bad "nowd: no READY=1"
  sleep 0.5
  signal_pid "$KVB_PID" TERM 15
  sleep 0.2
  expect_eq "without a watchdog: exactly READY=1 and STOPPING=1" \
    "$(awk '{ print $3 }' "$T/nowd.notify" | cut -d'|' -f1 | tr '\n' ' ')" "READY=1 STOPPING=1 "
  stop_pid "$LISTEN_PID" >/dev/null
fi

# ---- JOURNAL_STREAM: "<N>" priorities ----------------------------------------
# stderr to a file; JOURNAL_STREAM = that file's device:inode, as systemd sets it
# for a service whose stderr is the journal.  NATS down (a warning), a reload
# with an invalid file (errors), SIGTERM.
JP=$(daemon_port)
sed "s|nats://127.0.0.1:$NP|nats://127.0.0.1:$JP|" "$T/good.yaml" >"$T/j.yaml"
: >"$T/journal.err"
js=$(stat -c '%d:%i' "$T/journal.err")
JOURNAL_STREAM=$js "$BIN/kvbridge" -c "$T/j.yaml" >/dev/null 2>>"$T/journal.err" &
JPID=$!
PIDS+=("$JPID")
wait_log "$T/journal.err" 'running:' 15 || bad "journal: kvbridge did not start"
cp "$T/j.yaml" "$T/j.yaml.ok"
printf 'bogus_key: 1\n' >>"$T/j.yaml"
kill -HUP "$JPID"
wait_log "$T/journal.err" 'keeping the running configuration' 10 || bad "journal: invalid reload not logged"
signal_pid "$JPID" TERM 15
expect_eq "journal: exit code" "$RC" 0
expect_ge "journal: lines logged" "$(wc -l <"$T/journal.err")" 4
expect_eq "journal: info lines start with <6> (stage: message)" \
  "$(grep -c '^<6>main: running: worker_id 7' "$T/journal.err")" 1
expect_eq "journal: NATS unreachable is a warning, <4>" \
  "$(grep -c '^<4>sink: NATS not reachable yet' "$T/journal.err")" 1
expect_eq "journal: the failed reload is an error, <3>" \
  "$(grep -c '^<3>main: reload: .* is invalid' "$T/journal.err")" 1
expect_eq "journal: no line in the plain format" "$(grep -c '^kvbridge\[' "$T/journal.err")" 0
nonprio=$(grep -cv '^<[0-7]>' "$T/journal.err" || true)
expect_eq "journal: every line starts with a <N> priority" "$nonprio" 0
[ "$nonprio" = 0 ] || grep -v '^<[0-7]>' "$T/journal.err" | head -3 | sed 's/^/     | /'

# JOURNAL_STREAM naming another file: plain format
JOURNAL_STREAM=1:2 "$BIN/kvbridge" -c "$T/good.yaml" >/dev/null 2>"$T/plain.err" &
JPID=$!
PIDS+=("$JPID")
wait_log "$T/plain.err" 'running:' 15 || bad "plain: kvbridge did not start"
signal_pid "$JPID" TERM 15
expect_eq "JOURNAL_STREAM of another file: plain format" \
  "$(grep -c '^kvbridge\[main\] info: running: worker_id 7' "$T/plain.err")" 1
expect_eq "JOURNAL_STREAM of another file: no <N> prefix" "$(grep -c '^<[0-7]>' "$T/plain.err" || true)" 0

# ---- the unit files -----------------------------------------------------------
for u in kvbridge.service kvbridge@.service; do
  f=$ROOT/systemd/$u
  # shellcheck disable=SC2016  # $MAINPID is systemd's: literal in the unit
  for want in 'Type=notify' 'NotifyAccess=main' 'WatchdogSec=30' 'Restart=on-failure' \
              'RestartPreventExitStatus=78' 'ExecReload=/bin/kill -HUP $MAINPID' 'DynamicUser=yes' \
              'ProtectSystem=strict' 'UMask=0077' 'CapabilityBoundingSet=' \
              'SystemCallFilter=@system-service' 'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6'; do
    grep -qxF -- "$want" "$f" || bad "$u: no line '$want'"
  done
done
cfg_of() { sed -n 's/^ExecStart=[^ ]* -c \([^ ]*\)$/\1/p' "$ROOT/systemd/$1"; }
expect_eq "kvbridge.service: config file" "$(cfg_of kvbridge.service)" /etc/kvbridge/kvbridge.yaml
expect_eq "kvbridge@.service: config file per instance" "$(cfg_of kvbridge@.service)" /etc/kvbridge/%i.yaml
expect_eq "kvbridge@.service: ExecStartPre checks the same file" \
  "$(sed -n 's/^ExecStartPre=[^ ]* -c \([^ ]*\) --check$/\1/p' "$ROOT/systemd/kvbridge@.service")" /etc/kvbridge/%i.yaml

if ! command -v systemd-analyze >/dev/null; then
  bad "systemd-analyze is not installed (make deps: systemd)"
else
  # verify needs the executables (and the man page of Documentation=) to
  # exist: check copies of the units whose paths point into a temporary tree
  # (the binaries of build/, the man page of docs/), rewritten the way
  # `make install` rewrites them (test_ops_install.sh checks that part)
  PFX=$T/prefix
  mkdir -p "$PFX/usr/bin" "$PFX/usr/share/man/man8" "$PFX/usr/lib/systemd/system"
  ln -s "$BIN/kvbridge" "$PFX/usr/bin/kvbridge"
  ln -s "$ROOT/docs/kvbridge.8" "$PFX/usr/share/man/man8/kvbridge.8"
  if (set -e; for u in kvbridge.service kvbridge@.service; do
        sed -e "s|/usr/local/bin/|$PFX/usr/bin/|g" -e "s|/etc/kvbridge/|$PFX/etc/kvbridge/|g" \
          "$ROOT/systemd/$u" >"$PFX/usr/lib/systemd/system/$u"; done); then
    UD=$PFX/usr/lib/systemd/system
    for u in kvbridge.service kvbridge@.service kvbridge@vllm-0.service; do
      out=$(MANPATH=$PFX/usr/share/man SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$UD/$u" 2>&1) && rc=0 || rc=$?
      # shellcheck disable=SC2001  # sed indents every line of $out
      if [ "$rc" = 0 ] && [ -z "$out" ]; then ok "systemd-analyze verify $u"; else bad "systemd-analyze verify $u (rc $rc)"; echo "$out" | sed 's/^/     | /'; fi
    done
    if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
      for u in kvbridge.service kvbridge@.service; do
        score=$(systemd-analyze security --offline=true "$UD/$u" 2>&1 | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
        if [ -n "$score" ] && awk -v s="$score" 'BEGIN { exit !(s < 2.0) }'; then
          ok "systemd-analyze security $u: exposure $score (< 2.0)"
        else
          bad "systemd-analyze security $u: exposure '$score', want < 2.0"
        fi
      done
    else
      bad "systemd-analyze security has no --offline (systemd < 252; Debian 12 has 252)"
    fi
  else
    bad "cannot copy the units"
  fi
fi

# ---- the sandbox lets kvbridge do its work ----------------------------------------
# Every system call and socket family kvbridge uses (traced with strace over a
# run with an engine, a gap filled by replay, metrics scrapes, state.dir, a
# reload and a stop) is allowed by the units' SystemCallFilter= and
# RestrictAddressFamilies= (a denied call fails with EPERM, and libzmq aborts
# on some).
if ! command -v strace >/dev/null || ! command -v systemd-analyze >/dev/null; then
  bad "the syscall check needs strace and systemd-analyze (make deps)"
else
  SP=$(daemon_port 2); SMP=$(daemon_port)
  mkdir -p "$T/state"
  cat >"$T/trace.yaml" <<YAML
worker_id: 7
block_size: 16
sources:
  - endpoint: tcp://127.0.0.1:$SP
    replay_endpoint: tcp://127.0.0.1:$((SP + 1))
nats:
  servers: [nats://127.0.0.1:$NP]
metrics:
  listen: 127.0.0.1:$SMP
state:
  dir: $T/state
YAML
  # LeakSanitizer cannot run under ptrace (it would fail the exit code of an
  # ASan build, make check-asan): no leak check for this one run, the other
  # runs of kvbridge in the tests keep it (the option is ignored by a build
  # without ASan)
  start straced env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    strace -f -qq -o "$T/trace" "$BIN/kvbridge" -c "$T/trace.yaml"
  SPID=$LAST_PID
  if wait_log "$T/straced.log" 'running:' 20; then
    timeout 30 "$BIN/kvsim" --endpoint "tcp://127.0.0.1:$SP" --replay "tcp://127.0.0.1:$((SP + 1))" \
      --wait-subscribers 1000 --linger 500 --batches 300 --rate 1000 --drop-live 100-104 \
      2>"$T/trace-sim.log" || bad_log "trace: kvsim failed" "$T/trace-sim.log"
    for _ in 1 2; do
      (exec 3<>"/dev/tcp/127.0.0.1/$SMP" && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3) >/dev/null 2>&1 || true
    done
    kpid=$(awk 'NR == 1 { print $1 }' "$T/trace")
    kill -HUP "$kpid" 2>/dev/null; sleep 0.5
    kill -TERM "$kpid" 2>/dev/null
    wait_pid "$SPID" 20
    expect_eq "traced kvbridge: exit code" "$RC" 0
    expect_eq "traced kvbridge: filled the gap" "$(count_log "$T/straced.log" 'gap filled')" 1
    expect_eq "traced kvbridge: saved its state" "$([ -s "$T/state/kvbridge.state" ] && echo yes)" yes
    # expand syscall groups: systemd-analyze syscall-filter @GROUP (nested groups too)
    expand() {
      local x
      for x in $(systemd-analyze syscall-filter "$1" | tail -n +2 | sed -n 's/^ *\([a-z_0-9@-]*\)$/\1/p'); do
        case $x in @*) expand "$x" ;; *) echo "$x" ;; esac
      done
    }
    U=$ROOT/systemd/kvbridge.service
    allow=$(sed -n 's/^SystemCallFilter=\([^~].*\)/\1/p' "$U"); deny=$(sed -n 's/^SystemCallFilter=~\(.*\)/\1/p' "$U")
    for g in $allow; do expand "$g"; done | sort -u >"$T/allowed"
    for g in $deny; do expand "$g"; done | sort -u >"$T/denied"
    comm -23 "$T/allowed" "$T/denied" >"$T/permitted"
    sed -n 's/^[0-9]* *\([a-z_0-9]*\)(.*/\1/p' "$T/trace" | sort -u >"$T/used"
    expect_ge "syscalls traced" "$(wc -l <"$T/used")" 30
    expect_eq "syscalls used but not allowed by SystemCallFilter=" \
      "$(comm -23 "$T/used" "$T/permitted" | tr '\n' ' ' | sed 's/ $//')" ""
    fams=$(sed -n 's/.* socket(\(AF_[A-Z0-9]*\),.*/\1/p' "$T/trace" | sort -u | tr '\n' ' ')
    rafs=" $(sed -n 's/^RestrictAddressFamilies=//p' "$U") "
    notok=""
    for f in $fams; do case $rafs in *" $f "*) ;; *) notok="$notok $f" ;; esac; done
    expect_eq "socket families used ($fams) allowed by RestrictAddressFamilies=" "${notok:-none}" none
  else
    bad_log "kvbridge under strace did not start" "$T/straced.log"
  fi
fi

stop_pid "$NATS_PID" >/dev/null
finish
