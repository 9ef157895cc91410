#!/usr/bin/env bash
# bench/run.sh — gradsync's side-by-side benchmark comparisons (docs/benchmarks.md).
#
#   bench/run.sh [--quick] [--build DIR] [--doc FILE | --no-doc] [--parts "LIST"] [--pairs P]
#     everything, in this order (parts: transport dataplane steps hosts
#     control settings), each part's tables into the generated section of
#     docs/benchmarks.md (between its run.sh:begin/end markers) and its plots
#     into docs/img/run-*.svg, then the table against the targets of issues
#     14 and 15 (bench/targets.py); builds a Release tree in build-bench first when
#     it is missing, installs gnuplot-nox when missing (as root); --quick:
#     one round and fewer sizes everywhere, 4 pairs (below), no settings part;
#     --pairs P: the pairs of the paired target ratios in the dataplane and
#     control parts (default 10 and 12); --doc FILE: the tables into FILE,
#     the plots into img/ beside it; --no-doc: nothing under docs/, the
#     generated section and the plots (img/) only in the --out directory
#   bench/run.sh --settings [--build DIR] [--rounds R] [--np "2 4"] [--out FILE] [--quick]
#                [--no-control] [--pairs P]
#     fusion, emission policy and cache settings (then bench/control.sh
#     unless --no-control, with --pairs P); --control-only runs only bench/control.sh
#   bench/run.sh --dataplane [--build DIR] [--rounds R] [--np "2 4"] [--out FILE]
#                [--sweep-from FILE] [--plot FILE] [--pairs P]
#     (the data plane next to OpenMPI: see "data plane" below; --plot: the
#     bus-bandwidth plot, default docs/benchmarks-dataplane.svg, with --no-doc
#     the --out file's name + .svg; --pairs P: the GS_AVERAGE / GS_SUM pairs
#     per np, end to end and CPU time each, default 10, 4 with --quick)
#   Every mode: --workloads DIR (the tensor lists, default bench/workloads);
#   the environment's GRADSYNC_BUILD and GRADSYNC_WORKLOADS set the defaults
#   of --build and --workloads.
#   bench/run.sh --steps [--build DIR] [--rounds R] [--np "2 4"] [--out FILE] [--quick]
#     ResNet-50 and BERT-base steps vs OpenMPI shm's allreduce of the same bytes
#
# Runs every configuration of every comparison once per round, rounds
# interleaved (so that drift on a shared machine hits all configurations
# alike), each run under gradsync-run with its coordinator flags; every run
# prints the medians over its steps (of the slowest rank). The tables show
# the median over rounds and the ratios. The target ratios that swing most
# between runs (issue 14's control-only step, issue 15's GS_AVERAGE /
# GS_SUM time and CPU time) are measured in pairs instead: the two sides back to
# back, the order reversed in every other pair, the pairs spread over the
# rounds; their ratio is the median of the per-pair ratios. Raw RESULT
# lines go to --out.
#
# Not part of the test suite: timings are noisy on shared machines and are
# never pass/fail. Budget on 2 vCPUs: see "How to run" in docs/benchmarks.md
# (--settings: 4-5 minutes with --rounds 3, --np "2 4"; np=4 runs one round,
# BERT scaled by 4 there, and skips the data-plane-bound policy runs).
# shellcheck disable=SC2086 # flag lists are split into words on purpose
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
build=${GRADSYNC_BUILD:-$root/build-bench}
rounds=3
nps="2 4"
out=""
quick=0
dataplane=0
workloads=${GRADSYNC_WORKLOADS:-$root/bench/workloads}
control=1
mode=all
doc=$root/docs/benchmarks.md
parts="transport dataplane steps hosts control settings"
dp_svg="" # --plot; default below
sweep=""
rounds_set=0
pairs=""

while [ $# -gt 0 ]; do
  case "$1" in
  --build) build=$2; shift 2 ;;
  --rounds) rounds=$2; rounds_set=1; shift 2 ;;
  --pairs) pairs=$2; shift 2 ;;
  --np) nps=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  --workloads) workloads=$2; shift 2 ;;
  --quick) quick=1; rounds=1; rounds_set=1; shift ;;
  --dataplane) dataplane=1; mode=dataplane; shift ;;
  --settings) mode=settings; shift ;;
  --steps) mode=steps; shift ;;
  --no-control) control=0; shift ;;
  --control-only) control=2; mode=settings; shift ;;
  --doc) doc=$2; shift 2 ;;
  --no-doc) doc=""; shift ;;
  --parts) parts=$2; shift 2 ;;
  --plot) dp_svg=$2; shift 2 ;;
  --sweep-from) sweep=$2; shift 2 ;;
  -h | --help) sed -n '2,46p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "run.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$pairs" in
'' | [1-9] | [1-9]*[0-9]) [ -z "${pairs//[0-9]/}" ] ||
  { echo "run.sh: --pairs needs a count >= 1, got '$pairs'" >&2; exit 2; } ;;
*) echo "run.sh: --pairs needs a count >= 1, got '$pairs'" >&2; exit 2 ;;
esac
pp=()
[ -n "$pairs" ] && pp=(--pairs "$pairs")

