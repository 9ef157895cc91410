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
#   - remote ranks (through a stand-in remote shell that runs the remote
#     command here, possibly under `taskset`): the i-th rank on a host gets
#     the i-th cpu that host's session may use, read from inside the rank,
#     and --report-bindings says so; more ranks than that host's cpus is
#     refused (exit 2, exact text) and ends the job; a host listed twice
#     (and this machine under two names) is one machine: local ranks 0..
#     and distinct cpus over its entries; a host without taskset,
#     or whose taskset fails, does not start the rank (exit 127);
#   - a bad value is refused with exit status 2 and its exact text.
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
# shellcheck source=tests/integration/cpus.sh
. "$(dirname "$0")/cpus.sh"
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

# ---- remote ranks -------------------------------------------------------------
# A stand-in remote shell: called as "CMD [-p PORT] [-i FILE] HOST COMMAND"
# like ssh, it runs COMMAND in sh on this machine, so the remote command's
# binding runs for real, under whatever mask the stand-in was started with
# (`taskset -c N rsh` = a host whose sessions may use cpu N only).
# tests/integration/ssh_hosts.sh does the same over real OpenSSH.
cat >"$TMP/rsh" <<'EOF2'
#!/bin/sh
while [ $# -gt 1 ]; do shift; done
exec /bin/sh -c "$1"
EOF2
chmod +x "$TMP/rsh"
RH=gs-bind-remote.invalid
nr=2
[ "${#CPUS[@]}" -ge 2 ] || nr=1
say "--bind-to core --report-bindings, rank 0 here and $nr on $RH: each host's i-th cpu"
run remote "$BIN/gradsync-run" -np $((1 + nr)) -H "$HOST:1,$RH:$nr" --rsh "$TMP/rsh" \
  --bind-to core --report-bindings
[ "$RC" = 0 ] || fail "--bind-to core with remote ranks exited $RC"
want="[0] cpus ${CPUS[0]}"$'\n' rep="gradsync-run: rank 0 on $HOST: bound to cpu ${CPUS[0]}"$'\n'
for ((i = 0; i < nr; i++)); do
  want+="[$((i + 1))] cpus ${CPUS[$i]}"$'\n'
  rep+="gradsync-run: rank $((i + 1)) on $RH: bound to cpu ${CPUS[$i]}"$'\n'
done
expect_file remote.out "${want%$'\n'}"
sort "$TMP/remote.err" >"$TMP/remote.err.sorted"
expect_file remote.err.sorted "${rep%$'\n'}"

say "a remote host whose sessions may use cpu $last only: its rank gets cpu $last"
run remote_one "$BIN/gradsync-run" -np 2 -H "$HOST:1,$RH:1" --rsh "taskset -c $last $TMP/rsh" \
  --bind-to core --report-bindings
[ "$RC" = 0 ] || fail "--bind-to core on a one-cpu remote host exited $RC"
expect_file remote_one.out "[0] cpus ${CPUS[0]}
[1] cpus $last"
sort "$TMP/remote_one.err" >"$TMP/remote_one.err.sorted"
expect_file remote_one.err.sorted "gradsync-run: rank 0 on $HOST: bound to cpu ${CPUS[0]}
gradsync-run: rank 1 on $RH: bound to cpu $last"

if [ "$nr" = 2 ]; then
  # A host listed twice is one machine: its ranks are local ranks 0 and 1 of
  # 2 and get its cpus 0 and 1 (not both the first); so is this machine
  # under two names.
  say "-H $RH:1,localhost:1,$RH:1,$HOST:1: local ranks and cpus per machine"
  timeout 60 "$BIN/gradsync-run" -np 4 -H "$RH:1,localhost:1,$RH:1,$HOST:1" --rsh "$TMP/rsh" \
    --bind-to core --coordinator 127.0.0.1:1 sh -c "echo \"local \$GRADSYNC_LOCAL_RANK of \
\$GRADSYNC_LOCAL_SIZE \$(sed -n 's/^Cpus_allowed_list:[[:space:]]*/cpus /p' /proc/self/status)\"" \
    >"$TMP/twice.raw" 2>"$TMP/twice.err"
  RC=$?
  sort "$TMP/twice.raw" >"$TMP/twice.out"
  [ "$RC" = 0 ] || fail "a host listed twice exited $RC"
  expect_file twice.out "[0] local 0 of 2 cpus ${CPUS[0]}
[1] local 0 of 2 cpus ${CPUS[0]}
[2] local 1 of 2 cpus ${CPUS[1]}
[3] local 1 of 2 cpus ${CPUS[1]}"
  expect_file twice.err ""
fi

say "--report-bindings without --bind-to: remote ranks keep their session's cpus"
run remote_none "$BIN/gradsync-run" -np 2 -H "$RH:2" --rsh "taskset -c $last $TMP/rsh" \
  --report-bindings
[ "$RC" = 0 ] || fail "--report-bindings with remote ranks exited $RC"
expect_file remote_none.out "[0] cpus $last
[1] cpus $last"
sort "$TMP/remote_none.err" >"$TMP/remote_none.err.sorted"
expect_file remote_none.err.sorted "gradsync-run: rank 0 on $RH: not bound (cpus $last)
gradsync-run: rank 1 on $RH: not bound (cpus $last)"

# The refusal ends the job: rank 0 here (sleeping) is stopped, exit 2.
say "2 ranks on a remote host whose sessions may use 1 cpu: refused, the job ends"
start=$SECONDS
timeout 60 "$BIN/gradsync-run" -np 3 -H "$HOST:1,$RH:2" --rsh "taskset -c $last $TMP/rsh" \
  --bind-to core --coordinator 127.0.0.1:1 \
  sh -c 'if [ "$GRADSYNC_RANK" = 0 ]; then exec sleep 600; fi; echo "rank $GRADSYNC_RANK ran"' \
  >"$TMP/refused.out" 2>"$TMP/refused.err"
RC=$?
[ "$RC" = 2 ] || fail "the remote refusal exited $RC, not 2"
[ $((SECONDS - start)) -lt 30 ] || fail "the remote refusal took $((SECONDS - start)) s"
expect_file refused.out ""
expect_file refused.err "gradsync-run: --bind-to core: 2 ranks to bind on $RH but the remote \
shell there may use only 1 cpu ($last); run at most 1 rank there (-H $RH:1), give its sessions \
more cpus (the cpuset or CPUAffinity of that host's sshd), or use --bind-to none
gradsync-run: --bind-to core was refused on $RH (see above); stopping the other ranks"

say "a remote host without taskset: rank not started, the job ends"
mkdir -p "$TMP/notaskset" "$TMP/badtaskset"
ln -s "$(command -v setsid)" "$TMP/notaskset/setsid"
ln -s "$(command -v sed)" "$TMP/notaskset/sed"
run notaskset "$BIN/gradsync-run" -np 1 -H "$RH:1" --rsh "env PATH=$TMP/notaskset $TMP/rsh" \
  --bind-to core
[ "$RC" = 127 ] || fail "a remote host without taskset exited $RC, not 127"
expect_file notaskset.out ""
expect_file notaskset.err "gradsync-run: --bind-to core: rank 0 on $RH: no taskset on that \
host's PATH to bind it with; install util-linux there or use --bind-to none
gradsync-run: rank 0 on $RH was not started: its binding failed (see above); stopping the other \
ranks"

say "a remote taskset that fails: its message, rank not started"
ln -s "$(command -v setsid)" "$TMP/badtaskset/setsid"
printf '#!/bin/sh\necho "taskset: failed to set pid $3'"'"'s affinity: Invalid argument" >&2\nexit 1\n' \
  >"$TMP/badtaskset/taskset"
chmod +x "$TMP/badtaskset/taskset"
run badtaskset "$BIN/gradsync-run" -np 1 -H "$RH:1" \
  --rsh "env PATH=$TMP/badtaskset:/usr/bin:/bin $TMP/rsh" --bind-to core
[ "$RC" = 127 ] || fail "a failing remote taskset exited $RC, not 127"
expect_file badtaskset.out ""
grep -q "^gradsync-run: rank 0 on $RH: cannot bind to cpu ${CPUS[0]}: taskset: failed to set pid [0-9]*'s affinity: Invalid argument (run with --bind-to none)\$" "$TMP/badtaskset.err" ||
  fail "a failing remote taskset: wrong message"
[ "$(wc -l <"$TMP/badtaskset.err")" = 2 ] || fail "a failing remote taskset: not 2 lines"

# ---- refusals ---------------------------------------------------------------------
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
