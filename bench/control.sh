#!/usr/bin/env bash
# bench/control.sh — the control plane beside its peers (issue 14;
# docs/benchmarks.md "Control plane"). bench/run.sh runs it after its own
# tables (or alone: bench/run.sh --control-only).
#
#   bench/control.sh [--build DIR] [--rounds R] [--inner K] [--pairs P] [--np "2 4"]
#                    [--sim-ranks "8 64 256 1024"] [--sim-rounds K] [--out FILE] [--plots DIR]
#                    [--quick] [--bind auto|core|none] [--workloads DIR]
#
# Binding: the MPI peer runs under mpirun's default, which binds each rank to
# a core when the job is not oversubscribed (np <= 2 here) and binds nothing
# otherwise. --bind auto (the default) does the same for gradsync: every
# gradsync-run gets --bind-to core when np <= the cpus this script may use,
# else --bind-to none; --bind core|none forces one (none: gradsync unbound
# beside a bound MPI peer, to show what binding is worth).
#
# In every round, side by side (rounds interleaved, medians over rounds):
# - a lone allreduce of 4 B .. 1 MiB: gradsync end to end (gradsync-run +
#   gradsync-bench --raw-allreduce) vs OpenMPI's MPI_Allreduce over TCP
#   (--mca btl tcp,self) — the latency-vs-size curve;
# - gs_barrier (the barrier before every gradsync-bench step);
# - the ResNet-50 control-only step: its 161 tensors at 4 B each (--scale
#   1e9), cache warm, the 161 submission calls included, vs the Horovod-style
#   negotiation over OpenMPI (bench/mpi_negotiation.c) on the same list,
#   and beside gradsync with gradsyncd --fast-path off (K runs per round,
#   --inner K, default 3) and with the 161 tensors as one
#   gs_grouped_allreduce_async per step and as persistent ops started by one
#   gs_startall per step; MPI cache on (bit-vector allreduce) and off
#   (gather + bcast), negotiation only and with the fused tiny allreduces
#   executed. Issue 14's target ratios (gradsync's three submissions / MPI
#   cached) swing most between runs, so those four cases run in P pairs per
#   np (--pairs P, default 12, spread over the rounds; --quick: 4): in a
#   pair one run of each, back to back, in the order gradsync, grouped,
#   persistent, MPI in odd pairs and the reverse in even ones; the report
#   gives each side's median, the median of the per-pair ratios, and how
#   many pairs were under the target (pairs only change how the runs are
#   ordered and summarised: the same programs, options and binding);
# - the floors of issue 14's targets: one round trip through gradsyncd (the
#   rank simulator's floor round with one rank: one request, one answer) and
#   the TCP ring alone at 4 B and 16 KiB (gs-transport-bench, when built);
# - the rank simulator (gradsync-rank-sim) at each N: per-step negotiation
#   latency of the ResNet-50 list, cache on and off, beside the floor round
#   of the same run; the coordinator's CPU per step and peak RSS (in the
#   first K rounds only with --sim-rounds K: joining 1024 simulated ranks
#   one after another takes 1-2 minutes on 2 vCPUs).
# Raw RESULT lines go to --out; tables to stdout; with gnuplot, SVG plots of
# latency vs message size and negotiation vs N go to --plots (default: a
# temporary directory, printed).
#
# Needs: a Release build (cmake -S . -B build-bench -G Ninja
# -DCMAKE_BUILD_TYPE=Release && cmake --build build-bench), OpenMPI
# (openmpi-bin, libopenmpi-dev: scripts/install-deps.sh) for the MPI peer,
# gnuplot (gnuplot-nox) for the plots. Timings are never pass/fail.
# shellcheck disable=SC2086
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
build=${GRADSYNC_BUILD:-$root/build-bench}
rounds=3
inner=3
pairs=12
nps="2 4"
simn="8 64 256 1024"
sim_rounds=""
out=""
plots=""
quick=0
bind=auto
workloads=${GRADSYNC_WORKLOADS:-$root/bench/workloads}
while [ $# -gt 0 ]; do
  case "$1" in
  --build) build=$2; shift 2 ;;
  --rounds) rounds=$2; shift 2 ;;
  --inner) inner=$2; shift 2 ;;
  --pairs) pairs=$2; shift 2 ;;
  --np) nps=$2; shift 2 ;;
  --sim-ranks) simn=$2; shift 2 ;;
  --sim-rounds) sim_rounds=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  --plots) plots=$2; shift 2 ;;
  --workloads) workloads=$2; shift 2 ;;
  --quick) quick=1; rounds=1; inner=1; pairs=4; simn="8 64"; shift ;;
  --bind) bind=$2; shift 2 ;;
  -h | --help) sed -n '2,53p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "control.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$pairs" in