# ---- everything (the default): every part, tables into docs/benchmarks.md -----
if [ "$mode" = all ]; then
  [ "$rounds_set" = 1 ] || rounds=3
  start=$(date +%s)
  for f in gradsync-run gradsyncd gradsync-bench gradsync-dataplane gs-transport-bench \
    gradsync-rank-sim mpi-negotiation; do
    [ -x "$build/bin/$f" ] && continue
    echo "run.sh: $build/bin/$f missing: building a Release tree in $build (a few minutes)" >&2
    command -v mpicc >/dev/null ||
      echo "run.sh: no mpicc: the OpenMPI peers will be missing (bash scripts/install-deps.sh installs libopenmpi-dev)" >&2
    { cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
      nice -n 10 cmake --build "$build" >"${TMPDIR:-/tmp}/gradsync-run-build.$$.log" 2>&1; } || {
      echo "run.sh: the build failed; see ${TMPDIR:-/tmp}/gradsync-run-build.$$.log" >&2
      exit 1
    }
    rm -f "${TMPDIR:-/tmp}/gradsync-run-build.$$.log"
    break
  done
  if ! command -v gnuplot >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "run.sh: installing gnuplot-nox for the plots" >&2
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
        --no-install-recommends gnuplot-nox >/dev/null ||
        echo "run.sh: apt-get install gnuplot-nox failed: no plots" >&2
    else
      echo "run.sh: gnuplot not found: no plots (sudo apt-get install gnuplot-nox)" >&2
    fi
  fi
  for f in resnet50 bert_base; do
    [ -r "$workloads/$f.txt" ] || { echo "run.sh: workload $workloads/$f.txt not found (--workloads DIR)" >&2; exit 1; }
  done
  raw=${out:-$(mktemp -d /tmp/gradsync-run.XXXXXX)}
  mkdir -p "$raw"
  gen=$raw/generated.md
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
  dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | grep -qv 'docs/' && echo " (with local changes)")
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  # the plots beside the tables: docs/img for docs/benchmarks.md, img/
  # beside --doc FILE; with --no-doc in the raw directory, so that nothing
  # under docs/ changes (generated.md there links img/run-*.svg too)
  if [ -n "$doc" ]; then img=$(dirname "$doc")/img; else img=$raw/img; fi
  mkdir -p "$img"
  q=()
  [ "$quick" = 1 ] && q=(--quick)
  # the pairs of the dataplane part (which takes no --quick): 4 in a quick run
  dpp=("${pp[@]}")
  [ "$quick" = 1 ] && [ -z "$pairs" ] && dpp=(--pairs 4)
  part_log=$raw/parts.txt
  : >"$part_log"
  # part NAME TITLE COMMAND...: runs it, its stdout (markdown) into $raw/NAME.md
  part() {
    local name=$1 title=$2 t0 l0 rc=0
    shift 2
    t0=$(date +%s) l0=$(cut -d' ' -f1-3 /proc/loadavg)
    echo "run.sh: part $name ($(($(date +%s) - start)) s so far): $*" >&2
    "$@" >"$raw/$name.md" || rc=$?
    {
      echo "### $title"
      echo
      echo "\`$(echo "$*" | sed "s|$root/||g; s|$raw/|RAW/|g; s|^hosts_md |bench/netns_hosts.sh |")\`: $(($(date +%s) - t0)) s, load average $l0 before," \
        "$(cut -d' ' -f1-3 /proc/loadavg) after$([ "$rc" = 0 ] || echo ", **exit status $rc**")."
      echo
      cat "$raw/$name.md"
      echo
    } >>"$raw/sections.md"
    echo "| $name | $(($(date +%s) - t0)) s | $l0 | $(cut -d' ' -f1-3 /proc/loadavg) |" >>"$part_log"
  }
  : >"$raw/sections.md"
  has_part() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
  strip_log() { grep -v -e '^\[coord\]' -e '^run\.sh: ' -e '^transport\.sh: .* raw lines' ; }
  # transport first: the data-plane part's size sweep (OpenMPI shm and tcp,
  # gradsync end to end and its TCP ring alone) is read from its lines
  # rather than measured a second time
  if has_part transport; then
    tsz=()
    [ "$quick" = 1 ] && tsz=(--sizes 4096,1048576,16777216)
    part transport "Host transports: gradsync shm and tcp (direct and end to end) vs OpenMPI shm and tcp" \
      "$here/transport.sh" --build "$build" --np "$nps" --rounds "$rounds" --out "$raw/transport.txt" "${tsz[@]}"
  fi
  if has_part dataplane; then
    sw=()
    [ -s "$raw/transport.txt" ] && sw=(--sweep-from "$raw/transport.txt")
    part dataplane "Data plane vs OpenMPI on one host, and the ResNet-50 / BERT-base steps" \
      "$here/run.sh" --dataplane --build "$build" --np "$nps" --rounds "$rounds" --out "$raw/dataplane.txt" \
      --plot "$img/run-dataplane.svg" "${sw[@]}" "${dpp[@]}"
  fi
  if has_part steps; then
    part steps "ResNet-50 and BERT-base steps vs OpenMPI shm's allreduce of the same bytes" \
      "$here/run.sh" --steps --build "$build" --np "$nps" --rounds "$rounds" --out "$raw/steps.txt" "${q[@]}"
  fi
  if has_part hosts; then
    if [ "$(id -u)" = 0 ]; then
      hsz=(--workload "$workloads/resnet50.txt")
      [ "$quick" = 1 ] && hsz+=(--sizes 1048576,16777216 --steps 4)
      hosts_md() {
        "$here/netns_hosts.sh" "$@" >"$raw/hosts.log" 2>&1
        local rc=$?
        cat "$raw/hosts.md" 2>/dev/null
        return $rc
      }
      part hosts "Across hosts: gradsync tcp and hierarchical vs OpenMPI tcp (network namespaces), and a ResNet-50 step" \
        hosts_md --build "$build" --np "$nps" --rounds "$rounds" --out "$raw/hosts.txt" \
        --markdown "$raw/hosts.md" "${hsz[@]}"
    else
      echo "### Across hosts" >>"$raw/sections.md"
      echo >>"$raw/sections.md"
      echo "Skipped: bench/netns_hosts.sh needs root (ip netns)." >>"$raw/sections.md"
      echo >>"$raw/sections.md"
    fi
  fi
  if has_part control; then
    part control "Control plane: lone allreduce, gs_barrier, ResNet-50 control-only step, rank simulator" \
      "$here/control.sh" --build "$build" --np "$nps" --rounds "$rounds" --out "$raw/control.txt" \
      --plots "$raw/plots" "${q[@]}" "${pp[@]}" --sim-ranks "8 64 256 1024" --sim-rounds 1
    for f in latency_vs_size negotiation_vs_ranks; do
      [ -r "$raw/plots/$f.svg" ] && cp "$raw/plots/$f.svg" "$img/run-$f.svg"
    done
  fi
  if has_part settings && [ "$quick" = 0 ]; then
    part settings "Settings: fusion threshold, emission policy, response cache" \
      "$here/run.sh" --settings --no-control --build "$build" --np "$nps" --rounds "$rounds" --out "$raw/settings.txt"
  fi
  secs=$(($(date +%s) - start))
  {
    echo "<!-- bench/run.sh:begin (generated by bench/run.sh; edit the script, not this section) -->"
    echo
    echo "## The latest full run (\`bench/run.sh$([ "$quick" = 1 ] && echo " --quick")\`)"
    echo
    echo "Generated by \`bench/run.sh\` $(date -u +%FT%TZ), commit \`$commit\`$dirty, $secs s in all;"
    echo "$(nproc) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo),"
    echo "$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), kernel $(uname -r), $(cc --version 2>/dev/null | head -1),"
    echo "$(mpirun --version 2>/dev/null | head -1); load average $load0 at the start and $(cut -d' ' -f1-3 /proc/loadavg) at the end."
    echo "Rounds: $rounds per part (interleaved; medians over rounds); the paired target ratios (GS_AVERAGE / GS_SUM time"
    echo "end to end and CPU time in the dataplane part: ${dpp[1]:-10} pairs per np each; the control-only step in the control"
    echo "part: ${pairs:-$([ "$quick" = 1 ] && echo 4 || echo 12)} pairs per np):"
    echo "the median of the per-pair ratios. Raw lines were in \`$raw\`."
    echo
    echo "| part | wall time | load average before | after |"
    echo "|---|---|---|---|"
    cat "$part_log"
    echo
    [ -r "$img/run-dataplane.svg" ] && has_part dataplane &&
      printf '![Bus bandwidth vs message size, gradsync and OpenMPI](img/run-dataplane.svg)\n\n'
    [ -r "$img/run-latency_vs_size.svg" ] && has_part control &&
      printf '![Lone allreduce latency vs message size](img/run-latency_vs_size.svg)\n\n'
    [ -r "$img/run-negotiation_vs_ranks.svg" ] && has_part control &&
      printf '![ResNet-50 negotiation vs simulated ranks, up to 1024](img/run-negotiation_vs_ranks.svg)\n\n'
    sed 's/[[:space:]]*$//' "$raw/sections.md" | strip_log | cat -s
    # the targets of issues 14 and 15 against this run's raw lines
    if command -v python3 >/dev/null; then
      python3 "$here/targets.py" "$raw" --np "$nps" ||
        printf '### Against the targets of issues 14 and 15 (this run)\n\nbench/targets.py failed (see its stderr).\n'
    else
      printf '### Against the targets of issues 14 and 15 (this run)\n\nNot computed: python3 not found.\n'
    fi
    echo
    echo "<!-- bench/run.sh:end -->"
  } >"$gen"
  if [ -n "$doc" ]; then
    if grep -q '^<!-- bench/run.sh:begin' "$doc" 2>/dev/null; then
      awk -v gen="$gen" '/^<!-- bench\/run.sh:begin/ { while ((getline l < gen) > 0) print l; skip = 1; next }
        /^<!-- bench\/run.sh:end -->/ { skip = 0; next } !skip' "$doc" >"$doc.tmp.$$" && mv "$doc.tmp.$$" "$doc"
    else
      { echo; cat "$gen"; } >>"$doc"
    fi
    echo "run.sh: tables written into $doc (plots in $img/run-*.svg)" >&2
  fi
  echo "run.sh: everything done in $secs s; raw lines and the generated section in $raw$([ -n "$doc" ] ||
    echo ", plots in $img")" >&2
  exit 0
