#!/usr/bin/env bash
# make check-deps: every program that a script under tests/, tools/ or .ci/
# runs must come from a Debian package that the project's own files install
# (make deps and the other deps-* targets: the package lists in $PKGS, and
# what those depend on), or from a package every Debian system has
# (Essential, or Priority required/important).  A program installed by
# hand would pass make check on this machine and fail on a fresh one.
#
# Usage: PKGS="pkg ..." mk/check-deps.sh SCRIPT...
# Prints each program it found, with its package, when VERBOSE=1.
set -euo pipefail

# Each script, as bash parses it (declare -f: one command per line, no
# comments), then awk: the first word of every command, and the program
# that the wrappers run (timeout, env, command -v, lib.sh's start and check).
commands_of() {
  bash --norc --noprofile -c 'eval "__kvb_script() {
$(cat "$1")
}" && declare -f __kvb_script' _ "$1" | awk -f "$(dirname "$0")/commands.awk"
}

# a bash builtin, keyword or function (of any of the scripts): not a program
declare -A fn=()
for f in "$@"; do
  while read -r name; do fn[$name]=1; done < <(grep -ohE '^[[:space:]]*(function[[:space:]]+)?[A-Za-z_][A-Za-z0-9_]*[[:space:]]*\(\)' "$f" |
    sed -E 's/^[[:space:]]*(function[[:space:]]+)?//; s/[[:space:]]*\(\)$//')
done

# the packages the project installs, with their dependencies (installed)
declare -A ours=()
for p in ${PKGS:-}; do ours[$p]=1; done
# (apt-cache lists each package of the closure on a line of its own)
# shellcheck disable=SC2086
while read -r p; do
  case $p in '' | '<'*) continue ;; esac
  ours[${p%%:*}]=1
done < <(apt-cache depends --recurse --installed --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances ${PKGS:-} 2>/dev/null | grep -v '^[[:space:]]' || true)

package_of() { # the package that installed program $1 (a path), or nothing
  local p=$1 alt
  p=$(readlink -f "$p")
  dpkg -S "$p" 2>/dev/null && return
  case $p in /usr/bin/* | /usr/sbin/*) alt=${p#/usr} ;; /bin/* | /sbin/*) alt=/usr$p ;; *) return 0 ;; esac
  dpkg -S "$alt" 2>/dev/null || true
}

fail=0
declare -A seen=()
for f in "$@"; do
  while read -r cmd; do
    [ -n "${fn[$cmd]:-}" ] && continue
    key="$cmd"
    [ -n "${seen[$key]:-}" ] && { seen[$key]+=" $f"; continue; }
    seen[$key]="$f"
  done < <(commands_of "$f" | sort -u)
done

for cmd in $(printf '%s\n' "${!seen[@]}" | sort); do
  case $(type -t "$cmd" 2>/dev/null || true) in builtin | keyword) continue ;; esac
  path=$(command -v "$cmd" 2>/dev/null || true)
  if [ -z "$path" ]; then
    echo "check-deps: $cmd (run by ${seen[$cmd]}) is not installed: add its Debian package to make deps"
    fail=1
    continue
  fi
  case $path in /usr/* | /bin/* | /sbin/*) ;; *)
    echo "check-deps: $cmd (run by ${seen[$cmd]}) is $path, not a Debian package's program"
    fail=1; continue ;;
  esac
  pkg=$(package_of "$path" | head -1 | cut -d: -f1)
  if [ -z "$pkg" ]; then
    echo "check-deps: $cmd ($path, run by ${seen[$cmd]}) belongs to no Debian package"
    fail=1
    continue
  fi
  pkg=${pkg%%,*}
  if [ -n "${ours[$pkg]:-}" ]; then
    [ "${VERBOSE:-0}" = 1 ] && echo "ok   $cmd: $pkg (installed by the project)"
    continue
  fi
  ess=$(dpkg-query -W -f='${Essential} ${Priority}' "$pkg" 2>/dev/null || true)
  case $ess in yes* | *required | *important)
    [ "${VERBOSE:-0}" = 1 ] && echo "ok   $cmd: $pkg ($ess)"
    continue ;;
  esac
  echo "check-deps: $cmd (run by ${seen[$cmd]}) comes from the package $pkg, which the project does not install: add it to make deps"
  fail=1
done
exit $fail
