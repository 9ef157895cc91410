#!/usr/bin/env bash
# Sets up everything on a fresh Debian 12 machine and runs the demo job:
# 4 local ranks training an MLP, gradients averaged through gradsync.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh build
exec build/bin/gradsync-run -np "${NP:-4}" build/bin/gradsync-train "$@"