fi

# control_plane: bench/control.sh with this run's build, np and round count.
control_plane() {
  local q=()
  [ "$quick" = 1 ] && q=(--quick)
  GRADSYNC_WORKLOADS=$workloads "$here/control.sh" --build "$build" --np "$nps" --rounds "$rounds" \
    "${q[@]}" "${pp[@]}"
}
if [ "$control" = 2 ]; then
  control_plane
  exit $?
fi

run=$build/bin/gradsync-run
bin=$build/bin/gradsync-bench
for f in "$run" "$bin" "$build/bin/gradsyncd"; do
  [ -x "$f" ] || { echo "run.sh: $f not found; build first:" \
    "cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-bench" >&2; exit 1; }
done
resnet=$workloads/resnet50.txt
bert=$workloads/bert_base.txt
for f in "$resnet" "$bert"; do
  [ -r "$f" ] || { echo "run.sh: workload $f not found (--workloads DIR)" >&2; exit 1; }
done
[ -n "$out" ] || out=$(mktemp /tmp/gradsync-bench.XXXXXX)
: >"$out"
start=$(date +%s)

# ---- data plane: gradsync next to OpenMPI (bench/run.sh --dataplane) ----------
# float32 allreduce, in place, 4 KiB..64 MiB, median over the calls of the
# slowest rank, rounds interleaved: OpenMPI MPI_Allreduce over shared memory
# (--mca btl self,vader) and over TCP (self,tcp), gradsync end to end
# (gradsync-dataplane --mode e2e: through the coordinator, GRADSYNC_BACKEND
# as set), its TCP ring alone (--mode direct), GS_AVERAGE (wall and CPU time), and
# deterministic mode; then ResNet-50 and BERT-base steps (gradsync-bench,
# defaults) next to OpenMPI shm's allreduce of the same bytes. OpenMPI
# through bench/mpi_allreduce.c (shared with bench/transport.sh). Writes
# tables (stdout) and a gnuplot plot of bus bandwidth (--plot FILE; default
# docs/benchmarks-dataplane.svg, with --no-doc the raw lines' file + .svg).
# OpenMPI runs with MALLOC_MMAP_THRESHOLD_ raised (its 64 MiB temporaries
# are otherwise page-faulted on every call: 2x slower there).
# --sweep-from FILE (the full run passes bench/transport.sh's raw lines):
# the first table and the plot take OpenMPI shm and tcp, gradsync end to
# end (transport.sh's gs-shm, GRADSYNC_BACKEND=shm: what auto picks on
# one host) and the TCP ring alone (gs-tcp-direct) from FILE, at its sizes,
# instead of measuring them again; this part then runs gradsync end to end
# only at the sizes its GS_AVERAGE and deterministic ratios need, so every
# ratio still compares runs of one part.
# Issue 15's GS_AVERAGE / GS_SUM ratios are measured in pairs: --pairs P
# pairs per np for each (default 10, spread over the rounds), a pair being
# a SUM run and an AVERAGE run with the same size list, back to back, SUM
# first in odd pairs and AVERAGE first in even ones; a row is the median of
# the per-pair ratios, beside each side's median over the pairs, the lowest
# and highest per-pair ratio and how many pairs were within 1.03:
# - time end to end at 64 MiB (and, without a target, 16 MiB): --mode e2e
#   --sizes "16777216 67108864" on both sides (gs.e2e.sum, gs.e2e.avg), the
#   slowest rank's median time per call;
# - CPU time per call at 64 MiB, the TCP ring alone (the load-proof row):
#   --mode direct --sizes 67108864 on both sides (gs.direct.sum,
#   gs.direct.avg), rank 0's median CPU time per call.
# ---- training steps vs OpenMPI shm (bench/run.sh --steps) ---------------------
# The ResNet-50 and BERT-base gradient sets (gradsync-bench, default
# coordinator settings, GS_AVERAGE, submitted back to back in reverse order)
# next to OpenMPI shm's MPI_Allreduce of the same bytes (btl self,vader,
# float32, bench/mpi_allreduce.c), alternating per round; full BERT-base at
# every np. Per round and np: the median step (slowest rank) of each;
# the table shows every round and the medians over rounds.
if [ "$mode" = steps ]; then
  mpi=$build/bin/mpi-allreduce
  command -v mpicc >/dev/null || { echo "run.sh: mpicc not found (apt-get install libopenmpi-dev)" >&2; exit 1; }
  [ -x "$mpi" ] && [ "$mpi" -nt "$here/mpi_allreduce.c" ] || mpicc -O2 -o "$mpi" "$here/mpi_allreduce.c" || exit 1
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  steps=8
  [ "$quick" = 1 ] && steps=4
  for r in $(seq 1 "$rounds"); do
    for np in $nps; do
      echo "run.sh: steps np=$np round $r/$rounds ($(($(date +%s) - start)) s so far)" >&2
      for w in resnet50 bert_base; do
        "$run" -np "$np" --timeout 300 "$bin" --workload "$workloads/$w.txt" --steps "$steps" --warmup 1 \
          2>"$out.err" | sed -n "s/^\[0\] RESULT /CASE gs.$w round=$r /p" >>"$out"
        b=$(awk -v c="gs.$w" -v r="round=$r" -v np="np=$np" '$2 == c && $3 == r && index(" " $0 " ", " " np " ") {
          for (i = 4; i <= NF; i++) if ($i ~ /^bytes=/) { sub(/^bytes=/, "", $i); print $i; exit } }' "$out")
        if [ -z "$b" ]; then
          echo "run.sh: gradsync $w np=$np (round $r) failed:" >&2
          tail -3 "$out.err" >&2
          continue
        fi
        timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" --mca pml ob1 \
          --mca btl self,vader -x MALLOC_MMAP_THRESHOLD_=1073741824 "$mpi" --sizes "$b" --reps "$steps" \
          --tag "mpi.$w" 2>"$out.err" | sed -n "s/^RESULT impl=\([^ ]*\) /CASE \1 round=$r /p" >>"$out"
      done
    done
  done
  rm -f "$out.err"
  load1=$(cut -d' ' -f1-3 /proc/loadavg)
  # val CASE ROUND NP KEY
  val() {
    awk -v c="$1" -v r="round=$2" -v np="np=$3" -v k="$4" '$2 == c && $3 == r && index(" " $0 " ", " " np " ") {
      for (i = 4; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) { print kv[2]; exit } } }' "$out"
  }
  median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (!NR) print "-";
    else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
  echo
  echo "Training steps vs OpenMPI shm's allreduce of the same bytes — $(nproc) CPUs, $rounds rounds (alternating), $steps steps/calls each, commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null), $(date -u +%FT%TZ), load average $load0 before, $load1 after."
  echo "Step = first submission to last completion, slowest rank, median over steps; OpenMPI = MPI_Allreduce (btl self,vader), slowest rank, median over calls. ms per round, then the median over rounds:"
  echo
  echo "| np | workload (bytes) | gradsync step, per round | OpenMPI shm, per round | gradsync median | OpenMPI median | gradsync / OpenMPI | target |"
  echo "|---|---|---|---|---|---|---|---|"
  for np in $nps; do
    for w in resnet50 bert_base; do
      g="" m="" by=""
      for r in $(seq 1 "$rounds"); do
        g="$g $(val "gs.$w" "$r" "$np" step_ms)"
        m="$m $(awk -v u="$(val "mpi.$w" "$r" "$np" median_us)" 'BEGIN { if (u != "") printf "%.2f", u / 1000 }')"
        [ -n "$by" ] || by=$(val "gs.$w" "$r" "$np" bytes)
      done
      gm=$(echo "$g" | median) mm=$(echo "$m" | median)
      echo "| $np | $w ($(awk -v b="${by:-0}" 'BEGIN { printf "%.1f MiB", b / 1048576 }')) | $(echo $g | sed 's/ /, /g') | $(echo $m | sed 's/ /, /g') | $gm | $mm |" \
        "$(awk -v a="$gm" -v b="$mm" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "n/a"; else printf "%.2f", a / b }') | ≤ 1.00 |"
    done
  done
  echo "run.sh: steps done in $(($(date +%s) - start)) s" >&2
  exit 0
