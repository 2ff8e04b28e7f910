#!/usr/bin/env bash
# make install / make uninstall (mk/install.mk) into a DESTDIR with PREFIX=/usr:
# exactly the expected files with their modes, unit ExecStart paths rewritten
# to PREFIX/bin, the example config next to (never over) a real kvbridge.yaml,
# the installed kvbridge runs, the man page renders without warnings; then
# uninstall removes every installed file and keeps the real configuration.
source "$(dirname "$0")/lib.sh"

D=$T/destdir
mkdir -p "$D"
MK=(make -s -C "$ROOT" DESTDIR="$D" PREFIX=/usr)

# every file install writes, with its mode
EXPECTED="0755 usr/bin/kvbridge
0755 usr/bin/kvbridge-inspect
0755 usr/libexec/kvbridge/kvsim
0755 usr/libexec/kvbridge/kvtail
0644 usr/lib/systemd/system/kvbridge.service
0644 usr/lib/systemd/system/kvbridge@.service
0644 etc/kvbridge/kvbridge.yaml.example
0644 usr/share/man/man8/kvbridge.8"

files() { (cd "$D" && find . -type f -printf '%m %P\n' | sed 's/^\([0-7]\{3\}\) /0\1 /' | sort -k2); }

if "${MK[@]}" install >"$T/install.log" 2>&1; then ok "make install DESTDIR=... PREFIX=/usr"; else bad_log "make install" "$T/install.log"; fi
expect_eq "installed files and modes" "$(files | tr "\n" " ")" "$(echo "$EXPECTED" | sort -k2 | tr "\n" " ")"
expect_eq "directories are 0755" "$(cd "$D" && find . -mindepth 1 -type d ! -perm 0755 | wc -l)" 0

# binaries: the same as build/, and they run.  make install ships the normal
# build (B=build), whatever KVB_BIN points the other tests at (make check-asan:
# build/asan, check-valgrind-integration: a valgrind wrapper): this test is
# about the packaging, so it compares with build/, not with $BIN.
IB=$ROOT/build
cmp -s "$IB/kvbridge" "$D/usr/bin/kvbridge" && ok "usr/bin/kvbridge is build/kvbridge" || bad "usr/bin/kvbridge differs from build/kvbridge"
expect_eq "installed kvbridge --version" "$("$D/usr/bin/kvbridge" --version 2>&1 || true)" "$("$IB/kvbridge" --version 2>&1)"
expect_eq "installed kvbridge --version format" "$( ("$D/usr/bin/kvbridge" --version || true) 2>/dev/null | grep -c '^kvbridge [0-9][0-9.]*$' || true)" 1
rc=0; "$D/usr/bin/kvbridge-inspect" --help >/dev/null 2>&1 || rc=$?
expect_eq "installed kvbridge-inspect --help" "$rc" 0
rc=0; "$D/usr/libexec/kvbridge/kvsim" --help >/dev/null 2>&1 || rc=$?
expect_eq "installed kvsim --help" "$rc" 0
rc=0; "$D/usr/libexec/kvbridge/kvtail" --help >/dev/null 2>&1 || rc=$?
expect_eq "installed kvtail --help" "$rc" 0

# units: ExecStart rewritten to PREFIX/bin, nothing else changed
for u in kvbridge.service kvbridge@.service; do
  f=$D/usr/lib/systemd/system/$u
  expect_eq "$u: ExecStart/ExecStartPre run /usr/bin/kvbridge" \
    "$(grep -E '^ExecStart(Pre)?=' "$f" | sed 's/^ExecStart\(Pre\)\{0,1\}=\([^ ]*\) .*/\2/' | sort -u)" /usr/bin/kvbridge
  expect_eq "$u: no /usr/local left outside comments" "$(grep -v '^#' "$f" | grep -c '/usr/local' || true)" 0
  expect_eq "$u: only the binary paths differ from systemd/$u" \
    "$(diff <(sed 's|/usr/local/bin/|/usr/bin/|g' "$ROOT/systemd/$u") "$f" | wc -l)" 0
done
expect_eq "kvbridge.service reads /etc/kvbridge/kvbridge.yaml" \
  "$(sed -n 's/^ExecStart=[^ ]* -c \([^ ]*\)$/\1/p' "$D/usr/lib/systemd/system/kvbridge.service")" /etc/kvbridge/kvbridge.yaml

