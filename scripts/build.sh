#!/usr/bin/env bash
# Configures and builds gradsync into build/ (or the dir given as $1, with
# extra CMake arguments after it). Programs land in <dir>/bin, libraries in
# <dir>/lib.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
cmake --build "$dir"