fi

if [ "$dataplane" = 1 ]; then
  dp=$build/bin/gradsync-dataplane
  mpi=$build/bin/mpi-allreduce
  [ -x "$dp" ] || { echo "run.sh: $dp not found; build it (target gradsync-dataplane)" >&2; exit 1; }
  command -v mpicc >/dev/null || { echo "run.sh: mpicc not found (apt-get install libopenmpi-dev)" >&2; exit 1; }
  mpicc -O2 -o "$mpi" "$here/mpi_allreduce.c" || exit 1
  sizes="4096 65536 1048576 16777216 67108864"
  iters=15
  [ -n "$pairs" ] || pairs=$([ "$quick" = 1 ] && echo 4 || echo 10)
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  dprun() { # LABEL ROUND COMMAND... : RESULT lines tagged with the label (and pair=K while $pair is K)
    local label=$1 round=$2
    shift 2
    "$@" 2>"$out.err" | sed -n "s/^\(\[0\] \)\{0,1\}RESULT /CASE $label round=$round ${pair:+pair=$pair }/p" >>"$out"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "run.sh: $label (round $round) failed:" >&2; tail -3 "$out.err" >&2; }
  }
  mpirun_np() { # NP BTL ARGS...
    local np=$1 btl=$2
    shift 2
    mpirun --allow-run-as-root --oversubscribe -np "$np" --mca btl "$btl" \
      -x MALLOC_MMAP_THRESHOLD_=1073741824 "$mpi" "$@" | sed 's/ median_us=/ us=/'
  }
  gsrun() { "$run" -np "$1" --timeout 300 "${@:2}"; }
  pair=""
  for r in $(seq 1 "$rounds"); do
    for np in $nps; do
      echo "run.sh: data plane np=$np round $r/$rounds ($(($(date +%s) - start)) s so far)" >&2
      kv=$(mktemp -d /tmp/gradsync-kv.XXXXXX)
      if [ -z "$sweep" ]; then
        dprun mpi.shm "$r" mpirun_np "$np" self,vader --sizes "${sizes// /,}" --reps $iters
        dprun mpi.tcp "$r" mpirun_np "$np" self,tcp --sizes "${sizes// /,}" --reps $iters
        dprun gs.e2e "$r" gsrun "$np" "$dp" --mode e2e --sizes "$sizes" --iters $iters
        dprun gs.direct "$r" gsrun "$np" "$dp" --mode direct --kv-dir "$kv" --sizes "$sizes" --iters $iters
      else # the sweep is the transport part's: only what this part's ratios need
        dprun gs.e2e "$r" gsrun "$np" "$dp" --mode e2e --sizes "1048576 16777216 67108864" --iters $iters
      fi
      rm -rf "$kv"
      read -r p0 p1 <<<"$(pair_range "$r" "$rounds" "$pairs")"
      # this round's share of the GS_AVERAGE / GS_SUM time pairs (end to end,
      # 16 and 64 MiB on both sides)
      for k in $(seq "$p0" "$p1"); do
        pair=$k
        for op in $(pair_order "$k" sum average); do
          dprun "gs.e2e.$([ "$op" = sum ] && echo sum || echo avg)" "$r" gsrun "$np" "$dp" --mode e2e --op "$op" \
            --sizes "16777216 67108864" --iters $iters
        done
        pair=""
      done
      # this round's share of the GS_AVERAGE / GS_SUM CPU-time pairs (ring alone, 64 MiB)
      for k in $(seq "$p0" "$p1"); do
        pair=$k
        for op in $(pair_order "$k" sum average); do
          kv=$(mktemp -d /tmp/gradsync-kv.XXXXXX)
          dprun "gs.direct.$([ "$op" = sum ] && echo sum || echo avg)" "$r" gsrun "$np" "$dp" --mode direct \
            --kv-dir "$kv" --op "$op" --sizes 67108864 --iters $iters
          rm -rf "$kv"
        done
        pair=""
      done
      dprun gs.det "$r" env GRADSYNC_DETERMINISTIC=1 "$run" -np "$np" --timeout 300 "$dp" --mode e2e \
        --sizes "1048576 16777216 67108864" --iters $iters
      for w in resnet50 bert_base; do
        f=$workloads/$w.txt
        sc=1
        [ "$w" = bert_base ] && [ "$np" -gt 2 ] && sc=4
        "$run" -np "$np" --timeout 300 "$bin" --workload "$f" --scale $sc --steps 6 --warmup 1 \
          2>"$out.err" | sed -n "s/^\[0\] RESULT /CASE step.$w round=$r /p" >>"$out"
        GRADSYNC_DETERMINISTIC=1 "$run" -np "$np" --timeout 300 "$bin" --workload "$f" --scale $sc \
          --steps 6 --warmup 1 2>"$out.err" | sed -n "s/^\[0\] RESULT /CASE stepdet.$w round=$r /p" >>"$out"
        b=$(awk -v c="step.$w" -v r="round=$r" -v np="np=$np" '$2 == c && $3 == r && $0 ~ (" " np " ") {
          for (i = 4; i <= NF; i++) if ($i ~ /^bytes=/) { sub(/^bytes=/, "", $i); print $i; exit } }' "$out")
        [ -n "$b" ] && dprun "mpi.step.$w" "$r" mpirun_np "$np" self,vader --sizes "$b" --reps 7
      done
    done
  done
  rm -f "$out.err"
  load1=$(cut -d' ' -f1-3 /proc/loadavg)
  # dmed CASE NP BYTES KEY [EXTRA-MATCH]: median over rounds
  dmed() {
    awk -v c="$1" -v np="np=$2" -v by="bytes=$3" -v k="$4" '
      $2 == c && index(" " $0 " ", " " np " ") && index(" " $0 " ", " " by " ") {
        for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) a[n++] = kv[2] + 0 } }
      END {
        if (!n) { print "nan"; exit }
        for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        print (n % 2) ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2 }' "$out"
  }
  smed() { # CASE NP KEY: median of a step case's KEY
    awk -v c="$1" -v np="np=$2" -v k="$3" '
      $2 == c && index(" " $0 " ", " " np " ") {
        for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) a[n++] = kv[2] + 0 } }
      END {
        if (!n) { print "nan"; exit }
        for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        print (n % 2) ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2 }' "$out"
  }
  dratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.2f", a / b }'; }
  # swmed CASE NP BYTES: the first table's median µs; with --sweep-from,
  # over the rounds of transport.sh's matching lines
  swmed() {
    if [ -z "$sweep" ]; then
      dmed "$1" "$2" "$3" us
      return
    fi
    local impl
    case $1 in mpi.shm) impl=ompi-shm ;; mpi.tcp) impl=ompi-tcp ;; gs.e2e) impl=gs-shm ;; gs.direct) impl=gs-tcp-direct ;; esac
    awk -v im="impl=$impl" -v np="np=$2" -v by="bytes=$3" '
      index(" " $0 " ", " " im " ") && index(" " $0 " ", " " np " ") && index(" " $0 " ", " " by " ") {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "median_us") a[n++] = kv[2] + 0 } }
      END {
        if (!n) { print "nan"; exit }
        for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        print (n % 2) ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2 }' "$sweep"
  }
  tsizes=$sizes
  [ -n "$sweep" ] && tsizes=$(sed -n 's/^RESULT .* bytes=\([0-9]*\) .*/\1/p' "$sweep" | sort -nu | tr '\n' ' ')
  human() { awk -v b="$1" 'BEGIN { if (b >= 1048576) printf "%d MiB", b / 1048576; else printf "%d KiB", b / 1024 }'; }
  msec() { awk -v u="$1" 'BEGIN { if (u == "nan") print "n/a"; else printf "%.2f", u / 1000 }'; }
  echo
  echo "gradsync data plane vs OpenMPI — $(nproc) CPUs, loopback, rounds=$rounds, $(date -u +%Y-%m-%dT%H:%MZ), $(sed -n "s/^model name[^:]*: //p" /proc/cpuinfo | head -1), load average $load0 at the start, $load1 at the end; raw lines: $out"
  echo
  if [ -n "$sweep" ]; then
    echo "Median time per allreduce (µs) and bus bandwidth (GB/s, 2(n-1)/n·bytes/time), from the transport part's run (bench/transport.sh, $(basename "$sweep")): OpenMPI shm and tcp = ompi-shm, ompi-tcp; end to end = gs-shm (GS_AVERAGE, gradsync-bench --raw-allreduce); data plane alone = gs-tcp-direct (the TCP ring called directly):"
  else
    echo "Median time per allreduce (µs) and bus bandwidth (GB/s, 2(n-1)/n·bytes/time):"
  fi
  echo
  echo "| np | size | OpenMPI shm | OpenMPI tcp | gradsync end to end | gradsync data plane alone | e2e / shm | alone / shm | e2e / tcp |"
  echo "|---|---|---|---|---|---|---|---|---|"
  plotdat=$out.plot
  : >"$plotdat"
  for np in $nps; do
    for b in $tsizes; do
      s=$(swmed mpi.shm "$np" "$b") t=$(swmed mpi.tcp "$np" "$b")
      e=$(swmed gs.e2e "$np" "$b") d=$(swmed gs.direct "$np" "$b")
      bw() { awk -v b="$b" -v n="$np" -v t="$1" 'BEGIN { if (t == "nan" || t == 0) print "n/a"; else printf "%.2f", b * 2 * (n - 1) / n / (t * 1e-6) / 1e9 }'; }
      printf "| %s | %s | %s (%s) | %s (%s) | %s (%s) | %s (%s) | %s | %s | %s |\n" "$np" "$(human "$b")" \
        "$s" "$(bw "$s")" "$t" "$(bw "$t")" "$e" "$(bw "$e")" "$d" "$(bw "$d")" \
        "$(dratio "$e" "$s")" "$(dratio "$d" "$s")" "$(dratio "$e" "$t")"
      echo "$np $b $(bw "$s") $(bw "$t") $(bw "$e") $(bw "$d")" >>"$plotdat"
    done
  done
  echo
  echo "| np | what | value | target |"
  echo "|---|---|---|---|"
  for np in $nps; do
    read -r n pr under ma ms lo hi <<<"$(pair_stat gs.e2e.avg gs.e2e.sum us "$np" 1.03 bytes=67108864)"
    [ "$n" = 0 ] && pr=n/a
    echo "| $np | GS_AVERAGE / GS_SUM time, 64 MiB (end to end): median of $n per-pair ratios (AVERAGE $(msec "$ma") ms, SUM $(msec "$ms") ms: medians of the pairs; per pair $lo–$hi, $under of $n ≤ 1.03) | $pr | ≤ 1.03 |"
    read -r n pr under ma ms lo hi <<<"$(pair_stat gs.e2e.avg gs.e2e.sum us "$np" 1.03 bytes=16777216)"
    [ "$n" = 0 ] && pr=n/a
    echo "| $np | GS_AVERAGE / GS_SUM time, 16 MiB (end to end): median of $n per-pair ratios (AVERAGE $(msec "$ma") ms, SUM $(msec "$ms") ms; per pair $lo–$hi) | $pr | |"
    read -r n pr under ma ms lo hi <<<"$(pair_stat gs.direct.avg gs.direct.sum cpu_us "$np" 1.03 bytes=67108864)"
    [ "$n" = 0 ] && pr=n/a
    echo "| $np | GS_AVERAGE / GS_SUM CPU time per call, 64 MiB (data plane alone, rank 0): median of $n per-pair ratios (AVERAGE $(msec "$ma") ms, SUM $(msec "$ms") ms: medians of the pairs; per pair $lo–$hi, $under of $n ≤ 1.03) | $pr | ≤ 1.03 |"
    for b in 1048576 16777216 67108864; do
      echo "| $np | deterministic / default time, $(human "$b") (end to end) | $(dratio "$(dmed gs.det "$np" "$b" us)" "$(dmed gs.e2e "$np" "$b" us)") | measured |"
    done
    for w in resnet50 bert_base; do
      st=$(smed "step.$w" "$np" step_ms) sd=$(smed "stepdet.$w" "$np" step_ms)
      by=$(smed "step.$w" "$np" bytes)
      m=$(awk -v c="mpi.step.$w" -v np="np=$np" '$2 == c && index(" " $0 " ", " " np " ") {
        for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "us") a[n++] = kv[2] / 1000 } }
        END { if (!n) { print "nan"; exit }
          for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
          print (n % 2) ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2 }' "$out")
      echo "| $np | $w step ($(human "${by%.*}")): gradsync $st ms / OpenMPI shm allreduce of the same bytes $m ms | $(dratio "$st" "$m") | ≤ 1.00 |"
      echo "| $np | $w step: deterministic / default | $(dratio "$sd" "$st") | measured |"
    done
  done
  if command -v gnuplot >/dev/null; then
    svg=$dp_svg
    # --no-doc: next to the raw lines, not in docs/
    [ -n "$svg" ] || svg=$([ -n "$doc" ] && echo "$root/docs/benchmarks-dataplane.svg" || echo "$out.svg")
    cols=""
    for np in $nps; do cols="$cols $np"; done
    gnuplot <<GP && echo && echo "run.sh: plot written to $svg" >&2
