#!/usr/bin/env bash
# valgrind memcheck over a build (default build/); fails on any error or
# definite/indirect leak.
#  1. every unit test binary;
#  2. real worker processes: gs-fast-worker jobs at np=2 under gradsync-run,
#     each rank under valgrind (gradsyncd is not), so that the library's
#     threads are checked as a training process runs them: the comm and exec
#     threads, fast rounds and their escalations, handles made and freed on
#     several application threads (the per-thread handle cache, whose cached
#     blocks are no-access to memcheck), and a mismatch error. A job passes
#     when gradsync-run exits 0, every rank printed "fast: passed", and
#     valgrind wrote nothing (one log per process, --log-file).
# About 3 minutes on 2 cores (167 s in CI on 2026-12-02, over the
# RelWithDebInfo build).
set -euo pipefail
dir=${1:-build}
supp="$(cd "$(dirname "$0")" && pwd)/valgrind.supp"
# shellcheck disable=SC2054 # the commas are inside option values
vg=(valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect
  --errors-for-leak-kinds=definite,indirect --suppressions="$supp")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
for t in "$dir"/bin/test_dtype "$dir"/bin/test_codec "$dir"/bin/test_engine "$dir"/bin/test_ring \
  "$dir"/bin/test_settings "$dir"/bin/test_handle_cache; do
  [ -x "$t" ] || continue
  if "${vg[@]}" "$t" >"$tmp/unit.log" 2>&1; then
    echo "valgrind: $(basename "$t") clean"
    pass=$((pass + 1))
  else
    echo "valgrind: $(basename "$t") FAILED"; tail -50 "$tmp/unit.log"
    fail=$((fail + 1))
  fi
done

# gs-fast-worker MODE ARGS (tests/integration/fast_worker.c):
#   steps 6 block  steps through the coordinator, then fast rounds on the
#                  exec thread
#   threads 3      4 application threads per rank submitting, waiting and
#                  freeing at once (handles recycled per thread)
#   group 6 4      grouped allreduces in fast rounds; in step 4 rank 1 groups
#                  otherwise: the step escalates and fails with the mismatch
#   timeout 8 3    rank 0's gs_wait times out while its fast round waits for
#                  rank 1 (the round goes on; a later wait completes the op)
#   persist 6 0    persistent allreduces started every step (gs_startall),
#                  restarted by a second thread as soon as its wait returns
#   dup 4          names submitted again while their ops are in flight in
#                  fast mode (cached: listed in their cache entries; and not)
run="$dir/bin/gradsync-run" worker="$dir/bin/gs-fast-worker"
if [ -x "$run" ] && [ -x "$worker" ]; then
  for job in "steps 6 block" "threads 3" "group 6 4" "timeout 8 3" "persist 6 0" "dup 4"; do
    name="gs-fast-worker ${job}"
    rm -f "$tmp"/vg.*.log "$tmp"/timedout.*
    # shellcheck disable=SC2086 # job is the worker's arguments, split on purpose
    if GS_TEST_DIR=$tmp timeout 300 "$run" -np 2 "${vg[@]}" --log-file="$tmp/vg.%p.log" "$worker" $job \
      >"$tmp/job.log" 2>&1; then
      rc=0
    else
      rc=$?
    fi
    passed=$(grep -c "fast: passed (rank [01] of 2" "$tmp/job.log" || true)
    logs=0 dirty=0
    for l in "$tmp"/vg.*.log; do
      [ -e "$l" ] || continue
      logs=$((logs + 1))
      [ -s "$l" ] && dirty=$((dirty + 1))
    done
    if [ "$rc" -eq 0 ] && [ "$passed" -eq 2 ] && [ "$logs" -eq 2 ] && [ "$dirty" -eq 0 ]; then
      echo "valgrind: $name (np 2) clean"
      pass=$((pass + 1))
    else
      echo "valgrind: $name (np 2) FAILED: gradsync-run exit $rc, $passed of 2 ranks passed," \
        "$dirty of $logs valgrind logs not empty"
      for l in "$tmp"/vg.*.log; do
        if [ -s "$l" ]; then echo "-- $l"; head -80 "$l"; fi
      done
      echo "-- job output (last 30 lines)"; tail -30 "$tmp/job.log"
      fail=$((fail + 1))
    fi
  done
else
  echo "valgrind: $run or $worker missing: worker processes not checked"
  fail=$((fail + 1))
fi
echo "valgrind: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
