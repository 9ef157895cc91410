#!/usr/bin/env bash
# Runs one pytest file of the Python tests with Debian's /usr/bin/python3
# (python3-torch, python3-pytest; $GRADSYNC_TEST_PYTHON names another):
# run.sh <build dir> <test file> [pytest args].
# Exit 77 (ctest SKIP) when torch or pytest is missing; pytest's exit code 5
# (no tests collected) is a failure, never a silent pass.
set -uo pipefail
build=$1
file=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
py=${GRADSYNC_TEST_PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import torch, pytest' 2>/dev/null; then
  echo "SKIP: $py cannot import torch and pytest (apt-get install python3-torch python3-pytest)"
  exit 77
fi
export GRADSYNC_BUILD_DIR=$build
cd "$here"
"$py" -m pytest -q -p no:cacheprovider "$file" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "FAIL: pytest collected no tests from $file"
  exit 1
fi
exit "$rc"