set terminal svg size 900,420 dynamic font "sans,11"
set output "$svg"
set logscale x 2
set xlabel "message size (bytes)"
set ylabel "bus bandwidth (GB/s)"
set key top left
set grid
set multiplot layout 1,$(echo $nps | wc -w)
$(for np in $nps; do cat <<EOP
set title "np = $np (2 vCPUs, loopback)"
plot "$plotdat" using (\$1 == $np ? \$2 : 1/0):3 with linespoints title "OpenMPI shm", \
     "" using (\$1 == $np ? \$2 : 1/0):4 with linespoints title "OpenMPI tcp", \
     "" using (\$1 == $np ? \$2 : 1/0):5 with linespoints title "gradsync end to end", \
     "" using (\$1 == $np ? \$2 : 1/0):6 with linespoints title "gradsync data plane alone"
EOP
done)
unset multiplot
GP
  else
    echo "run.sh: gnuplot not found: no plot (apt-get install gnuplot-nox)" >&2
  fi
  echo "run.sh: done in $(($(date +%s) - start)) s" >&2
  exit 0
fi

# The tag names the coordinator settings in effect (defaults filled in).
tag_of() {
  local fusion=67108864 policy=adaptive cache=1024 cycle=1 mpif=2
  while [ $# -gt 1 ]; do
    case "$1" in
    --fusion-threshold) fusion=$2 ;;
    --emit-policy) policy=$2 ;;
    --cache-capacity) cache=$2 ;;
    --cycle-time-ms) cycle=$2 ;;
    --max-plans-in-flight) mpif=$2 ;;
    esac
    shift 2
  done
  echo "fusion=$fusion policy=$policy cache=$cache cycle_ms=$cycle mpif=$mpif"
}

