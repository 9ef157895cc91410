# Shell functions the benchmark scripts share (sourced, not run).

# need_bins SCRIPT BIN-DIR PROGRAM...: exits 1, saying how to build, unless
# every PROGRAM is an executable in BIN-DIR.
need_bins() {
  local script=$1 dir=$2 f
  shift 2
  for f in "$@"; do
    [ -x "$dir/$f" ] || { echo "$script: $dir/$f not found; build first:" \
      "cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build-bench" >&2; exit 1; }
  done
}

# med CASE KEY NP: the median over rounds of KEY in the "CASE <case> <round>
# np=<np> key=value ..." lines of the file $out; "nan" when none has KEY,
# "n/a" when the lines have it only as n/a (gradsync-bench: no shared clock).
med() {
  awk -v c="$1" -v k="$2" -v np="$3" '
    $1 == "CASE" && $2 == c && $4 == "np=" np {
      for (i = 5; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] != k) continue
        if (kv[2] == "n/a") na = 1; else a[n++] = kv[2] + 0
      }
    }
    END {
      if (!n) { print (na ? "n/a" : "nan"); exit }
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      print (n % 2) ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2
    }' "$out"
}
