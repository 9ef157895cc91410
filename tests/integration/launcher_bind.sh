#!/bin/bash
# launcher_bind.sh BINDIR: gradsync-run --bind-to core|none and
# --report-bindings.
#
# The expectations come from the test's own affinity mask (the cpus it may
# use, as the launcher reads them), so the test holds on any machine with at
# least one cpu:
#   - --bind-to core: rank i runs on the i-th cpu of the mask, one cpu each
#     (np=2, or np=1 with a single cpu), as the rank reads its own
#     /proc/self/status; --report-bindings says the same;
#   - --bind-to none (and no flag): every rank keeps the launcher's mask;
#   - under `taskset -c LAST` (one cpu): np=1 binds to that cpu, np=2 is
#     refused with the counts and what to do, and no rank runs;
#   - a remote rank with --bind-to core, and a bad value, are refused with
#     exit status 2 and their exact texts.
# The ranks are `sh -c 'grep ...'`; --coordinator points at an address no
# rank uses, so no gradsyncd is started.
#
# Exit 0 = PASS, 1 = FAIL.
set -u
BIN=${1:?usage: launcher_bind.sh BINDIR}
BIN=$(cd "$BIN" && pwd)
TMP=$(mktemp -d /tmp/gs-bind-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
say() { echo "launcher_bind: $*"; }
fail() {
  say "FAIL: $*"
  for f in "$TMP"/*; do
    echo "---- $(basename "$f") ----"
    sed 's/^/    /' "$f"
  done
  exit 1
}
for v in $(env | sed -n 's/^\(GRADSYNC_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done

# The cpus this test may use, as the kernel lists them ("0-3,8"), and expanded.
MASK=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
CPUS=()
IFS=, read -ra parts <<<"$MASK"
for p in "${parts[@]}"; do
  if [[ $p == *-* ]]; then
    for ((c = ${p%-*}; c <= ${p#*-}; c++)); do CPUS+=("$c"); done
  else
    CPUS+=("$p")
  fi
done
[ "${#CPUS[@]}" -ge 1 ] || fail "cannot read this test's cpus from /proc/self/status ('$MASK')"
HOST=$(uname -n)
say "this test may use ${#CPUS[@]} cpu(s): $MASK"

RANK_CMD='sed -n "s/^Cpus_allowed_list:[[:space:]]*/cpus /p" /proc/self/status'
# run NAME ARGS...: gradsync-run ARGS... sh -c RANK_CMD; sets RC; sorted
# stdout in NAME.out, stderr in NAME.err.
run() {
  local name=$1
  shift
  timeout 60 "$@" --coordinator 127.0.0.1:1 sh -c "$RANK_CMD" >"$TMP/$name.raw" 2>"$TMP/$name.err"
  RC=$?
  sort "$TMP/$name.raw" >"$TMP/$name.out"
}
# expect_file NAME.EXT TEXT: the file holds exactly TEXT.
expect_file() {
  [ "$(cat "$TMP/$1")" = "$2" ] || fail "$1 is not what was expected:
$2"
}

# ---- --bind-to core -----------------------------------------------------------
np=2
[ "${#CPUS[@]}" -ge 2 ] || np=1
say "--bind-to core --report-bindings, np=$np"
run core "$BIN/gradsync-run" -np "$np" --bind-to core --report-bindings
[ "$RC" = 0 ] || fail "--bind-to core exited $RC"
want="" rep=""
for ((r = 0; r < np; r++)); do
  want+="[$r] cpus ${CPUS[$r]}"$'\n'
  rep+="gradsync-run: rank $r on $HOST: bound to cpu ${CPUS[$r]}"$'\n'
done
expect_file core.out "${want%$'\n'}"
sort "$TMP/core.err" >"$TMP/core.err.sorted"
expect_file core.err.sorted "${rep%$'\n'}"
[ "$np" = 1 ] || [ "${CPUS[0]}" != "${CPUS[1]}" ] || fail "the two ranks share cpu ${CPUS[0]}"

say "--bind-to=core without --report-bindings says nothing"
run core_quiet "$BIN/gradsync-run" -np "$np" --bind-to=core
[ "$RC" = 0 ] || fail "--bind-to=core exited $RC"
expect_file core_quiet.out "${want%$'\n'}"
expect_file core_quiet.err ""

# ---- --bind-to none, and the default ---------------------------------------
say "--bind-to none --report-bindings, np=2: the launcher's cpus"
run none "$BIN/gradsync-run" -np 2 --bind-to none --report-bindings
[ "$RC" = 0 ] || fail "--bind-to none exited $RC"
expect_file none.out "[0] cpus $MASK
[1] cpus $MASK"
sort "$TMP/none.err" >"$TMP/none.err.sorted"
expect_file none.err.sorted "gradsync-run: rank 0 on $HOST: not bound (cpus $MASK)
gradsync-run: rank 1 on $HOST: not bound (cpus $MASK)"
say "no --bind-to: not bound"
run default "$BIN/gradsync-run" -np 2
[ "$RC" = 0 ] || fail "gradsync-run without --bind-to exited $RC"
expect_file default.out "[0] cpus $MASK
[1] cpus $MASK"

# ---- one cpu: np=1 binds, np=2 is refused ------------------------------------
last=${CPUS[${#CPUS[@]} - 1]}
say "under taskset -c $last: np=1 binds to cpu $last"
run one taskset -c "$last" "$BIN/gradsync-run" -np 1 --bind-to core --report-bindings
[ "$RC" = 0 ] || fail "np=1 on one cpu exited $RC"
expect_file one.out "[0] cpus $last"
expect_file one.err "gradsync-run: rank 0 on $HOST: bound to cpu $last"
say "under taskset -c $last: np=2 is refused"
run many taskset -c "$last" "$BIN/gradsync-run" -np 2 --bind-to core
[ "$RC" = 2 ] || fail "np=2 --bind-to core on one cpu exited $RC, not 2"
expect_file many.out ""
expect_file many.err "gradsync-run: --bind-to core: 2 ranks to bind on this machine but \
gradsync-run may use only 1 cpu ($last); run at most 1 rank here, give gradsync-run more cpus \
(taskset, cpuset), or use --bind-to none"
say "under taskset -c $last: np=2 --bind-to none runs both on cpu $last"
run many_none taskset -c "$last" "$BIN/gradsync-run" -np 2 --bind-to none
[ "$RC" = 0 ] || fail "np=2 --bind-to none on one cpu exited $RC"
expect_file many_none.out "[0] cpus $last
[1] cpus $last"

# ---- refusals ---------------------------------------------------------------------
say "a remote rank with --bind-to core is refused"
run remote "$BIN/gradsync-run" -np 2 -H "$HOST:1,gs-bind-remote.invalid:1" --bind-to core
[ "$RC" = 2 ] || fail "--bind-to core with a remote rank exited $RC, not 2"
expect_file remote.err "gradsync-run: --bind-to core binds the ranks started on this machine \
only, but rank 1 runs on gs-bind-remote.invalid over ssh; use --bind-to none (bind remote ranks \
there, e.g. with taskset in the command)"
for bad in socket "" CORE; do
  say "--bind-to '$bad' is a usage error"
  run bad "$BIN/gradsync-run" -np 2 --bind-to "$bad"
  [ "$RC" = 2 ] || fail "--bind-to '$bad' exited $RC, not 2"
  [ "$(head -1 "$TMP/bad.err")" = "gradsync-run: --bind-to needs core or none, got '$bad'" ] ||
    fail "--bind-to '$bad': wrong message"
  grep -q '^usage: gradsync-run -np N' "$TMP/bad.err" || fail "--bind-to '$bad': no usage"
  expect_file bad.out ""
done
say "PASS"