# one CASE ROUND NP "COORD FLAGS" BENCH-ARGS...
one() {
  local name=$1 round=$2 np=$3 flags=$4
  shift 4
  local ca=() f
  for f in $flags; do ca+=(--coord-arg "$f"); done
  local tag
  tag=$(tag_of $flags)
  local line rc=0
  "$run" -np "$np" "${ca[@]}" --timeout 150 "$bin" "$@" --tag "$tag" >"$out.log" 2>"$out.err" ||
    rc=$?
  line=$(sed -n 's/^\[0\] RESULT //p' "$out.log")
  if [ "$rc" != 0 ] || [ -z "$line" ]; then
    echo "run.sh: case $name (np=$np round $round) failed (exit $rc); its stderr:" >&2
    tail -5 "$out.err" >&2
    echo "CASE $name round=$round FAILED" >>"$out"
    return
  fi
  echo "CASE $name round=$round $line" >>"$out"
}

# bytes_of CASE ROUND NP: total bytes of that run (for the raw baseline).
bytes_of() {
  awk -v c="$1" -v r="round=$2" -v np="np=$3" '$2 == c && $3 == r && $5 == np {
    for (i = 6; i <= NF; i++) if ($i ~ /^bytes=/) { sub(/^bytes=/, "", $i); print $i; exit } }' "$out"
}

