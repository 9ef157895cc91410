#!/usr/bin/env bash
# Every option a program's parser accepts is named in its --help text
# (gradsync-run, gradsyncctl, gradsync-train), and usage text pasted into
# README.md and docs/*.md is what --help prints. The options are read from the
# parsers' sources (the names passed to take_opt/strcmp, and the option
# tables), so a flag added to a parser without a line in its usage text
# fails here. gradsyncd's flags come from the settings table and are checked
# by test_settings (test_usage_is_whole). gradsync-train's synopsis must show
# every option but -h/--help/--version.
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

# gradsync-train's synopsis (the lines before the first blank one) lists its
# options one by one: each option of its parser but -h/--help/--version.
synopsis=$("$bin/gradsync-train" --help | sed '/^$/q')
for o in $(grep -oE '\{"--[-a-z0-9]*", |"--(seed|lr|wait)"' "$src/examples/train.c" |
  grep -oE '"--[-a-z0-9]*"' | tr -d '"' | sort -u); do
  if ! grep -qE -- "\[([^]]* )?${o}( [^]]*)?\]" <<<"$synopsis"; then
    echo "docs_usage: gradsync-train accepts $o but its usage synopsis does not show it"
    bad=1
  fi
done

# Every line of every program's --help fits 80 columns (a terminal, and
# the docs that paste it).
# Usage text pasted into the docs must be what the program prints: a fenced
# block that starts with "usage: PROGRAM" must be PROGRAM --help whole, and
# a block with at least 2 option lines whose options (the text before the
# description column, e.g. "  --bind-to core|none") start lines of a
# --help (an excerpt) must have all its lines in that --help, so a
# rewrapped description cannot leave a stale paste behind.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for prog in gradsync-run gradsyncctl gradsync-train gradsyncd; do
  "$bin/$prog" --help >"$tmp/$prog"
done
if ! python3 - "$src" "$tmp" <<'EOF'
import glob, os, re, sys
src, tmp = sys.argv[1], sys.argv[2]
helps, heads = {}, {}
bad, blocks = 0, 0


def head(line):
    """The option part of an option line: "  -x VAR, -x VAR=VALUE"."""
    m = re.match(r"^( +-\S.*?)(  |$)", line)
    return m.group(1) if m else None


for prog in ("gradsync-run", "gradsyncctl", "gradsync-train", "gradsyncd"):
    with open(os.path.join(tmp, prog)) as f:
        lines = f.read().splitlines()
    helps[prog] = set(lines)
    heads[prog] = {head(l) for l in lines if head(l)}
    for n, l in enumerate(lines, 1):
        if len(l) > 80:
            print("docs_usage: %s --help line %d is %d columns (at most 80): %r"
                  % (prog, n, len(l), l))
            bad = 1
docs = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))
for path in docs:
    with open(path) as f:
        text = f.read()
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        m = re.match(r"usage: (\S+)", block)
        if m and m.group(1) in helps:
            # the whole --help pasted: every line, none left out
            blocks += 1
            with open(os.path.join(tmp, m.group(1))) as f:
                if block != f.read():
                    print("docs_usage: %s pastes %s --help, but not as it prints now"
                          % (os.path.relpath(path, src), m.group(1)))
                    bad = 1
            continue
        opts = [head(l) for l in block.splitlines() if head(l)]
        for prog, h in helps.items():
            if len(opts) < 2 or sum(o in heads[prog] for o in opts) < 2:
                continue
            blocks += 1
            for l in block.splitlines():
                if l not in h:
                    print("docs_usage: %s pastes a line that %s --help does not print: %r"
                          % (os.path.relpath(path, src), prog, l))
                    bad = 1
print("docs_usage: %d pasted usage blocks compared with --help" % blocks)
sys.exit(bad)
EOF
then
  bad=1
fi

if [ "$bad" -ne 0 ]; then
  echo "docs_usage: FAILED: name the options above in the programs' usage texts, and paste --help into the docs as it prints"
  exit 1
fi
echo "docs_usage: every option the parsers accept is in their --help"
