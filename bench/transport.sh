#!/usr/bin/env bash
# bench/transport.sh — the host transports side by side with OpenMPI
# (the "Host transports" section of docs/benchmarks.md).
#
#   bench/transport.sh [--build DIR] [--rounds R] [--np "2 4"] [--sizes B,B,...] [--out FILE]
#   bench/transport.sh --report FILE... [--np "2 4"] [--sizes B,B,...]   table of earlier runs
#
# Per round (rounds interleaved, so that drift on a shared machine hits every
# configuration alike) and per np, one float32 in-place allreduce per size:
#   gs-shm-direct / gs-tcp-direct  the backend called directly (gs-transport-bench)
#   gs-shm / gs-tcp                gradsync end to end through gradsyncd
#                                  (gradsync-bench --raw-allreduce: GS_AVERAGE,
#                                  GRADSYNC_BACKEND=shm or tcp)
#   ompi-shm / ompi-tcp            OpenMPI's MPI_Allreduce (MPI_SUM), btl vader or
#                                  tcp over loopback (bench/mpi_allreduce.c, built
#                                  here with mpicc: needs libopenmpi-dev)
# Every run reports the median over its calls of the slowest rank; the table
# shows the median over rounds, bus bandwidth 2(n-1)/n*bytes/time, and the
# ratios against OpenMPI shared memory. Load averages before and after are
# printed: only compare numbers from a quiet machine. Not a test.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${GRADSYNC_BUILD:-$root/build-bench}
rounds=3
nps="2 4"
sizes="4096,65536,1048576,16777216,67108864"
out=""
report=()
while [ $# -gt 0 ]; do
  case "$1" in
  --build) build=$2; shift 2 ;;
  --rounds) rounds=$2; shift 2 ;;
  --np) nps=$2; shift 2 ;;
  --sizes) sizes=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  --report) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do report+=("$1"); shift; done ;;
  -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "transport.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
if [ ${#report[@]} -gt 0 ]; then # rounds renumbered across the files
  out=$(mktemp /tmp/gradsync-transport.XXXXXX)
  k=0
  for f in "${report[@]}"; do
    k=$((k + 1))
    sed "s/^RESULT round=\([0-9]*\) /RESULT round=$k.\1 /" "$f" >>"$out"
  done
else
bin=$build/bin
for f in gradsync-run gradsyncd gradsync-bench gs-transport-bench; do
  [ -x "$bin/$f" ] || { echo "transport.sh: $bin/$f not found; build first:" \
    "cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-bench" >&2; exit 1; }
done
mpi=$bin/mpi-allreduce
if [ ! -x "$mpi" ] || [ "$here/mpi_allreduce.c" -nt "$mpi" ]; then
  command -v mpicc >/dev/null || { echo "transport.sh: mpicc not found (apt-get install libopenmpi-dev)" >&2; exit 1; }
  mpicc -O2 -o "$mpi" "$here/mpi_allreduce.c" || exit 1
fi
[ -n "$out" ] || out=$(mktemp /tmp/gradsync-transport.XXXXXX)
: >"$out"
# Both sides get large allocations from the heap, not fresh mmaps per call
# (OpenMPI's 64 MiB temporaries otherwise page-fault on every call).
export MALLOC_MMAP_THRESHOLD_=1073741824
reps_of() { # fewer calls for big sizes, to keep a run to seconds
  if [ "$1" -ge 16777216 ]; then echo 10; elif [ "$1" -ge 1048576 ]; then echo 30; else echo 100; fi
}
mpirun_() {
  mpirun --allow-run-as-root --oversubscribe --bind-to none -x MALLOC_MMAP_THRESHOLD_ "$@"
}

echo "transport.sh: $(date -u +%FT%TZ), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
for round in $(seq 1 "$rounds"); do
  for np in $nps; do
    for t in shm tcp; do
      for s in ${sizes//,/ }; do
        "$bin/gs-transport-bench" --transport $t --np "$np" --sizes "$s" --reps "$(reps_of "$s")" |
          sed "s/^RESULT /RESULT round=$round /" >>"$out" || echo "transport.sh: gs-$t-direct np=$np $s failed" >&2
        line=$(timeout 300 "$bin/gradsync-run" -np "$np" env GRADSYNC_BACKEND=$t \
          "$bin/gradsync-bench" --raw-allreduce "$s" --steps "$(reps_of "$s")" --warmup 3 2>/dev/null |
          sed -n 's/^.*\(RESULT .*\)$/\1/p' | head -n1)
        ms=$(sed -n 's/.* step_ms=\([0-9.]*\).*/\1/p' <<<"$line")
        if [ -n "$ms" ]; then
          awk -v r="$round" -v t="$t" -v n="$np" -v b="$s" -v ms="$ms" 'BEGIN {
            us = ms * 1000; printf "RESULT round=%s impl=gs-%s np=%d bytes=%d median_us=%.1f busbw_gbs=%.2f\n",
              r, t, n, b, us, 2.0 * (n - 1) / n * b / us / 1e3 }' >>"$out"
        else
          echo "transport.sh: gs-$t np=$np $s failed" >&2
        fi
      done
    done
    for btl in vader tcp; do
      extra=()
      [ $btl = tcp ] && extra=(--mca btl_tcp_if_include lo)
      for s in ${sizes//,/ }; do
        mpirun_ -np "$np" --mca pml ob1 --mca btl self,$btl "${extra[@]}" "$mpi" --sizes "$s" \
          --reps "$(reps_of "$s")" --tag "ompi-${btl/vader/shm}" 2>/dev/null |
          grep '^RESULT' | sed "s/^RESULT /RESULT round=$round /" >>"$out" ||
          echo "transport.sh: ompi-$btl np=$np $s failed" >&2
      done
    done
  done
done
echo "transport.sh: $(( $(date +%s) - start )) s, load average after: $(cut -d' ' -f1-3 /proc/loadavg); raw lines in $out"
fi

# ---- the table ----------------------------------------------------------------
med() { # IMPL NP BYTES -> median over rounds of median_us
  grep " impl=$1 np=$2 bytes=$3 " "$out" | sed -n 's/.* median_us=\([0-9.]*\).*/\1/p' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
          else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
human() { awk -v b="$1" 'BEGIN { if (b >= 1048576) printf "%d MiB", b / 1048576; else printf "%d KiB", b / 1024 }'; }
echo
echo "Median time per allreduce in µs (bus bandwidth GB/s); ratio = OpenMPI shm time / gradsync time (≥ 1: gradsync as fast or faster)"
echo
echo "| np | size | ompi-shm | ompi-tcp | gs-shm-direct | gs-shm e2e | gs-tcp-direct | gs-tcp e2e | shm-direct ratio | shm e2e ratio |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for np in $nps; do
  for s in ${sizes//,/ }; do
    row="| $np | $(human "$s") |"
    for impl in ompi-shm ompi-tcp gs-shm-direct gs-shm gs-tcp-direct gs-tcp; do
      m=$(med "$impl" "$np" "$s")
      cell=$(awk -v m="$m" -v n="$np" -v b="$s" 'BEGIN { if (m == "-") print "-";
        else printf "%s (%.2f)", m, 2.0 * (n - 1) / n * b / m / 1e3 }')
      row="$row $cell |"
    done
    o=$(med ompi-shm "$np" "$s")
    for impl in gs-shm-direct gs-shm; do
      g=$(med "$impl" "$np" "$s")
      row="$row $(awk -v o="$o" -v g="$g" 'BEGIN { if (o == "-" || g == "-" || g == 0) print "-"; else printf "%.2f", o / g }') |"
    done
    echo "$row"
  done
done