# The configurations, per np. Step counts keep every run to a few seconds.
cases() {
  local np=$1 round=$2
  local g="--gap-us 100 --scale 32" # control-plane bound: comm hides behind "backward"
  local s="--steps 12 --warmup 2"
  local bscale=1 bs="--steps 5 --warmup 1"
  if [ "$np" -gt 2 ]; then bscale=4; fi # BERT at np=4: 4 copies of 418 MiB on 2 cores
  # fusion: 200 x 16 KiB one by one vs fused, and the control-plane floor
  one u200.f0 "$round" "$np" "--fusion-threshold 0" --uniform 200x16384 --steps 30 --warmup 3
  one u200.fused "$round" "$np" "" --uniform 200x16384 --steps 30 --warmup 3
  one u200.f1m "$round" "$np" "--fusion-threshold 1048576" --uniform 200x16384 --steps 30 \
    --warmup 3
  one u200.raw "$round" "$np" "" --raw-allreduce 3276800 --steps 30 --warmup 3
  one u200.tiny "$round" "$np" "" --uniform 200x4 --steps 30 --warmup 3
  one raw4 "$round" "$np" "" --raw-allreduce 4 --steps 30 --warmup 3
  # an isolated submission at a random phase of the worker's cycle (jitter)
  one floor.raw4 "$round" "$np" "" --raw-allreduce 4 --steps 30 --warmup 3 --jitter-us 10000
  one floor.raw4c5 "$round" "$np" "--cycle-time-ms 5" --raw-allreduce 4 --steps 30 --warmup 3 \
    --jitter-us 10000
  # real gradient sets vs one raw allreduce of the same bytes; fusion threshold sweep
  one rn.fused "$round" "$np" "" --workload "$resnet" $s
  one rn.raw "$round" "$np" "" --raw-allreduce "$(bytes_of rn.fused "$round" "$np")" $s
  one rn.f0 "$round" "$np" "--fusion-threshold 0" --workload "$resnet" $s
  one rn.f1m "$round" "$np" "--fusion-threshold 1048576" --workload "$resnet" $s
  one rn.f4m "$round" "$np" "--fusion-threshold 4194304" --workload "$resnet" $s
  one rn.f16m "$round" "$np" "--fusion-threshold 16777216" --workload "$resnet" $s
  one bert.fused "$round" "$np" "" --workload "$bert" --scale $bscale $bs
  one bert.raw "$round" "$np" "" --raw-allreduce "$(bytes_of bert.fused "$round" "$np")" $bs
  one bert.f0 "$round" "$np" "--fusion-threshold 0" --workload "$bert" --scale $bscale $bs
  one bert.f1m "$round" "$np" "--fusion-threshold 1048576" --workload "$bert" --scale $bscale $bs
  one bert.f4m "$round" "$np" "--fusion-threshold 4194304" --workload "$bert" --scale $bscale $bs
  one bert.f16m "$round" "$np" "--fusion-threshold 16777216" --workload "$bert" --scale $bscale $bs
  [ "$quick" = 1 ] && return
  # emission policy, control-plane bound (ResNet-50 / 32, 100 us "backward" gaps)
  one pol.a2 "$round" "$np" "" --workload "$resnet" $g $s
  one pol.a1 "$round" "$np" "--max-plans-in-flight 1" --workload "$resnet" $g $s
  one pol.a4 "$round" "$np" "--max-plans-in-flight 4" --workload "$resnet" $g $s
  one pol.w1 "$round" "$np" "--emit-policy window" --workload "$resnet" $g $s
  one pol.a2c5 "$round" "$np" "--cycle-time-ms 5" --workload "$resnet" $g $s
  one pol.w5 "$round" "$np" "--emit-policy window --cycle-time-ms 5" --workload "$resnet" $g $s
  one pol.f0 "$round" "$np" "--fusion-threshold 0" --workload "$resnet" $g $s
  if [ "$np" -le 2 ]; then
    # emission policy, data-plane bound (full ResNet-50, same gaps)
    one dpol.a2 "$round" "$np" "" --workload "$resnet" --gap-us 100 $s
    one dpol.a1 "$round" "$np" "--max-plans-in-flight 1" --workload "$resnet" --gap-us 100 $s
    one dpol.a4 "$round" "$np" "--max-plans-in-flight 4" --workload "$resnet" --gap-us 100 $s
    one dpol.w1 "$round" "$np" "--emit-policy window" --workload "$resnet" --gap-us 100 $s
    one dpol.w5 "$round" "$np" "--emit-policy window --cycle-time-ms 5" --workload "$resnet" \
      --gap-us 100 $s
  fi
  # response cache: upstream bytes per step
  one cache.off "$round" "$np" "--cache-capacity 0" --workload "$resnet" $g $s
  one cache.on "$round" "$np" "" --workload "$resnet" $g $s
  one cache.bert.off "$round" "$np" "--cache-capacity 0" --workload "$bert" --scale 64 $s
  one cache.bert.on "$round" "$np" "" --workload "$bert" --scale 64 $s
  one cache.c128 "$round" "$np" "--cache-capacity 128" --workload "$resnet" $g $s
}

for np in $nps; do
  r=1
  n=$rounds
  [ "$np" -gt 2 ] && n=1 # oversubscribed: one round keeps the budget
  while [ "$r" -le "$n" ]; do
    echo "run.sh: np=$np round $r/$n ($(($(date +%s) - start)) s so far)" >&2
    cases "$np" "$r"
    r=$((r + 1))
  done
done
rm -f "$out.err" "$out.log"

# ---- report -----------------------------------------------------------------
# med CASE KEY NP: median over rounds of KEY in the RESULT lines of CASE.
med() {
  awk -v c="$1" -v k="$2" -v np="$3" '
    $1 == "CASE" && $2 == c {
      ok = 0; v = ""
      for (i = 3; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "np" && kv[2] == np) ok = 1
        if (kv[1] == k) v = kv[2]
      }
      if (ok && v != "") a[n++] = v + 0
    }
    END {
      if (!n) { print "nan"; exit }
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      print (n % 2) ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2
    }' "$out"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.2f", a / b }'; }
has() { grep -q "^CASE $1 .* np=$2 " "$out"; }

row() { # CASE NP LABEL
  local c=$1 np=$2
  has "$c" "$np" || return 0
  printf "| %-15s | %2s | %-46s | %8s | %8s | %8s | %8s | %6s | %6s | %9s | %5s | %7s |\n" "$c" \
    "$np" "$3" "$(med "$c" step_ms "$np")" "$(med "$c" crit_ms "$np")" "$(med "$c" step_q1 "$np")" \
    "$(med "$c" step_q3 "$np")" "$(med "$c" collectives "$np")" "$(med "$c" tensors_per_op "$np")" \
    "$(med "$c" up_bytes "$np")" "$(med "$c" hit_rate "$np")" "$(med "$c" barrier_ms "$np")"
}

