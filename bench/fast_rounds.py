#!/usr/bin/env python3
"""Phases of the fast rounds of one gradsync job, from its hand-off traces.

  bench/fast_rounds.py DIR [SKIP]

DIR holds the files a GRADSYNC_HANDOFF_TRACE=ON build writes when
$GRADSYNC_HANDOFF_TRACE=DIR (common/handoff_trace.h), one
<program>.<pid>.trace per rank (gradsyncd's is not needed: a fast round
never reaches it). Rounds are numbered alike on every rank; each rank stamps
a round's snapshot (FAST_START), its agreement's return (FAST_AGREED, with
the number of common ops, the barrier counting one) and the end of its ops
(FAST_END). For the rounds every rank finished (the first SKIP, default 20,
left out as warm-up), grouped by what they ran (a barrier alone; 150 or more
ops: a whole control-only ResNet-50 step; anything else), prints the median
and third quartile, in us, of:
  enter_spread           last rank's snapshot - first rank's
  last_in_to_agreed_min  last snapshot -> the first rank back from the agreement
  last_in_to_agreed_max  last snapshot -> the last rank back from it
  agreed_to_end          agreement -> ops completed (median rank)
  first_sub_to_start     this round's first submission -> snapshot (median rank)
  last_sub_to_start      its last submission -> snapshot (median rank)
  end_to_app_wake_med    ops completed -> the application thread awake (median rank)
  end_to_app_wake_max    the same, the last rank
  ops_in_snapshot_min    ops in the smallest rank's snapshot (a count, not us)
"""
import glob
import statistics
import sys

from handoffs import APP_WAKE, RANK, SUBMIT, load  # the same trace files (bench/handoffs.py)

FAST_START, FAST_AGREED, FAST_END = 13, 14, 15


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    skip = int(sys.argv[2]) if len(sys.argv) == 3 else 20
    ranks = {}
    for path in glob.glob(sys.argv[1] + "/*.trace"):
        ev = load(path)
        r = [e for e in ev if e[1] == RANK]
        if r:
            ranks[r[0][2]] = ev
    if not ranks:
        sys.exit("fast_rounds.py: no rank's trace in %s" % sys.argv[1])
    rounds = {}
    for r, ev in ranks.items():
        subs, last_end = [], 0
        for i, (t, p, a, b) in enumerate(ev):
            if p == SUBMIT:
                subs.append(t)
            elif p == FAST_START:
                mine = [s for s in subs if s > last_end]
                rounds.setdefault(a, {})[r] = {"start": t, "nsnap": b,
                                               "first_sub": min(mine) if mine else None,
                                               "last_sub": max(mine) if mine else None}
            elif p == FAST_AGREED and r in rounds.get(a, {}):
                rounds[a][r].update(agreed=t, ncommon=b)
            elif p == FAST_END and r in rounds.get(a, {}):
                rounds[a][r]["end"] = last_end = t
                wake = [x[0] for x in ev[i + 1:i + 400] if x[1] == APP_WAKE]
                rounds[a][r]["app_wake"] = wake[0] if wake else None
    kinds = {}
    for k in sorted(rounds)[skip:]:
        rr = rounds[k]
        if len(rr) < len(ranks) or any("end" not in x for x in rr.values()):
            continue
        nc = next(iter(rr.values()))["ncommon"]
        m = kinds.setdefault("barrier" if nc == 1 else "whole step" if nc >= 150 else "other", {})
        start = [x["start"] for x in rr.values()]
        agreed = [x["agreed"] for x in rr.values()]

        def add(name, v):
            m.setdefault(name, []).append(v)

        add("enter_spread", (max(start) - min(start)) / 1e3)
        add("last_in_to_agreed_min", (min(agreed) - max(start)) / 1e3)
        add("last_in_to_agreed_max", (max(agreed) - max(start)) / 1e3)
        add("agreed_to_end", statistics.median(x["end"] - x["agreed"] for x in rr.values()) / 1e3)
        for name, key in (("first_sub_to_start", "first_sub"), ("last_sub_to_start", "last_sub")):
            d = [x["start"] - x[key] for x in rr.values() if x[key]]
            if d:
                add(name, statistics.median(d) / 1e3)
        d = [x["app_wake"] - x["end"] for x in rr.values() if x["app_wake"]]
        if d:
            add("end_to_app_wake_med", statistics.median(d) / 1e3)
            add("end_to_app_wake_max", max(d) / 1e3)
        add("ops_in_snapshot_min", min(x["nsnap"] for x in rr.values()))
    for kind, m in kinds.items():
        print("%s rounds: %d" % (kind, len(m["enter_spread"])))
        for name, v in m.items():
            v = sorted(v)
            print("  %-22s median %8.1f  q3 %8.1f" % (name, statistics.median(v), v[3 * len(v) // 4]))


if __name__ == "__main__":
    main()