'' | *[!0-9]* | 0) echo "control.sh: --pairs needs a count >= 1, got '$pairs'" >&2; exit 2 ;;
esac
case "$bind" in
auto | core | none) ;;
*) echo "control.sh: --bind needs auto, core or none, got '$bind'" >&2; exit 2 ;;
esac
bin=$build/bin
need_bins control.sh "$bin" gradsync-run gradsync-bench gradsyncd gradsync-rank-sim
resnet=$workloads/resnet50.txt
[ -r "$resnet" ] || { echo "control.sh: workload $resnet not found (--workloads DIR)" >&2; exit 1; }
mpi=0
if [ -x "$bin/mpi-negotiation" ] && command -v mpirun >/dev/null; then
  mpi=1
else
  echo "control.sh: no MPI peer ($bin/mpi-negotiation or mpirun missing: install openmpi-bin" \
    "libopenmpi-dev and rebuild); its rows are skipped" >&2
fi
[ -n "$out" ] || out=$(mktemp /tmp/gradsync-control.XXXXXX)
: >"$out"
mpirun_=(mpirun --oversubscribe --mca btl "tcp,self")
[ "$(id -u)" = 0 ] && mpirun_+=(--allow-run-as-root)
sizes="4 64 1024 16384 65536 262144 1048576"
[ "$quick" = 1 ] && sizes="4 65536"
start=$(date +%s)

# rec CASE ROUND NP COMMAND...: runs it, keeps its RESULT line (with pair=K
# after np= while $pair is K).
rec() {
  local c=$1 r=$2 np=$3
  shift 3
  local line
  line=$("$@" 2>"$out.err" | sed -n 's/^\(\[0\] \)\{0,1\}RESULT //p' | head -1)
  if [ -z "$line" ]; then
    echo "control.sh: $c (np=$np round $r) failed; its stderr:" >&2
    tail -3 "$out.err" >&2
    return
  fi
  echo "CASE $c round=$r np=$np${pair:+ pair=$pair} $line" >>"$out"
}
pair=""

ncpu=$(nproc)
binding() { # NP: gradsync-run's --bind-to for NP ranks (as mpirun binds: see --bind)
  case "$bind" in
  auto) [ "$1" -le "$ncpu" ] && echo core || echo none ;;
  *) echo "$bind" ;;
  esac
}
gs() { # NP BENCH-ARGS...: gradsync-bench under gradsync-run
  local np=$1
  shift
  "$bin/gradsync-run" -np "$np" --bind-to "$(binding "$np")" --timeout 150 "$bin/gradsync-bench" "$@"
}
gs_off() { # NP BENCH-ARGS...: the same with gradsyncd --fast-path off
  local np=$1
  shift
  "$bin/gradsync-run" -np "$np" --bind-to "$(binding "$np")" --timeout 150 \
    --coord-arg --fast-path --coord-arg off "$bin/gradsync-bench" "$@"
}
mp() { # NP ARGS...: the MPI peer
  local np=$1
  shift
  "${mpirun_[@]}" -np "$np" "$bin/mpi-negotiation" "$@"
}

