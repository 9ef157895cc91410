#!/bin/bash
# schedulers.sh BINDIR: ranks that take rank and size from their launcher.
#
# Each job is a fresh gradsyncd (127.0.0.1, port 0, a job token) and 3 ranks
# of the demo that get only GRADSYNC_COORDINATOR and GRADSYNC_JOB_TOKEN from
# gradsync, the rest from the launcher's own variables:
#   mpirun   Debian's OpenMPI `mpirun -np 3` (OMPI_COMM_WORLD_*), SKIP
#            without it;
#   torchrun RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE;
#   slurm    SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NODEID /
#            SLURM_TASKS_PER_NODE, as srun sets them (and an OpenMPI inside the
#            allocation wins over them);
#   k8s      JOB_COMPLETION_INDEX of a Kubernetes Indexed Job, GRADSYNC_SIZE.
# Every job must train to identical parameters and every rank's join line
# must name the variables its rank and size came from. Then the refusals: an
# Indexed Job rank without GRADSYNC_SIZE, and a torchrun RANK >= WORLD_SIZE,
# fail with a message naming what was read. Last, gradsync-run --hostfile in
# both formats (with comments) places ranks with the right local rank/size.
#
# Exit 0 = PASS, 1 = FAIL, 77 = SKIP (mpirun missing).
set -u
BIN=${1:?usage: schedulers.sh BINDIR}
BIN=$(cd "$BIN" && pwd)
TMP=$(mktemp -d /tmp/gs-sched-XXXXXX)
PIDS=()
say() { echo "schedulers: $*"; }
cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
fail() {
  say "FAIL: $*"
  for f in "$TMP"/*.out; do
    echo "---- $(basename "$f") ----"
    tail -n 30 "$f" | sed 's/^/    /'
  done
  exit 1
}
TOKEN="sched-$$-token"
# Strip whatever the test itself runs under (ctest under Slurm, ...).
for v in $(env | sed -n 's/^\(\(GRADSYNC\|HOROVOD\|OMPI\|PMI\|SLURM\|PMIX\)_[A-Za-z0-9_]*\)=.*/\1/p') \
  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE JOB_COMPLETION_INDEX MPI_LOCALRANKID MPI_LOCALNRANKS; do
  unset "$v"
done

# start_coord NAME: a gradsyncd for 3 ranks; sets ADDR.
start_coord() {
  "$BIN/gradsyncd" --world-size 3 --token "$TOKEN" >"$TMP/$1.coord.out" 2>&1 &
  CPID=$!
  PIDS+=("$CPID")
  ADDR=""
  for _ in $(seq 1 100); do
    ADDR=$(sed -n 's/^gradsyncd listening on //p' "$TMP/$1.coord.out")
    [ -n "$ADDR" ] && return 0
    sleep 0.1
  done
  fail "$1: gradsyncd did not start"
}
stop_coord() {
  kill "$CPID" 2>/dev/null
  wait "$CPID" 2>/dev/null
}
# run_rank NAME R VAR=VALUE...: one rank of the demo with only those variables
# beyond the coordinator and the token.
run_rank() {
  local name=$1 r=$2
  shift 2
  env GRADSYNC_COORDINATOR="$ADDR" GRADSYNC_JOB_TOKEN="$TOKEN" GRADSYNC_JOIN_TIMEOUT_MS=60000 "$@" \
    timeout 120 "$BIN/gradsync-train" --steps 30 >"$TMP/$name.$r.out" 2>&1 &
  PIDS+=($!)
  RPIDS+=($!)
}
wait_ranks() {
  local name=$1 p rc=0
  for p in "${RPIDS[@]}"; do wait "$p" || rc=1; done
  RPIDS=()
  [ "$rc" = 0 ] || fail "$name: a rank failed"
  grep -q "parameters identical on all 3 ranks" "$TMP/$name.0.out" || fail "$name: no identical parameters"
}
# expect_join NAME R RANKVAR SIZEVAR [LOCALSIZE FROM]
expect_join() {
  local f="$TMP/$1.$2.out"
  grep -q "as rank $2 of 3, .*(rank from $3, size from $4" "$f" ||
    fail "$1: rank $2 does not say rank from $3, size from $4"
  if [ $# -ge 6 ]; then
    grep -q "local rank [0-9]* of $5 (.*local size from $6)" "$f" ||
      fail "$1: rank $2 does not have local size $5 from $6"
  fi
}
RPIDS=()

# ---- mpirun ------------------------------------------------------------------
if command -v mpirun >/dev/null 2>&1; then
  say "mpirun -np 3"
  start_coord mpirun
  GRADSYNC_COORDINATOR="$ADDR" GRADSYNC_JOB_TOKEN="$TOKEN" OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=false \
    timeout 180 mpirun --oversubscribe --tag-output -np 3 -x GRADSYNC_COORDINATOR \
    -x GRADSYNC_JOB_TOKEN "$BIN/gradsync-train" --steps 30 >"$TMP/mpirun.out" 2>&1 ||
    fail "mpirun: exit $?"
  grep -q "parameters identical on all 3 ranks" "$TMP/mpirun.out" || fail "mpirun: no identical parameters"
  for r in 0 1 2; do
    grep -q "as rank $r of 3, local rank $r of 3 (rank from OMPI_COMM_WORLD_RANK, size from OMPI_COMM_WORLD_SIZE, local rank from OMPI_COMM_WORLD_LOCAL_RANK, local size from OMPI_COMM_WORLD_LOCAL_SIZE)" \
      "$TMP/mpirun.out" || fail "mpirun: rank $r's join line does not name OpenMPI's variables"
  done
  stop_coord
  MPI_SKIPPED=0
else
  say "mpirun not installed: the OpenMPI job is skipped"
  MPI_SKIPPED=1
fi

# ---- torchrun-style --------------------------------------------------------------
say "torchrun-style"
start_coord torch
for r in 0 1 2; do
  # a Horovod job script's HOROVOD_CYCLE_TIME on a rank: the coordinator's value wins, said once
  run_rank torch $r RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 HOROVOD_CYCLE_TIME=0.5
done
wait_ranks torch
for r in 0 1 2; do expect_join torch $r RANK WORLD_SIZE 3 LOCAL_WORLD_SIZE; done
grep -q "WARN HOROVOD_CYCLE_TIME=0.5 in this rank's environment differs from the coordinator's cycle_time_ms=1" \
  "$TMP/torch.0.out" || fail "torch: a rank's HOROVOD_CYCLE_TIME is ignored silently"
stop_coord

# ---- Slurm-style: 3 tasks as 2 + 1 on two nodes; an OpenMPI inside wins -----------
say "slurm-style"
start_coord slurm
run_rank slurm 0 SLURM_PROCID=0 SLURM_NTASKS=3 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_TASKS_PER_NODE="2,1"
run_rank slurm 1 SLURM_PROCID=1 SLURM_NTASKS=3 SLURM_LOCALID=1 SLURM_NODEID=0 SLURM_TASKS_PER_NODE="2,1"
run_rank slurm 2 SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_TASKS_PER_NODE="1" \
  OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=3
wait_ranks slurm
expect_join slurm 0 SLURM_PROCID SLURM_NTASKS 2 SLURM_TASKS_PER_NODE
expect_join slurm 1 SLURM_PROCID SLURM_NTASKS 2 SLURM_TASKS_PER_NODE
expect_join slurm 2 OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
stop_coord

# ---- Kubernetes Indexed Job ----------------------------------------------------
say "indexed-job-style"
start_coord k8s
for r in 0 1 2; do run_rank k8s $r JOB_COMPLETION_INDEX=$r GRADSYNC_SIZE=3; done
wait_ranks k8s
for r in 0 1 2; do expect_join k8s $r JOB_COMPLETION_INDEX GRADSYNC_SIZE; done
stop_coord

# ---- refusals ----------------------------------------------------------------------
say "refusals"
ADDR=127.0.0.1:1
env GRADSYNC_COORDINATOR=$ADDR JOB_COMPLETION_INDEX=1 "$BIN/gradsync-train" >"$TMP/nosize.out" 2>&1 &&
  fail "an Indexed Job rank without GRADSYNC_SIZE started"
grep -q "this process's job size is unknown: .*Scheduler variables found: JOB_COMPLETION_INDEX=1; rank 1 came from JOB_COMPLETION_INDEX" \
  "$TMP/nosize.out" || fail "the missing size is not explained"
env GRADSYNC_COORDINATOR=$ADDR RANK=3 WORLD_SIZE=3 "$BIN/gradsync-train" >"$TMP/badrank.out" 2>&1 &&
  fail "RANK=3 of WORLD_SIZE=3 started"
grep -q "RANK=3 is out of range for WORLD_SIZE=3 (set by torchrun)" "$TMP/badrank.out" ||
  fail "RANK >= WORLD_SIZE is not explained"
env GRADSYNC_COORDINATOR=$ADDR "$BIN/gradsync-train" >"$TMP/none.out" 2>&1 &&
  fail "a rank without rank or size started"
grep -q "rank and job size are unknown: .*Scheduler variables found: none" "$TMP/none.out" ||
  fail "no rank and size is not explained"
env GRADSYNC_COORDINATOR=127.0.0.1:65536 GRADSYNC_RANK=0 GRADSYNC_SIZE=1 "$BIN/gradsync-train" \
  >"$TMP/port.out" 2>&1 && fail "a coordinator port of 65536 was accepted"
grep -q "GRADSYNC_COORDINATOR='127.0.0.1:65536' is not valid: expected HOST:PORT with a port from 1 to 65535" \
  "$TMP/port.out" || fail "the bad port is not explained"

# ---- gradsync-run --hostfile, both formats ------------------------------------------
say "gradsync-run --hostfile"
cat >"$TMP/hosts" <<EOF
# Horovod's and OpenMPI's formats, with comments
localhost slots=2 max_slots=4   # OpenMPI
127.0.0.1:1                     # Horovod
EOF
GRADSYNC_GRADSYNCD="$BIN/gradsyncd" timeout 120 "$BIN/gradsync-run" --hostfile "$TMP/hosts" \
  --tag-output --cycle-time-ms=0.5 --fusion-threshold-mb 2 "$BIN/gradsync-train" --steps 30 \
  >"$TMP/hostfile.out" 2>&1 || fail "gradsync-run --hostfile: exit $?"
grep -q "parameters identical on all 3 ranks" "$TMP/hostfile.out" || fail "hostfile: no identical parameters"
# localhost and 127.0.0.1 are both this machine: local ranks 0..2 of 3 over
# the two lines (not 0..1 of 2 and 0 of 1: two local ranks 0 on one machine)
grep -q "^\[1@localhost\] .*as rank 1 of 3, local rank 1 of 3" "$TMP/hostfile.out" || fail "hostfile: rank 1 placement"
grep -q "^\[2@127.0.0.1\] .*as rank 2 of 3, local rank 2 of 3" "$TMP/hostfile.out" || fail "hostfile: rank 2 placement"
grep -q "cycle_time_ms=0.5 (--cycle-time-ms) fusion_threshold=2097152 (--fusion-threshold)" "$TMP/hostfile.out" ||
  fail "horovodrun-style flags did not reach gradsyncd"
printf 'a slots=x\n' >"$TMP/badhosts"
"$BIN/gradsync-run" --hostfile "$TMP/badhosts" true >"$TMP/badhosts.out" 2>&1 && fail "a bad hostfile was accepted"
grep -q "line 1: slots=N needs a number" "$TMP/badhosts.out" || fail "the bad hostfile line is not named"
"$BIN/gradsync-run" -np 5 -H a:2,b:2 true >"$TMP/slots.out" 2>&1 && fail "-np 5 on 4 slots was accepted"
grep -q "\-np 5 but the hosts have only 4 slots" "$TMP/slots.out" || fail "too few slots is not explained"

if [ "$MPI_SKIPPED" = 1 ]; then
  say "SKIP: everything passed but mpirun is not installed (Debian openmpi-bin)"
  exit 77
fi
say "PASS"
exit 0
