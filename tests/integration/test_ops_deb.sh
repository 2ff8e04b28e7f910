#!/usr/bin/env bash
# The Debian package (make deb, debian/): install it with dpkg -i, check what
# it put where, remove it, purge it, and check that nothing is left.
#   installed: the binaries run (--version is include/version.h's), the
#     example config passes --check (also as the package's user), the man
#     page is found, both units and their drop-in (User=kvbridge) are there,
#     systemd-analyze verify accepts them, neither is enabled; the system user
#     (systemd-sysusers) and /var/lib/kvbridge (tmpfiles.d, 0700, its owner)
#     exist; the example is a conffile and the same as conf/kvbridge.yaml
#   remove: the programs go, the conffile and the state stay
#   purge: every file dpkg -L listed is gone (a directory may stay only while
#     another package owns it), /etc/kvbridge and /var/lib/kvbridge are gone,
#     links of units the administrator enabled are gone; the user "kvbridge"
#     stays (Debian policy: a system user is not removed, since files it owned
#     may remain elsewhere), locked and without a login shell
# Needs root (dpkg -i): skipped otherwise, with a message.  CI runs as root.
# Refuses to run when a kvbridge package is already installed (it would
# replace and purge it).  Builds the package first when it is missing or out
# of date (make deb; make deps-deb installs the tools).
source "$(dirname "$0")/lib.sh"

if [ "$(id -u)" != 0 ]; then
  echo "SKIP test_ops_deb.sh: installing a package needs root (dpkg -i); run it as root"
  exit 0
fi
if dpkg-query -W -f='${Status}' kvbridge 2>/dev/null | grep -q 'installed\|config-files'; then
  bad "a kvbridge package is already installed: this test would replace and purge it (dpkg --purge kvbridge first)"
  finish; exit 1
fi
command -v dpkg-buildpackage >/dev/null || { bad "dpkg-buildpackage missing: make deps-deb"; finish; exit 1; }

VERSION=$(sed -n 's/^#define KVB_VERSION "\(.*\)"/\1/p' "$ROOT/include/version.h")
DEB=$ROOT/build/kvbridge_${VERSION}_$(dpkg --print-architecture).deb
if make -s -C "$ROOT" deb >"$T/deb.log" 2>&1; then ok "make deb"; else bad_log "make deb" "$T/deb.log"; finish; exit 1; fi
expect_eq "make deb wrote $(basename "$DEB")" "$([ -f "$DEB" ] && echo yes)" yes
expect_eq "lintian: no error, no warning" "$(grep -c '^[EW]: ' "$ROOT/build/deb/lintian.log" || true)" 0

INSTALLED=0
purge_at_exit() { [ $INSTALLED = 0 ] || dpkg --purge kvbridge >/dev/null 2>&1 || true; cleanup; }
trap purge_at_exit EXIT

USER_BEFORE=$(getent passwd kvbridge || true)
INSTALLED=1
if dpkg -i "$DEB" >"$T/install.log" 2>&1; then ok "dpkg -i"; else bad_log "dpkg -i" "$T/install.log"; finish; exit 1; fi
dpkg -L kvbridge >"$T/files"
CONFFILES=$(dpkg-query -W -f='${Conffiles}' kvbridge | awk 'NF { print $1 }')

# programs
expect_eq "kvbridge --version" "$(/usr/bin/kvbridge --version 2>&1 || true)" "kvbridge $VERSION"
rc=0; /usr/bin/kvbridge -c /etc/kvbridge/kvbridge.yaml.example --check >"$T/check.log" 2>&1 || rc=$?
expect_eq "kvbridge -c /etc/kvbridge/kvbridge.yaml.example --check" "$rc" 0
for p in /usr/bin/kvbridge-inspect /usr/libexec/kvbridge/kvsim /usr/libexec/kvbridge/kvtail; do
  rc=0; "$p" --help >/dev/null 2>&1 || rc=$?
  expect_eq "$p --help" "$rc" 0
done
if command -v runuser >/dev/null; then
  rc=0; runuser -u kvbridge -- /usr/bin/kvbridge -c /etc/kvbridge/kvbridge.yaml.example --check >/dev/null 2>&1 || rc=$?
  expect_eq "--check as the user kvbridge" "$rc" 0
fi
if command -v man >/dev/null; then
  expect_eq "man -w 8 kvbridge" "$(man -w 8 kvbridge 2>/dev/null)" /usr/share/man/man8/kvbridge.8.gz
else
  expect_eq "man page installed" "$([ -f /usr/share/man/man8/kvbridge.8.gz ] && echo yes)" yes
fi

# units
U=/lib/systemd/system
for u in kvbridge.service kvbridge@.service; do
  expect_eq "$u installed" "$([ -f "$U/$u" ] && echo yes)" yes
  expect_eq "$u runs /usr/bin/kvbridge" \
    "$(sed -n 's/^ExecStart=\([^ ]*\) .*/\1/p' "$U/$u")" /usr/bin/kvbridge
  expect_eq "$u.d/debian.conf: User=kvbridge, DynamicUser=no" \
    "$(grep -E '^(User|DynamicUser)=' "$U/$u.d/debian.conf" 2>/dev/null | sort | tr '\n' ' ')" \
    "DynamicUser=no User=kvbridge "
  expect_eq "$u not enabled" "$(find /etc/systemd/system -path '*.wants/*' -name "${u%.service}*" 2>/dev/null | wc -l)" 0