ring=0
[ -x "$bin/gs-transport-bench" ] && ring=1
for r in $(seq 1 "$rounds"); do
  echo "control.sh: round $r/$rounds ($(($(date +%s) - start)) s so far)" >&2
  # the floors of issue 14's targets: one round trip through gradsyncd (the
  # rank simulator's floor round with one rank) and the TCP ring alone
  rec rtt "$r" 1 "$bin/gradsync-rank-sim" --ranks 1 --workload "$resnet" --cache 1 --steps 200 --warmup 5
  for np in $nps; do
    if [ "$ring" = 1 ]; then
      for b in 4 16384; do
        rec "ring.$b" "$r" "$np" "$bin/gs-transport-bench" --transport tcp --np "$np" --sizes "$b" --reps 200
      done
    fi
    for b in $sizes; do
      rec "lat.gs.$b" "$r" "$np" gs "$np" --raw-allreduce "$b" --steps 200 --warmup 10
      [ "$mpi" = 1 ] && rec "lat.mpi.$b" "$r" "$np" mp "$np" --allreduce-bytes "$b" --steps 200 --warmup 10
    done
    # issue 14's target: this round's share of the pairs (see the header)
    read -r p0 p1 <<<"$(pair_range "$r" "$rounds" "$pairs")"
    for k in $(seq "$p0" "$p1"); do
      members=(ctl.gs ctl.gs.grouped ctl.gs.persistent)
      [ "$mpi" = 1 ] && members+=(ctl.mpi.cached)
      pair=$k
      for c in $(pair_order "$k" "${members[@]}"); do
        case $c in
        ctl.gs) rec ctl.gs "$r" "$np" gs "$np" --workload "$resnet" --scale 1e9 --steps 100 --warmup 5 ;;
        # the same 161 tensors as one gs_grouped_allreduce_async per step
        ctl.gs.grouped) rec ctl.gs.grouped "$r" "$np" gs "$np" --workload "$resnet" --scale 1e9 --steps 100 \
          --warmup 5 --grouped on ;;
        # the same 161 tensors as persistent ops (gs_allreduce_init once,
        # one gs_startall per step)
        ctl.gs.persistent) rec ctl.gs.persistent "$r" "$np" gs "$np" --workload "$resnet" --scale 1e9 \
          --steps 100 --warmup 5 --grouped persistent ;;
        ctl.mpi.cached) rec ctl.mpi.cached "$r" "$np" mp "$np" --workload "$resnet" --steps 200 --warmup 5 ;;
        esac
      done
      pair=""
    done
    # the fast path off (issue 14's baseline): $inner samples per round
    for _ in $(seq 1 "$inner"); do
      rec ctl.gs.off "$r" "$np" gs_off "$np" --workload "$resnet" --scale 1e9 --steps 100 --warmup 5
    done
    if [ "$mpi" = 1 ]; then
      rec ctl.mpi.cached.exec "$r" "$np" mp "$np" --workload "$resnet" --steps 200 --warmup 5 --execute \
        --scale 1e9
      rec ctl.mpi.uncached "$r" "$np" mp "$np" --workload "$resnet" --steps 200 --warmup 5 --cache 0
    fi
    # batching with 100 us "backward" gaps (ResNet-50 / 32, as pol.a2 in
    # run.sh), fast path on and off
    for _ in $(seq 1 "$inner"); do
      rec gap.gs "$r" "$np" gs "$np" --workload "$resnet" --scale 32 --gap-us 100 --steps 12 --warmup 2
      rec gap.gs.off "$r" "$np" gs_off "$np" --workload "$resnet" --scale 32 --gap-us 100 --steps 12 \
        --warmup 2
    done
  done
  [ -n "$sim_rounds" ] && [ "$r" -gt "$sim_rounds" ] && continue
  for n in $simn; do
    for c in 1 0; do
      rec "sim.$n.c$c" "$r" 1 "$bin/gradsync-rank-sim" --ranks "$n" --workload "$resnet" --cache "$c" \
        --steps "$([ "$n" -ge 256 ] && echo 10 || echo 30)" --warmup 2
    done
  done
done
rm -f "$out.err"

# ---- report -------------------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.2f", a / b }'; }
us() { awk -v a="$1" 'BEGIN { if (a == "nan") print "n/a"; else printf "%.0f", a * 1000 }'; }

echo
echo "gradsync control plane — $(nproc) CPUs, loopback, rounds=$rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
  "$(date -u +%Y-%m-%dT%H:%MZ), raw lines: $out"
echo
echo "Lone allreduce, median µs (gradsync end to end; OpenMPI MPI_Allreduce over TCP):"
echo
echo "| bytes | np | gradsync µs | OpenMPI tcp µs | ratio |"
echo "|---|---|---|---|---|"
for np in $nps; do
  for b in $sizes; do
    g=$(med "lat.gs.$b" step_ms "$np") m=$(med "lat.mpi.$b" step_ms "$np")
    echo "| $b | $np | $(us "$g") | $(us "$m") | $(ratio "$g" "$m") |"
  done
