#!/usr/bin/env bash
# bench/fastpath.sh — the fast path of issue 14 on and off, side by side:
# the control-plane cases of bench/control.sh run once with gradsyncd
# --fast-path on and once with off, interleaved in every round, medians
# over rounds.
#
#   bench/fastpath.sh [--build DIR] [--rounds R] [--np "2 4"] [--out FILE]
#                     [--escalating]
#
# Cases (gradsync-bench under gradsync-run, as in control.sh):
# - ctl: the ResNet-50 control-only step (161 tensors of 4 B, --scale 1e9,
#   cache warm, submissions included) and the gs_barrier before each step;
# - lat: a lone 4-byte allreduce;
# and, in the same rounds, the references of issue 14's targets when built:
# the Horovod-style negotiation over OpenMPI, cached (bench/mpi_negotiation.c,
# the bit-vector allreduce: mpi-negotiation + mpirun) and one round trip
# through gradsyncd (gradsync-rank-sim --ranks 1, its floor round).
# With --escalating, only this instead: a job whose every step goes back to
# gradsyncd (the ResNet-50 control-only step, and a step of 4 tensors of
# 4 B, each with one allgather first in each step and no barrier between
# steps: gradsync-bench --allgather first --barrier off), with the fast
# path on and --fast-path-backoff 0 (every step escalates after one fast
# round), on with gradsyncd --fast-path-backoff 64 (the default: it holds
# the fast path back after such steps) and off.
# Raw RESULT lines go to --out (default: a temporary file, printed); the
# table to stdout, with the load average. Timings are never pass/fail.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
build=${GRADSYNC_BUILD:-$root/build-bench}
rounds=3
nps="2 4"
out=""
escalating=0
while [ $# -gt 0 ]; do
  case "$1" in
  --build) build=$2; shift 2 ;;
  --rounds) rounds=$2; shift 2 ;;
  --np) nps=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  --escalating) escalating=1; shift ;;
  -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "fastpath.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
bin=$build/bin
need_bins fastpath.sh "$bin" gradsync-run gradsync-bench gradsyncd
resnet=$root/bench/workloads/resnet50.txt
[ -n "$out" ] || out=$(mktemp /tmp/gradsync-fastpath.XXXXXX)
: >"$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# rec CASE ROUND NP FP BENCH-ARGS...: one gradsync-bench run, its RESULT line kept.
# FP: on (with --fast-path-backoff 0), off, or backoff (on with
# --fast-path-backoff 64).
rec() {
  local c=$1 r=$2 np=$3 fp=$4
  shift 4
  local line coord=(--coord-arg --fast-path --coord-arg "$fp")
  [ "$fp" = on ] && coord+=(--coord-arg --fast-path-backoff --coord-arg 0)
  [ "$fp" = backoff ] && coord=(--coord-arg --fast-path-backoff --coord-arg 64)
  line=$("$bin/gradsync-run" -np "$np" --timeout 150 "${coord[@]}" \
    "$bin/gradsync-bench" "$@" 2>"$out.err" | sed -n 's/^\(\[0\] \)\{0,1\}RESULT //p' | head -1)
  if [ -z "$line" ]; then
    echo "fastpath.sh: $c (np=$np fast-path $fp, round $r) failed; its stderr:" >&2
    tail -3 "$out.err" >&2
    return
  fi
  echo "CASE $c.$fp round=$r np=$np $line" >>"$out"
}

mpi=0
[ -x "$bin/mpi-negotiation" ] && command -v mpirun >/dev/null && mpi=1
mpirun_=(mpirun --oversubscribe --mca btl tcp,self)
[ "$(id -u)" = 0 ] && mpirun_+=(--allow-run-as-root)
# ref CASE ROUND NP COMMAND...: a reference's RESULT line kept.
ref() {
  local c=$1 r=$2 np=$3
  shift 3
  local line
  line=$("$@" 2>"$out.err" | sed -n 's/^\(\[0\] \)\{0,1\}RESULT //p' | head -1)
  [ -n "$line" ] && echo "CASE $c round=$r np=$np $line" >>"$out"
}

