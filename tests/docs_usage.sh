#!/usr/bin/env bash
# Every option a program's parser accepts is named in its --help text
# (gradsync-run, gradsyncctl, gradsync-train). The options are read from the
# parsers' sources (the names passed to take_opt/strcmp, and the option
# tables), so a flag added to a parser without a line in its usage text
# fails here. gradsyncd's flags come from the settings table and are checked
# by test_settings (test_usage_is_whole).
#   docs_usage.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src=${1:?usage: docs_usage.sh SOURCE_DIR BIN_DIR}
bin=${2:?usage: docs_usage.sh SOURCE_DIR BIN_DIR}
bad=0

# check PROGRAM SOURCE_FILE EXTRACT_REGEX: the quoted option names that the
# regex finds in the source must each appear in PROGRAM --help as a word
# ("-np N, -n N", "(also --launcher-agent)", "--rsh CMD").
check() {
  local prog=$1 file=$2 re=$3 help opts o n=0
  help=$("$bin/$prog" --help)
  opts=$(grep -oE "$re" "$src/$file" | grep -oE '"-[-a-z0-9]*"' | tr -d '"' | sort -u)
  [ -n "$opts" ] || { echo "docs_usage: no options found in $file (regex out of date?)"; bad=1; return; }
  for o in $opts; do
    [ "$o" != "--" ] || continue # end of options, shown as [--]
    n=$((n + 1))
    if ! grep -qE -- "(^|[[ ,(|])${o}([] ,=)|]|\$)" <<<"$help"; then
      echo "docs_usage: $prog accepts $o ($file) but its --help does not name it"
      bad=1
    fi
  done
  echo "docs_usage: $prog: $n options checked against --help"
}

check gradsync-run worker/launcher/gradsync_run.c \
  'take_opt\(argc, argv, &i, "-[-a-z0-9]*"|strcmp\(a, "-[-a-z0-9]*"\)'
check gradsyncctl server/ctl/gradsyncctl.c 'strcmp\((a|argv\[i\]), "-[-a-z0-9]*"\)'
check gradsync-train examples/train.c '\{"--[-a-z0-9]*", |strcmp\((a|key), "-[-a-z0-9]*"\)|"--(seed|lr|wait)"'

if [ "$bad" -ne 0 ]; then
  echo "docs_usage: FAILED: add the options above to the programs' usage texts"
  exit 1
fi
echo "docs_usage: every option the parsers accept is in their --help"