echo
echo "gradsync benchmarks — $(nproc) CPUs, loopback, rounds=$rounds, $(date -u +%Y-%m-%dT%H:%MZ), raw lines: $out"
echo
echo "| case            | np | setting                                        |  step ms |  crit ms |  step q1 |  step q3 |  colls |  t/op  | up B/step |  hits | barrier |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for np in $nps; do
  row u200.f0 "$np" "200x16KiB, fusion 0 (one by one)"
  row u200.fused "$np" "200x16KiB, fusion 64 MiB"
  row u200.f1m "$np" "200x16KiB, fusion 1 MiB"
  row u200.raw "$np" "one raw allreduce of 3.125 MiB"
  row u200.tiny "$np" "200 x 4 B, fused (control cost per tensor)"
  row raw4 "$np" "one allreduce of 4 B, right after the barrier"
  row floor.raw4 "$np" "one allreduce of 4 B, random phase, cycle 1 ms"
  row floor.raw4c5 "$np" "one allreduce of 4 B, random phase, cycle 5 ms"
  row rn.fused "$np" "ResNet-50, defaults (fusion 64 MiB)"
  row rn.raw "$np" "one raw allreduce of the same bytes"
  row rn.f0 "$np" "ResNet-50, fusion 0"
  row rn.f1m "$np" "ResNet-50, fusion 1 MiB"
  row rn.f4m "$np" "ResNet-50, fusion 4 MiB"
  row rn.f16m "$np" "ResNet-50, fusion 16 MiB"
  row bert.fused "$np" "BERT-base$([ "$np" -gt 2 ] && echo /4), defaults (fusion 64 MiB)"
  row bert.raw "$np" "one raw allreduce of the same bytes"
  row bert.f0 "$np" "BERT-base$([ "$np" -gt 2 ] && echo /4), fusion 0"
  row bert.f1m "$np" "BERT-base$([ "$np" -gt 2 ] && echo /4), fusion 1 MiB"
  row bert.f4m "$np" "BERT-base$([ "$np" -gt 2 ] && echo /4), fusion 4 MiB"
  row bert.f16m "$np" "BERT-base$([ "$np" -gt 2 ] && echo /4), fusion 16 MiB"
  row pol.a2 "$np" "ResNet/32 +gaps: adaptive, 2 in flight, 1 ms"
  row pol.a1 "$np" "ResNet/32 +gaps: adaptive, 1 in flight"
  row pol.a4 "$np" "ResNet/32 +gaps: adaptive, 4 in flight"
  row pol.a2c5 "$np" "ResNet/32 +gaps: adaptive, 2, cycle 5 ms"
  row pol.w1 "$np" "ResNet/32 +gaps: window, cycle 1 ms"
  row pol.w5 "$np" "ResNet/32 +gaps: window, cycle 5 ms"
  row pol.f0 "$np" "ResNet/32 +gaps: fusion 0"
  row dpol.a2 "$np" "ResNet +gaps: adaptive, 2 in flight"
  row dpol.a1 "$np" "ResNet +gaps: adaptive, 1 in flight"
  row dpol.a4 "$np" "ResNet +gaps: adaptive, 4 in flight"
  row dpol.w1 "$np" "ResNet +gaps: window, cycle 1 ms"
  row dpol.w5 "$np" "ResNet +gaps: window, cycle 5 ms"
  row cache.off "$np" "ResNet/32 +gaps: cache 0"
  row cache.on "$np" "ResNet/32 +gaps: cache 1024"
  row cache.bert.off "$np" "BERT/64: cache 0"
  row cache.bert.on "$np" "BERT/64: cache 1024"
  row cache.c128 "$np" "ResNet/32 +gaps: cache 128 (< 161 tensors)"
done

echo
echo "| ratio | np | value |"
echo "|---|---|---|"
rr() { # LABEL NP CASE-A KEY-A CASE-B KEY-B
  has "$3" "$2" && has "$5" "$2" || return 0
  printf "| %-62s | %s | %s |\n" "$1" "$2" "$(ratio "$(med "$3" "$4" "$2")" "$(med "$5" "$6" "$2")")"
}
for np in $nps; do
  rr "200x16KiB step: one by one / fused" "$np" u200.f0 step_ms u200.fused step_ms
  rr "200x16KiB step: fusion 1 MiB / fusion 64 MiB" "$np" u200.f1m step_ms u200.fused step_ms
  rr "200x16KiB step: fused / one raw allreduce of 3.125 MiB" "$np" u200.fused step_ms u200.raw step_ms
  rr "ResNet-50 step: defaults / one raw allreduce of the same bytes" "$np" rn.fused step_ms rn.raw step_ms
  rr "ResNet-50 step: fusion 0 / fusion 64 MiB" "$np" rn.f0 step_ms rn.fused step_ms
  rr "ResNet-50 step: fusion 1 MiB / one raw allreduce" "$np" rn.f1m step_ms rn.raw step_ms
  rr "ResNet-50 step: fusion 4 MiB / one raw allreduce" "$np" rn.f4m step_ms rn.raw step_ms
  rr "ResNet-50 step: fusion 16 MiB / one raw allreduce" "$np" rn.f16m step_ms rn.raw step_ms
  rr "BERT-base step: defaults / one raw allreduce of the same bytes" "$np" bert.fused step_ms bert.raw step_ms
  rr "BERT-base step: fusion 0 / fusion 64 MiB" "$np" bert.f0 step_ms bert.fused step_ms
  rr "BERT-base step: fusion 1 MiB / one raw allreduce" "$np" bert.f1m step_ms bert.raw step_ms
  rr "BERT-base step: fusion 4 MiB / one raw allreduce" "$np" bert.f4m step_ms bert.raw step_ms
  rr "BERT-base step: fusion 16 MiB / one raw allreduce" "$np" bert.f16m step_ms bert.raw step_ms
  rr "200 x 4 B fused / one 4 B allreduce (per-tensor control cost)" "$np" u200.tiny step_ms raw4 step_ms
  rr "4 B allreduce at random phase: cycle 5 ms / 1 ms" "$np" floor.raw4c5 step_ms floor.raw4 step_ms
  rr "ResNet/32 crit: window 1 ms / adaptive 2" "$np" pol.w1 crit_ms pol.a2 crit_ms
  rr "ResNet/32 crit: window 5 ms / adaptive 2 (cycle 5 ms)" "$np" pol.w5 crit_ms pol.a2c5 crit_ms
  rr "ResNet/32 crit: adaptive 1 in flight / 2" "$np" pol.a1 crit_ms pol.a2 crit_ms
  rr "ResNet/32 crit: adaptive 4 in flight / 2" "$np" pol.a4 crit_ms pol.a2 crit_ms
  rr "ResNet/32 crit: adaptive cycle 5 ms / 1 ms" "$np" pol.a2c5 crit_ms pol.a2 crit_ms
  rr "ResNet/32 crit: fusion 0 / adaptive 2" "$np" pol.f0 crit_ms pol.a2 crit_ms
  rr "ResNet crit: window 1 ms / adaptive 2" "$np" dpol.w1 crit_ms dpol.a2 crit_ms
  rr "ResNet crit: window 5 ms / adaptive 2" "$np" dpol.w5 crit_ms dpol.a2 crit_ms
  rr "ResNet crit: adaptive 1 in flight / 2" "$np" dpol.a1 crit_ms dpol.a2 crit_ms
  rr "ResNet crit: adaptive 4 in flight / 2" "$np" dpol.a4 crit_ms dpol.a2 crit_ms
  rr "ResNet/32 upstream bytes/step: cache 0 / cache 1024" "$np" cache.off up_bytes cache.on up_bytes
  rr "BERT/64 upstream bytes/step: cache 0 / cache 1024" "$np" cache.bert.off up_bytes cache.bert.on up_bytes
  rr "ResNet/32 crit: cache 0 / cache 1024" "$np" cache.off crit_ms cache.on crit_ms
done
echo
echo "run.sh: done in $(($(date +%s) - start)) s" >&2
[ "$control" = 1 ] && control_plane
exit 0
