#!/usr/bin/env bash
# runtime-packages.sh [--libs] ELF...: the Debian packages that hold the shared
# libraries the given programs and libraries load (ldd, then dpkg -S), one
# per line, sorted. Libraries found in none (gradsync's own, next to the
# programs) are skipped when they lie under one of the given files' dirs,
# otherwise it is an error: the image would miss them. With --libs: the
# real paths of those libraries instead (for prune-libraries.sh).
set -euo pipefail
libs=0
if [ "${1:-}" = --libs ]; then
  libs=1
  shift
fi
own_dirs=()
for f in "$@"; do own_dirs+=("$(cd "$(dirname "$f")/.." && pwd)"); done
pkgs=()
while read -r lib; do
  real=$(readlink -f "$lib")
  pkg=""
  # Debian 12 registers some libraries under /lib, others under /usr/lib.
  for cand in "$lib" "$real" "/usr$lib" "${lib#/usr}" "/usr$real" "${real#/usr}"; do
    pkg=$(dpkg -S "$cand" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$pkg" ] && break
  done
  if [ -z "$pkg" ]; then
    mine=0
    for d in "${own_dirs[@]}"; do [[ $real == "$d"/* ]] && mine=1; done
    if [ "$mine" = 0 ]; then
      echo "runtime-packages: no package holds $lib ($real)" >&2
      exit 1
    fi
    continue
  fi
  if [ "$libs" = 1 ]; then pkgs+=("$real"); else pkgs+=("$pkg"); fi
done < <(ldd "$@" | awk '/:$/ {next} $2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
printf '%s\n' "${pkgs[@]}" | sort -u