if [ "$escalating" = 1 ]; then
  for r in $(seq 1 "$rounds"); do
    echo "fastpath.sh: round $r/$rounds (escalating steps)" >&2
    for np in $nps; do
      for fp in on backoff off; do
        rec esc "$r" "$np" "$fp" --workload "$resnet" --scale 1e9 --steps 100 --warmup 5 \
          --allgather first --barrier off
        rec esc4 "$r" "$np" "$fp" --uniform 4x4 --steps 300 --warmup 5 --allgather first \
          --barrier off
      done
    done
  done
  rm -f "$out.err"
  us() { awk -v a="$1" 'BEGIN { if (a == "nan") print "n/a"; else printf "%.0f", a * 1000 }'; }
  echo
  echo "Every step goes back to gradsyncd (one allgather first in each step, no barrier) — $(nproc) CPUs, rounds=$rounds, load average $load_before before," \
    "$(cut -d' ' -f1-3 /proc/loadavg) after, $(date -u +%Y-%m-%dT%H:%MZ), raw lines: $out"
  echo
  echo "Median µs step (each a median over rounds of the run's median step); escalations per step:"
  echo
  echo "| np | step | fast path on | on, --fast-path-backoff 64 | off | escalations/step: on / backoff 64 |"
  echo "|---|---|---|---|---|---|"
  for np in $nps; do
    for c in "esc ResNet-50 (161 x 4 B)" "esc4 4 tensors x 4 B"; do
      set -- $c
      k=$1
      shift
      echo "| $np | $* | $(us "$(med $k.on step_ms "$np")") | $(us "$(med $k.backoff step_ms "$np")") |" \
        "$(us "$(med $k.off step_ms "$np")") | $(med $k.on fast_escalations "$np") /" \
        "$(med $k.backoff fast_escalations "$np") |"
    done
  done
  exit 0
fi

for r in $(seq 1 "$rounds"); do
  echo "fastpath.sh: round $r/$rounds" >&2
  [ -x "$bin/gradsync-rank-sim" ] &&
    ref rtt "$r" 1 "$bin/gradsync-rank-sim" --ranks 1 --workload "$resnet" --cache 1 --steps 200 --warmup 5
  for np in $nps; do
    [ "$mpi" = 1 ] &&
      ref mpi "$r" "$np" "${mpirun_[@]}" -np "$np" "$bin/mpi-negotiation" --workload "$resnet" --steps 200 --warmup 5
    for fp in on off; do
      rec ctl "$r" "$np" "$fp" --workload "$resnet" --scale 1e9 --steps 100 --warmup 5
      rec lat "$r" "$np" "$fp" --raw-allreduce 4 --steps 200 --warmup 10
    done
  done
done
rm -f "$out.err"

us() { awk -v a="$1" 'BEGIN { if (a == "nan") print "n/a"; else printf "%.0f", a * 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.2f", a / b }'; }

echo
echo "gradsync fast path (issue 14), on vs off side by side — $(nproc) CPUs, rounds=$rounds," \
  "load average $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after," \
  "$(date -u +%Y-%m-%dT%H:%MZ), raw lines: $out"
echo
echo "Median µs (each a median over rounds of the run's median step):"
echo
echo "| np | case | fast path on | off | on / off | on: fast rounds/step | on: requests/step |"
echo "|---|---|---|---|---|---|---|"
for np in $nps; do
  for c in "ctl step_ms ResNet-50 control-only step" "ctl barrier_ms gs_barrier" \
    "lat step_ms lone 4 B allreduce"; do
    set -- $c
    case_=$1 key=$2
    shift 2
    on=$(med "$case_.on" "$key" "$np") off=$(med "$case_.off" "$key" "$np")
    echo "| $np | $* | $(us "$on") | $(us "$off") | $(ratio "$on" "$off") |" \
      "$(med "$case_.on" fast_rounds "$np") | $(med "$case_.on" requests "$np") |"
  done
done
echo
echo "References in the same rounds (median µs): one round trip through gradsyncd (gradsync-rank-sim"
echo "--ranks 1, floor round) and the Horovod-style negotiation over OpenMPI, cached (mpi-negotiation):"
echo
echo "| np | round trip | MPI cached step | ResNet-50 step, fast path on / MPI cached |"
echo "|---|---|---|---|"
for np in $nps; do
  m=$(med mpi step_ms "$np")
  echo "| $np | $(us "$(med rtt floor_ms 1)") | $(us "$m") | $(ratio "$(med ctl.on step_ms "$np")" "$m") |"
done
