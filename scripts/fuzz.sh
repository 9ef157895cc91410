#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang
# (-fsanitize=fuzzer,address,undefined) into BUILD_DIR, writes their seed
# corpus with fuzz_seeds, and runs each target for SECONDS:
#   fuzz_codec   the protobuf codec (decode of every message type, round trip)
#   fuzz_engine  codec + engine: arbitrary bytes as each rank's Session
#                messages, driving the engine's events with a fake clock
# Usage: scripts/fuzz.sh [BUILD_DIR (build-fuzz)] [SECONDS per target (30)]
# The corpus grows in BUILD_DIR/corpus across runs; inputs that once failed
# are kept in tests/fuzz/regress/TARGET and run first, every time. A crash, leak, UB or
# failed check stops the target; its input is kept in BUILD_DIR/artifacts
# and the script exits 1 (reproduce: BUILD_DIR/bin/fuzz_NAME ARTIFACT).
# Prints the number of executions of each target.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-fuzz}
secs=${2:-30}
if ! command -v clang >/dev/null; then
  echo "fuzz: clang is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
CC=clang cmake -S . -B "$dir" -G Ninja -DGRADSYNC_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  >/dev/null
cmake --build "$dir" --target fuzz_codec fuzz_engine fuzz_seeds >/dev/null
rm -rf "$dir/seeds"
"$dir/bin/fuzz_seeds" "$dir/seeds"
mkdir -p "$dir/artifacts"
fail=0
for t in codec engine; do
  mkdir -p "$dir/corpus/$t"
  log="$dir/fuzz_$t.log"
  if "$dir/bin/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$dir/artifacts/$t-" \
      "$dir/corpus/$t" "$dir/seeds/$t" $(ls -d "tests/fuzz/regress/$t" 2>/dev/null) \
      >"$log" 2>&1; then
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz: fuzz_$t: ${execs:-?} executions in ${secs} s, ${cov:-cov: ?}, no failure"
  else
    echo "fuzz: fuzz_$t FAILED; its input is in $dir/artifacts/:"
    grep -E 'ERROR|SUMMARY|check failed|runtime error|Test unit written' "$log" | head -20
    tail -40 "$log"
    fail=1
  fi
done
exit $fail
