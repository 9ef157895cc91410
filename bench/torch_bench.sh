#!/usr/bin/env bash
# The gradsync.torch benchmark (bench/torch_bench.py) on N local ranks
# (default 2): bench/torch_bench.sh [N] [torch_bench.py flags]. Needs a build
# (scripts/build.sh) and Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
-h | --help)
  sed -n '2,4p' bench/torch_bench.sh | sed 's/^# \{0,1\}//'
  PYTHONPATH=$PWD/python /usr/bin/python3 bench/torch_bench.py --help | sed -n '/^options:/,$p'
  exit 0
  ;;
esac
np=${1:-2}
shift || true
PYTHONPATH=$PWD/python OMP_NUM_THREADS=1 GRADSYNC_LOG_LEVEL=warn \
  build/bin/gradsync-run -np "$np" /usr/bin/python3 bench/torch_bench.py "$@" 2>&1 |
  grep -v '^\[coord\]' | sed -n 's/^\[0\] //p'
