#!/usr/bin/env bash
# runtime-packages.sh ELF...: the Debian packages that hold the shared
# libraries the given programs and libraries load (ldd, then dpkg -S), one
# per line, sorted. Libraries found in none (gradsync's own, next to the
# programs) are skipped when they lie under one of the given files' dirs,
# otherwise it is an error: the image would miss them.
set -euo pipefail
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
  pkgs+=("$pkg")
done < <(ldd "$@" | awk '/:$/ {next} $2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
printf '%s\n' "${pkgs[@]}" | sort -u
