#!/usr/bin/env bash
# Generates the configuration tables of docs/operator-guide.md from the
# settings table (common/settings.c), through gs-settings-doc.
#   scripts/settings-doc.sh BUILD_DIR --write   rewrite the tables in place
#   scripts/settings-doc.sh BUILD_DIR --check   exit 1 (with a diff) if the docs
#                                               differ from the code
# The tables sit between "<!-- settings:SCOPE begin ... -->" and
# "<!-- settings:SCOPE end -->" lines, SCOPE = server or worker.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: settings-doc.sh BUILD_DIR --write|--check}
mode=${2:---check}
doc=$root/docs/operator-guide.md
gen=$build/bin/gs-settings-doc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$gen" server >"$tmp/server.md"
"$gen" worker >"$tmp/worker.md"
awk -v dir="$tmp" '
  /^<!-- settings:(server|worker) begin/ {
    print
    scope = $0; sub(/^<!-- settings:/, "", scope); sub(/ .*/, "", scope)
    while ((getline line < (dir "/" scope ".md")) > 0) print line
    skipping = 1; found[scope] = 1; next
  }
  /^<!-- settings:(server|worker) end/ { skipping = 0 }
  !skipping { print }
  END { if (!found["server"] || !found["worker"]) exit 3 }
' "$doc" >"$tmp/doc.md" || { echo "settings-doc: $doc lacks the settings:server/worker markers" >&2; exit 1; }
case $mode in
--write) cp "$tmp/doc.md" "$doc" ;;
--check)
  if ! diff -u "$doc" "$tmp/doc.md"; then
    echo "settings-doc: docs/operator-guide.md does not match the settings table; run scripts/settings-doc.sh $build --write" >&2
    exit 1
  fi
  echo "settings-doc: docs/operator-guide.md matches the settings table" ;;
*) echo "settings-doc: unknown mode $mode" >&2; exit 2 ;;
esac