done
echo
echo "Floors of the targets, median µs: one round trip through gradsyncd (gradsync-rank-sim --ranks 1, its floor"
echo "round: the rank sends one request, the coordinator answers) and the TCP ring alone (gs-transport-bench --transport tcp):"
echo
echo "| np | round trip | TCP ring 4 B | TCP ring 16 KiB |"
echo "|---|---|---|---|"
for np in $nps; do
  echo "| $np | $(us "$(med rtt floor_ms 1)") | $(awk -v u="$(med ring.4 median_us "$np")" 'BEGIN { if (u == "nan") print "n/a"; else print u }') |" \
    "$(awk -v u="$(med ring.16384 median_us "$np")" 'BEGIN { if (u == "nan") print "n/a"; else print u }') |"
done
echo
echo "Control-only step (ResNet-50, 161 tensors of 4 B, cache warm, submissions included), median µs."
echo "Binding (--bind $bind): gradsync-run$(sep=""; for np in $nps; do printf '%s --bind-to %s at np=%s' "$sep" "$(binding "$np")" "$np"; sep=","; done);"
echo "the MPI peer: mpirun's default (each rank bound to a core at np <= 2 when np <= the $ncpu cpus, nothing when oversubscribed)."
echo
echo "| np | gradsync step | gs_barrier | gradsync step, fast path off | gradsync step, one grouped call | gradsync step, persistent ops (gs_startall) | MPI cached (bit vector) | MPI cached + tiny allreduces | MPI uncached (gather+bcast) | gradsync / MPI cached (ratio of medians; paired: below) | gradsync / MPI cached+exec | collectives/step | plans replayed/step |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for np in $nps; do
  grp=$(med ctl.gs.grouped step_ms "$np") per=$(med ctl.gs.persistent step_ms "$np")
  g=$(med ctl.gs step_ms "$np") bar=$(med ctl.gs barrier_ms "$np") off=$(med ctl.gs.off step_ms "$np")
  mc=$(med ctl.mpi.cached step_ms "$np") me=$(med ctl.mpi.cached.exec step_ms "$np")
  mu=$(med ctl.mpi.uncached step_ms "$np")
  echo "| $np | $(us "$g") | $(us "$bar") | $(us "$off") | $(us "$grp") | $(us "$per") | $(us "$mc") | $(us "$me") | $(us "$mu") | $(ratio "$g" "$mc") | $(ratio "$g" "$me") | $(med ctl.gs collectives "$np") | $(med ctl.gs plans_replayed "$np") |"
done
echo
# issue 14's target from the pairs: per pair (np, K) gradsync's step / the MPI
# peer's cached step of the same pair, then the median over the pairs
echo "Issue 14's target side by side: the control-only step in pairs (one run of gradsync's three submissions and"
echo "one of the MPI peer's cached step, back to back, the order reversed in every other pair; $pairs pairs per np"
echo "over $rounds round(s)). Medians of each side over the pairs, µs; ratio = the median of the per-pair ratios:"
echo
echo "| np | gradsync submission | pairs | gradsync µs | MPI cached µs | gradsync / MPI cached, median of per-pair ratios | per-pair range | pairs under the target | target |"
echo "|---|---|---|---|---|---|---|---|---|"
us1() { awk -v a="$1" 'BEGIN { if (a == "nan") print "n/a"; else printf "%.1f", a * 1000 }'; }
for np in $nps; do
  bound=$([ "$np" -le 2 ] && echo 1.5 || echo 1.0)
  for c in ctl.gs ctl.gs.grouped ctl.gs.persistent; do
    read -r n pr under ma mb lo hi <<<"$(pair_stat "$c" ctl.mpi.cached step_ms "$np" "$bound")"
    case $c in
    ctl.gs) what="161 gs_allreduce_async calls" ;;
    ctl.gs.grouped) what="one gs_grouped_allreduce_async" ;;
    *) what="persistent ops, one gs_startall" ;;
    esac
    if [ "$n" = 0 ]; then pr=n/a range=n/a; else range="$lo–$hi"; fi
    echo "| $np | $what | $n | $(us1 "$ma") | $(us1 "$mb") | $pr | $range | $under of $n | ≤ $bound |"
  done
