#!/usr/bin/env bash
# Sets up everything on a fresh Debian 12 machine and runs the whole test
# suite: the normal build's tests (every ctest label: unit, integration,
# fault, python, install, lint, container; gpu skips without a GPU), the same tests
# under AddressSanitizer + UndefinedBehaviorSanitizer, valgrind over the
# unit tests and over real worker processes (tests/valgrind.sh: np=2 jobs of
# gs-fast-worker, every rank under valgrind), and a bounded libFuzzer run of
# the codec and engine targets (scripts/fuzz.sh). Exits non-zero on the
# first failing stage.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
# Each stage's header says how long the run has taken so far (the CI budget).
stage() { echo "== $1 == ($SECONDS s in)"; }

stage "build (RelWithDebInfo)"
bash scripts/build.sh build
stage "tests"
(cd build && ctest --output-on-failure --repeat until-pass:2 -j "$jobs")

stage "build (ASan + UBSan)"
# Without the nccl backend: ASan reserves the address range the CUDA runtime
# maps (cudaGetDeviceCount then fails with "out of memory" unless
# ASAN_OPTIONS=protect_shadow_gap=0), NCCL and libcudart are not built with
# the sanitizers, and there is no GPU here to exercise them; the plain build
# above covers the nccl path's CPU side. That also keeps nvcc out of CI twice.
bash scripts/build.sh build-asan -DGRADSYNC_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DGRADSYNC_WITH_NCCL=OFF
stage "tests under ASan + UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && ctest --output-on-failure --repeat until-pass:2 -j "$jobs")
unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS

stage "unit tests and worker processes (np 2) under valgrind"
bash tests/valgrind.sh build

stage "fuzzing (libFuzzer: codec, codec + engine; 30 s each)"
bash scripts/fuzz.sh build-fuzz 30
echo "test.sh: all stages passed in $SECONDS s"
