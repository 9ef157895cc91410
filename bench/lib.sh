# shellcheck shell=bash disable=SC2154 # $out: set by the script that sources this file
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

# Paired runs. The target ratios of issues 14 and 15 are measured in pairs:
# the two sides (say gradsync and the MPI peer) run one after the other, the
# order reversed in every other pair, and a pair's ratio compares two runs
# made seconds apart. Their lines carry pair=K (K counts the pairs of one np
# across the rounds).

# pair_order K A B...: the members in the order of pair K: as given in odd
# pairs, reversed in even ones, so that no side always runs first.
pair_order() {
  local k=$1 i
  shift
  if [ $((k % 2)) = 1 ]; then
    echo "$@"
  else
    local a=("$@")
    for ((i = ${#a[@]} - 1; i >= 0; i--)); do printf '%s ' "${a[i]}"; done
    echo
  fi
}

# pair_range R ROUNDS PAIRS: the numbers of the pairs round R runs ("FIRST
# LAST"; LAST < FIRST when none): the pairs spread over the rounds.
pair_range() {
  echo "$(($3 * ($1 - 1) / $2 + 1)) $(($3 * $1 / $2))"
}

# pair_stat A B KEY NP BOUND [FIELD=VALUE]: over the pairs in the file $out
# that have both a "CASE A" and a "CASE B" line with pair=K at np=NP (and
# FIELD=VALUE when given): "PAIRS RATIO UNDER MED-A MED-B LOW HIGH" — how
# many pairs, the median of the per-pair ratios A/B of KEY (2 decimals), how
# many pairs have a ratio <= BOUND, the medians of KEY of each side over
# those pairs, and the lowest and highest per-pair ratio; "0 nan 0 nan nan
# nan nan" when no pair is complete.
pair_stat() {
  awk -v a="$1" -v b="$2" -v k="$3" -v np="np=$4" -v bound="$5" -v extra="${6:-}" '
    function median(v, n,   i, j, t) {
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      return (n % 2) ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2
    }
    $1 == "CASE" && ($2 == a || $2 == b) && index(" " $0 " ", " " np " ") &&
      (extra == "" || index(" " $0 " ", " " extra " ")) {
      p = ""; x = ""
      for (i = 3; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "pair" && p == "") p = kv[2]
        if (kv[1] == k && x == "") x = kv[2]
      }
      if (p == "" || x == "" || x == "n/a") next
      if ($2 == a) va[p] = x + 0; else vb[p] = x + 0
    }
    END {
      n = 0
      for (p in va) if ((p in vb) && vb[p] > 0) {
        r[n] = va[p] / vb[p]; sa[n] = va[p]; sb[n] = vb[p]; if (r[n] <= bound + 0) u++; n++
      }
      if (!n) { print "0 nan 0 nan nan nan nan"; exit }
      m = median(r, n) # sorts r
      printf "%d %.2f %d %s %s %.2f %.2f\n", n, m, u + 0, median(sa, n), median(sb, n), r[0], r[n - 1]
    }' "$out"
}