done
if command -v systemd-analyze >/dev/null; then
  rc=0; systemd-analyze verify "$U/kvbridge.service" >"$T/verify.log" 2>&1 || rc=$?
  expect_eq "systemd-analyze verify kvbridge.service" "$rc" 0
  [ $rc = 0 ] || sed 's/^/     | /' "$T/verify.log" | head -5
fi

# user and state directory
pw=$(getent passwd kvbridge || true)
IFS=: read -r _ _ uid _ _ home shell <<<"$pw"
expect_eq "user kvbridge exists" "$([ -n "$pw" ] && echo yes)" yes
expect_lt "user kvbridge is a system user (uid)" "${uid:-99999}" 1000
expect_eq "user kvbridge: home" "$home" /var/lib/kvbridge
expect_eq "user kvbridge: no login shell" "$shell" /usr/sbin/nologin
expect_eq "group kvbridge exists" "$(getent group kvbridge >/dev/null && echo yes)" yes
expect_eq "/var/lib/kvbridge: mode and owner" "$(stat -c '%a %U:%G' /var/lib/kvbridge 2>/dev/null)" "700 kvbridge:kvbridge"

# configuration
expect_eq "conffiles" "$CONFFILES" /etc/kvbridge/kvbridge.yaml.example
cmp -s "$ROOT/conf/kvbridge.yaml" /etc/kvbridge/kvbridge.yaml.example \
  && ok "/etc/kvbridge/kvbridge.yaml.example is conf/kvbridge.yaml" || bad "kvbridge.yaml.example differs from conf/kvbridge.yaml"
cmp -s "$ROOT/conf/kvbridge.yaml" /usr/share/doc/kvbridge/examples/kvbridge.yaml \
  && ok "/usr/share/doc/kvbridge/examples/kvbridge.yaml is conf/kvbridge.yaml" || bad "doc example differs"
expect_eq "no kvbridge.yaml shipped" "$([ -e /etc/kvbridge/kvbridge.yaml ] && echo present || echo absent)" absent

# what an administrator does: enable an instance, kvbridge keeps state
systemctl enable kvbridge@t1.service >/dev/null 2>&1 ||
  ln -s "$U/kvbridge@.service" /etc/systemd/system/multi-user.target.wants/kvbridge@t1.service
install -d -o kvbridge -g kvbridge -m 0700 /var/lib/kvbridge/t1
echo state >/var/lib/kvbridge/t1/state

# remove: programs gone, conffile and state kept
if dpkg -r kvbridge >"$T/remove.log" 2>&1; then ok "dpkg -r"; else bad_log "dpkg -r" "$T/remove.log"; fi
expect_eq "after remove: /usr/bin/kvbridge gone" "$([ -e /usr/bin/kvbridge ] && echo present || echo gone)" gone
expect_eq "after remove: the conffile stays" "$([ -f /etc/kvbridge/kvbridge.yaml.example ] && echo yes)" yes
expect_eq "after remove: the state stays" "$(cat /var/lib/kvbridge/t1/state 2>/dev/null)" state

# purge: nothing left
if dpkg --purge kvbridge >"$T/purge.log" 2>&1; then ok "dpkg --purge"; else bad_log "dpkg --purge" "$T/purge.log"; fi
INSTALLED=0
expect_eq "after purge: package unknown to dpkg" \
  "$(dpkg-query -W -f='${Status}' kvbridge 2>/dev/null | grep -c 'installed\|config-files' || true)" 0
left=""
while read -r f; do
  [ "$f" = "/." ] && continue
  [ -e "$f" ] || [ -L "$f" ] || continue
  if [ -d "$f" ] && dpkg-query -S "$f" >/dev/null 2>&1; then continue; fi
  left="$left $f"
done <"$T/files"
expect_eq "after purge: every file of dpkg -L gone (directories of other packages aside)" "${left:-none}" none
for d in /etc/kvbridge /var/lib/kvbridge /usr/libexec/kvbridge /usr/share/doc/kvbridge; do
  expect_eq "after purge: $d gone" "$([ -e "$d" ] && echo present || echo gone)" gone
done
expect_eq "after purge: no link to a kvbridge unit left" \
  "$(find /etc/systemd/system -name 'kvbridge*' 2>/dev/null | tr '\n' ' ')" ""
pw=$(getent passwd kvbridge || true)
expect_eq "after purge: the system user stays (Debian policy)" "$([ -n "$pw" ] && echo yes)" yes
expect_eq "after purge: the user cannot log in (shell)" "$(echo "$pw" | cut -d: -f7)" /usr/sbin/nologin
expect_eq "after purge: the user's password is locked" "$(passwd -S kvbridge 2>/dev/null | awk '{ print $2 }')" L
[ -z "$USER_BEFORE" ] && echo "     (the user kvbridge was created by this run)"
finish
