#!/usr/bin/env bash
# Runs every unit test binary of a build under valgrind memcheck; fails on
# any error or definite/indirect leak.
set -euo pipefail
dir=${1:-build}
supp="$(dirname "$0")/valgrind.supp"
pass=0 fail=0
for t in "$dir"/bin/test_dtype "$dir"/bin/test_codec "$dir"/bin/test_engine "$dir"/bin/test_ring \
  "$dir"/bin/test_settings "$dir"/bin/test_handle_cache; do
  [ -x "$t" ] || continue
  if valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect \
      --errors-for-leak-kinds=definite,indirect --suppressions="$supp" "$t" >"/tmp/vg.$$.log" 2>&1; then
    echo "valgrind: $(basename "$t") clean"
    pass=$((pass + 1))
  else
    echo "valgrind: $(basename "$t") FAILED"; tail -50 "/tmp/vg.$$.log"
    fail=$((fail + 1))
  fi
done
rm -f "/tmp/vg.$$.log"
echo "valgrind: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
