#!/usr/bin/env bash
# The prepared GPU check of gradsync, for a machine with one CUDA device and
# CUDA + NCCL installed (/usr/local/cuda, or wherever CMake finds them). Run
# as is from any directory:   bash tests/gpu/run.sh [BUILD_DIR]
#
# Builds with -DGRADSYNC_WITH_NCCL=ON into BUILD_DIR (default build-gpu;
# CUDA_ARCH=NN overrides the default sm_90+PTX), then, in about 5 minutes
# (steps 1-4 as last timed; step 5 has not run on a GPU yet):
#   1. ctest -L gpu: a world-size-1 job through the real coordinator and
#      NCCL running every op x dtype against host references (input made on
#      the caller's stream behind a delay kernel; gathering results copied
#      with gs_handle_result_copy, the handle freed at once), a fused group
#      of 40 tensors; a collective queued behind a never-ending kernel failed by
#      the data-plane timeout and by the loss of the coordinator (abort path)
#   2. the CPU-side tests of the nccl path (backend selection, rendezvous)
#   3. the batched pack kernel against one cudaMemcpyAsync per tensor:
#      equal bytes, and the median time of each as a ratio
#   4. allreduce 1 KiB..256 MiB through gradsync vs ncclAllReduce called
#      directly in the same process (ratio of median times)
#   5. gradsync.torch's gathering ops (allgather, alltoall, reducescatter,
#      grouped, sparse, allgather's gradient) on CUDA tensors, results on the
#      input's device (tests/gpu/torch_gather.py; needs a CUDA build of torch
#      for /usr/bin/python3, else SKIPPED)
# and prints a short summary. Exits non-zero if any check failed; a step
# that could not run (no GPU) is reported SKIPPED, never passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-gpu}
log=$dir/gpu-run.log
t0=$(date +%s)
declare -a summary
status=0
note() { summary+=("$1"); }
step() { # step NAME TIMEOUT_S COMMAND...: runs it, its output into the log
  local name=$1 limit=$2
  shift 2
  local s=$(date +%s)
  echo "== $name" | tee -a "$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  local took=$(($(date +%s) - s))
  if [ $rc -eq 0 ]; then note "PASS     $name (${took}s)"
  elif [ $rc -eq 77 ]; then note "SKIPPED  $name (${took}s)"
  else note "FAIL     $name (exit $rc after ${took}s; see $log)"; status=1; fi
  return $rc
}

mkdir -p "$dir"
: >"$log"
echo "gradsync GPU run, $(date -u +%FT%TZ), $(uname -n)" | tee -a "$log"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true; } | tee -a "$log"

arch=()
[ -n "${CUDA_ARCH:-}" ] && arch=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH")
step "configure + build (GRADSYNC_WITH_NCCL=ON)" 600 bash -c "
  cmake -S . -B '$dir' -G Ninja -DGRADSYNC_WITH_NCCL=ON ${arch[*]} &&
  cmake --build '$dir' --target gradsyncd gradsync-run gradsync gs-gpu-worker test_gpu \
    test_backend gs-backend-worker test_nccl_rendezvous" || { printf '%s\n' "${summary[@]}"; exit 1; }

# ctest passes a test that exits 77 as "Skipped": report that as skipped
step "ctest -L gpu (ops x dtypes, fused group, timeout, abort)" 300 bash -c "
  cd '$dir' && out=\$(ctest -L gpu -V 2>&1); rc=\$?; echo \"\$out\"
  [ \$rc -ne 0 ] && exit 1
  echo \"\$out\" | grep -q 'Skipped' && exit 77
  exit 0"
step "CPU side of the nccl path (backend selection, rendezvous)" 180 \
  bash -c "cd '$dir' && ctest -R 'test_backend|test_nccl_rendezvous' --output-on-failure"
step "batched pack kernel vs per-tensor cudaMemcpyAsync" 120 "$dir/bin/gs-gpu-worker" pack-bench
step "allreduce: gradsync vs ncclAllReduce (1 KiB..256 MiB)" 240 \
  "$dir/bin/gradsync-run" -np 1 env GRADSYNC_BACKEND=nccl "$dir/bin/gs-gpu-worker" ar-bench
step "gradsync.torch gathering ops on CUDA tensors" 180 bash -c "
  /usr/bin/python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    2>/dev/null || { echo 'SKIPPED: /usr/bin/python3 has no torch that sees a CUDA device'; exit 77; }
  PYTHONPATH=\$PWD/python GRADSYNC_LIB='$dir/lib/libgradsync.so' \
    '$dir/bin/gradsync-run' -np 1 env GRADSYNC_BACKEND=nccl /usr/bin/python3 tests/gpu/torch_gather.py"

echo
echo "== summary ($(($(date +%s) - t0)) s in all)"
printf '%s\n' "${summary[@]}"
echo "-- pack kernel (median of 20):"
grep -E '^pack ' "$log" | sed 's/^/   /'
echo "-- allreduce, world size 1 (median; ratio = gradsync time / NCCL time):"
grep -E '^(\[0\] )?(bytes|[0-9]+ +[0-9.]+ )' "$log" | sed 's/^/   /'
grep -E 'stuck: |ops: |fused: |result copies: |torch-gather: ' "$log" | sed 's/^/   /'
exit $status
