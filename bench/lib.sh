# Shell functions the benchmark scripts share (sourced, not run).

# med CASE KEY NP: the median over rounds of KEY in the "CASE <case> <round>
# np=<np> key=value ..." lines of the file $out.
med() {
  awk -v c="$1" -v k="$2" -v np="$3" '
    $1 == "CASE" && $2 == c && $4 == "np=" np {
      for (i = 5; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) a[n++] = kv[2] + 0 }
    }
    END {
      if (!n) { print "nan"; exit }
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      print (n % 2) ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2
    }' "$out"
}