done
echo
echo "Batching with 100 µs gaps (ResNet-50/32, as pol.a2):"
echo
# crit: each rank from its own last submission to that op's completion (the
# worst rank's); crit_last: from the latest rank's last submission to the
# latest completion; skew: latest - earliest last submission (crit_last and
# skew need the ranks on one host: gradsync-bench prints n/a otherwise)
echo "| np | fast path | step ms | crit ms | crit_last ms | skew ms | collectives | tensors/op | messages up/step |"
echo "|---|---|---|---|---|---|---|---|---|"
for np in $nps; do
  for c in gap.gs gap.gs.off; do
    echo "| $np | $([ "$c" = gap.gs ] && echo on || echo off) | $(med "$c" step_ms "$np") | $(med "$c" crit_ms "$np") |" \
      "$(med "$c" crit_last_ms "$np") | $(med "$c" skew_ms "$np") | $(med "$c" collectives "$np") |" \
      "$(med "$c" tensors_per_op "$np") | $(med "$c" up_msgs "$np") |"
  done
done
echo
echo "Rank simulator (one process, N sessions, ResNet-50 list), medians:"
echo
echo "| N | cache | floor ms | step ms | step p99 | step / floor | coordinator CPU ms/step | CPU µs/rank/step | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in $simn; do
  for c in 1 0; do
    k="sim.$n.c$c"
    echo "| $n | $([ $c = 1 ] && echo on || echo off) | $(med $k floor_ms 1) | $(med $k step_ms 1) | $(med $k step_p99 1) | $(med $k step_over_floor 1) | $(med $k coord_cpu_ms_per_step 1) | $(med $k coord_cpu_us_per_rank_step 1) | $(awk -v k="$(med $k coord_peak_rss_kib 1)" 'BEGIN { if (k == "nan") print "n/a"; else printf "%.1f", k / 1024 }') |"
  done
done

# ---- plots ----------------------------------------------------------------------
if command -v gnuplot >/dev/null; then
  [ -n "$plots" ] || plots=$(mktemp -d /tmp/gradsync-plots.XXXXXX)
  mkdir -p "$plots"
  for np in $nps; do
    for b in $sizes; do
      echo "$b $(us "$(med "lat.gs.$b" step_ms "$np")") $(us "$(med "lat.mpi.$b" step_ms "$np")")"
    done >"$plots/lat.np$np.dat"
  done
  for n in $simn; do
    echo "$n $(med "sim.$n.c1" floor_ms 1) $(med "sim.$n.c1" step_ms 1) $(med "sim.$n.c0" step_ms 1)"
  done >"$plots/sim.dat"
  lat_plot="" sep=""
  for np in $nps; do
    lat_plot="$lat_plot$sep'$plots/lat.np$np.dat' u 1:2 w lp t 'gradsync np=$np', '$plots/lat.np$np.dat' u 1:3 w lp t 'OpenMPI tcp np=$np'"
    sep=", "
  done
  gnuplot <<EOF
set terminal svg size 720,440 dynamic font 'sans,12'
set output '$plots/latency_vs_size.svg'
set title 'Lone allreduce latency vs message size (median, loopback, 2 vCPU)'
set logscale xy
set xlabel 'message bytes'
set ylabel 'µs'
set key top left
set grid
plot $lat_plot
set output '$plots/negotiation_vs_ranks.svg'
set title 'ResNet-50 negotiation vs simulated ranks (median per step)'
set xlabel 'ranks (N)'
set ylabel 'ms'
plot '$plots/sim.dat' u 1:2 w lp t 'floor: everyone sends, coordinator answers everyone', '' u 1:3 w lp t 'step, cache on', '' u 1:4 w lp t 'step, cache off'
EOF
  echo
  echo "control.sh: plots in $plots (latency_vs_size.svg, negotiation_vs_ranks.svg)" >&2
else
  echo "control.sh: gnuplot not found (apt-get install gnuplot-nox): no plots" >&2
fi
echo "control.sh: done in $(($(date +%s) - start)) s" >&2