# example config = conf/kvbridge.yaml, and it passes --check
cmp -s "$ROOT/conf/kvbridge.yaml" "$D/etc/kvbridge/kvbridge.yaml.example" && ok "kvbridge.yaml.example is conf/kvbridge.yaml" || bad "kvbridge.yaml.example differs"
rc=0; "$D/usr/bin/kvbridge" -c "$D/etc/kvbridge/kvbridge.yaml.example" --check >"$T/check.out" 2>&1 || rc=$?
expect_eq "installed kvbridge --check the example" "$rc" 0

# man page: renders without a warning, and man finds it
if command -v groff >/dev/null; then
  groff -man -ww -z "$D/usr/share/man/man8/kvbridge.8" >"$T/groff.log" 2>&1 || echo "groff failed" >>"$T/groff.log"
  expect_eq "groff -man -ww -z: no warnings" "$(wc -l <"$T/groff.log")" 0
  [ -s "$T/groff.log" ] && sed 's/^/     | /' "$T/groff.log" | head -5
else
  bad "groff is not installed (make deps: groff-base)"
fi
if command -v man >/dev/null; then
  MANWIDTH=80 man --warnings -l "$D/usr/share/man/man8/kvbridge.8" >"$T/man.out" 2>"$T/man.err" || echo "man failed" >>"$T/man.err"
  expect_eq "man -l: no warnings" "$(wc -l <"$T/man.err")" 0
  expect_ge "man -l: renders" "$(grep -c 'kvbridge_barriers_total' "$T/man.out")" 1
  expect_eq "man finds kvbridge(8) under PREFIX/share/man" \
    "$(MANPATH=$D/usr/share/man man -w 8 kvbridge 2>/dev/null)" "$D/usr/share/man/man8/kvbridge.8"
else
  bad "man is not installed (make deps: man-db)"
fi

# a real kvbridge.yaml is never overwritten (nor removed)
echo "# mine" >"$D/etc/kvbridge/kvbridge.yaml"
echo "# edited" >>"$D/etc/kvbridge/kvbridge.yaml.example"
if "${MK[@]}" install >"$T/install2.log" 2>&1; then ok "make install again"; else bad_log "make install again" "$T/install2.log"; fi
expect_eq "second install keeps kvbridge.yaml" "$(cat "$D/etc/kvbridge/kvbridge.yaml")" "# mine"
cmp -s "$ROOT/conf/kvbridge.yaml" "$D/etc/kvbridge/kvbridge.yaml.example" && ok "second install refreshes the example" || bad "example not refreshed"

# uninstall: every installed file goes, the real configuration stays
if "${MK[@]}" uninstall >"$T/uninstall.log" 2>&1; then ok "make uninstall"; else bad_log "make uninstall" "$T/uninstall.log"; fi
expect_eq "after uninstall: only kvbridge.yaml is left" "$(files)" "0644 etc/kvbridge/kvbridge.yaml"
expect_eq "after uninstall: libexec/kvbridge removed" "$([ -e "$D/usr/libexec/kvbridge" ] && echo present || echo gone)" gone
rm -f "$D/etc/kvbridge/kvbridge.yaml"
rc=0; "${MK[@]}" uninstall >"$T/uninstall2.log" 2>&1 || rc=$?
expect_eq "uninstall again (nothing left): exit code" "$rc" 0
expect_eq "after the second uninstall: /etc/kvbridge removed once empty" \
  "$([ -e "$D/etc/kvbridge" ] && echo present || echo gone)" gone
expect_eq "no file left in DESTDIR" "$(find "$D" -type f | wc -l)" 0

# default PREFIX is /usr/local
D2=$T/destdir2
mkdir -p "$D2"
if make -s -C "$ROOT" DESTDIR="$D2" install >"$T/install3.log" 2>&1; then
  expect_eq "default PREFIX: /usr/local/bin/kvbridge" "$([ -x "$D2/usr/local/bin/kvbridge" ] && echo yes)" yes
  expect_eq "default PREFIX: units under /usr/local/lib/systemd/system, running /usr/local/bin/kvbridge" \
    "$(sed -n 's/^ExecStart=\([^ ]*\) .*/\1/p' "$D2/usr/local/lib/systemd/system/kvbridge.service")" /usr/local/bin/kvbridge
  expect_eq "default PREFIX: example config still under /etc" "$([ -f "$D2/etc/kvbridge/kvbridge.yaml.example" ] && echo yes)" yes
  make -s -C "$ROOT" DESTDIR="$D2" uninstall >/dev/null 2>&1
  expect_eq "default PREFIX: uninstall leaves no file" "$(find "$D2" -type f | wc -l)" 0
else
  bad_log "make install (default PREFIX)" "$T/install3.log"
fi
finish
