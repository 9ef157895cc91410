#!/usr/bin/env python3
"""bench/targets.py — the targets of issues 14 and 15 against one run of bench/run.sh.

    python3 bench/targets.py RAW-DIR [--np "2 4"]

Reads the raw RESULT lines that the parts of `bench/run.sh` left in RAW-DIR
(control.txt, dataplane.txt, steps.txt, transport.txt, hosts.txt) and prints
the markdown table "Against the targets of issues 14 and 15 (this run)": one
row per target, the measured ratio at each np, the target and whether this
run meets it. Every figure is a median over the run's rounds of the per-run
medians, as in the parts' own tables, except the rows measured in pairs
(lines with pair=K: issue 14's control-only step against the MPI peer's
cached step, issue 15's GS_AVERAGE / GS_SUM time end to end and CPU time
at 64 MiB): their ratio is the median of the per-pair ratios, shown beside
each side's median over the pairs, the number of pairs, the lowest and
highest per-pair ratio and how many met the bound. A row whose part did
not run (or whose configurations are not in a --quick run) says "not
measured in this run";
the targets that tests check, not benchmarks, name the test. bench/run.sh
runs it at the end of its generated section of docs/benchmarks.md. Not a
test: timings are never pass/fail.
"""
import argparse
import os
import sys

NOT = "not measured in this run"
# The bare gRPC bidi ping-pong on loopback, 2 vCPUs (../shared/notes/grpc-c-core.md,
# "Measured floors"): the floor the targets of issue 14 were written against.
# Not measured by bench/run.sh; its round trip through gradsyncd (rank
# simulator, one rank) is, and is larger (the coordinator's engine answers).
PINGPONG_MS = 0.019


def load(path):
    """The lines of one raw file: (case, {key: value}) for CASE and RESULT lines."""
    recs = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                t = line.split()
                if not t:
                    continue
                if t[0] == "CASE" and len(t) > 1:
                    case, kvs = t[1], t[2:]
                elif t[0] == "RESULT":
                    case, kvs = None, t[1:]
                else:
                    continue
                kv = {}
                for x in kvs:
                    k, sep, v = x.partition("=")
                    if sep and k not in kv:
                        kv[k] = v
                if case is None:
                    case = kv.get("impl", "")
                recs.append((case, kv))
    except OSError:
        return None
    return recs


def median(v):
    v = sorted(v)
    n = len(v)
    if not n:
        return None
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def med(recs, case, key, **match):
    """Median over the lines of CASE whose fields equal MATCH of KEY; None if none."""
    if not recs:
        return None
    vals = []
    for c, kv in recs:
        if c != case or any(kv.get(k) != str(m) for k, m in match.items()):
            continue
        try:
            vals.append(float(kv[key]))
        except (KeyError, ValueError):
            pass
    return median(vals)


def pairs(recs, a, b, key, bound, **match):
    """The pairs of CASE a and CASE b: lines with the same pair=K whose fields
    equal MATCH. (pairs, median of the per-pair ratios a/b of KEY, pairs with a
    ratio <= bound, median of a, median of b, lowest ratio, highest ratio)
    over the complete pairs; None when there is none (a run older than the
    pairs: no pair= fields)."""
    if not recs:
        return None
    side = {a: {}, b: {}}
    for c, kv in recs:
        if c not in side or "pair" not in kv or any(kv.get(k) != str(m) for k, m in match.items()):
            continue
        try:
            side[c][kv["pair"]] = float(kv[key])
        except (KeyError, ValueError):
            pass
    ks = [k for k in side[a] if k in side[b] and side[b][k] > 0]
    if not ks:
        return None
    r = [side[a][k] / side[b][k] for k in ks]
    return (len(ks), median(r), sum(1 for x in r if x <= bound), median([side[a][k] for k in ks]),
            median([side[b][k] for k in ks]), min(r), max(r))


def paired_cell(p, bound, fmt, bound_text):
    """The cell of a paired ratio p (from pairs()); fmt formats each side's median."""
    n, r, under, ma, mb, lo, hi = p
    return Cell("%s / %s (medians of %d pairs) = **%.2f×**, the median of the per-pair ratios (%.2f–%.2f; %s: %d of "
                "%d pairs)" % (fmt(ma), fmt(mb), n, r, lo, hi, bound_text, under, n), r <= bound, le_over(r, bound))


def ms(x):
    """Milliseconds, 3 significant digits (µs below 0.1 ms)."""
    if x < 0.1:
        return "%.1f µs" % (x * 1000)
    return "%.3g ms" % x if x < 100 else "%.0f ms" % x


def us(x):
    return "%.1f µs" % x if x < 1000 else "%.2f ms" % (x / 1000)


def human(b):
    return "%d MiB" % (b // 1048576) if b >= 1048576 else "%d KiB" % (b // 1024)


class Cell:
    """One np's measurement: the text shown and, per ratio, whether it meets the target."""

    def __init__(self, text=NOT, ok=None, over=None):
        self.text, self.ok, self.over = text, ok, over


def verdict(cells, nps):
    """met / not met over the measured cells; how far the worst one is."""
    measured = [(np, c) for np, c in zip(nps, cells) if c.ok is not None]
    if not measured:
        return NOT
    bad = [(np, c) for np, c in measured if not c.ok]
    missing = [np for np, c in zip(nps, cells) if c.ok is None]
    if not bad:
        v = "met"
    elif len(bad) == len(measured):
        v = "not met"
    else:
        v = "not met at np=" + ", ".join(str(np) for np, _ in bad)
    far = [("np=%s: %s" % (np, c.over)) for np, c in bad if c.over]
    if far:
        v += " (" + "; ".join(far) + ")"
    if missing and len(nps) > 1:
        v += "; np=" + ", ".join(str(n) for n in missing) + " " + NOT
    return v


def le_over(r, bound, how="the bound"):
    """'how far' text of a ratio r that should be <= bound."""
    return "%.2f× %s" % (r / bound, how)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw", help="the raw directory of a bench/run.sh run")
    ap.add_argument("--np", default="2 4", help='the np values of the run (default "2 4")')
    a = ap.parse_args()
    nps = [int(x) for x in a.np.split()]
    raw = {p: load(os.path.join(a.raw, p + ".txt"))
           for p in ("control", "dataplane", "steps", "transport", "hosts")}

    rows = []  # (issue, target, [Cell per np] or str, verdict)

    def absent(part):
        return NOT + (" (no `%s` part)" % part if raw[part] is None else "")

    def row(issue, target, cells, how="", part=None):
        if isinstance(cells, str):
            rows.append((issue, target, [cells] + ["—"] * (len(nps) - 1), cells if cells.startswith(NOT) else how))
            return
        if part and all(c.ok is None for c in cells):
            cells = [Cell(absent(part)) for _ in cells]
        rows.append((issue, target, [c.text for c in cells], verdict(cells, nps)))

    # ---- issue 14 (control.txt) --------------------------------------------
    ctl = raw["control"]
    rtt = med(ctl, "rtt", "floor_ms", np=1)
    floor_note = ("round trip = one request and its answer through gradsyncd, measured in this run "
                  "(`gradsync-rank-sim --ranks 1`, its floor round: %s); the targets were written against a "
                  "bare gRPC bidi ping-pong, 19 µs on loopback with 2 vCPUs (`../shared/notes/grpc-c-core.md`), "
                  "which this run does not measure: the ratio against each is shown; ring = the TCP "
                  "ring alone (`gs-transport-bench --transport tcp`) in this run" % (ms(rtt) if rtt else NOT))

    def two(label, nums, bound):
        """Cells against the measured round trip and against the notes' ping-pong.
        nums(np, rt) -> (value_ms, floor_ms, text) or None."""
        a, b = [], []
        for np in nps:
            if rtt is None or nums(np, rtt) is None:
                a.append(Cell())
                b.append(Cell())
                continue
            v, fl, txt = nums(np, rtt)
            _, fl2, _ = nums(np, PINGPONG_MS)
            r, r2 = v / fl, v / fl2
            a.append(Cell("%s = **%.2f×**; with the 19 µs ping-pong: **%.2f×**" % (txt, r, r2), r <= bound,
                          le_over(r, bound)))
            b.append(Cell("", r2 <= bound, le_over(r2, bound)))
        return a, b

    def row2(target, pair):
        a, b = pair
        if all(c.ok is None for c in a):
            row(14, target, [Cell(absent("control")) for _ in nps])
            return
        rows.append((14, target, [c.text for c in a],
                     "against the round trip through gradsyncd: %s; against the 19 µs ping-pong: %s"
                     % (verdict(a, nps), verdict(b, nps))))

    def lone(np, rt):
        v = med(ctl, "lat.gs.4", "step_ms", np=np)
        ring = med(ctl, "ring.4", "median_us", np=np)
        if v is None or ring is None:
            return None
        return v, rt + ring / 1000, "%s / (%s + %s)" % (ms(v), ms(rt), us(ring))
    row2("Lone 4 B allreduce ≤ 3 × (one round trip + the TCP ring's 4 B allreduce)", two("lone", lone, 3))

    def control_cells(case):
        cells = []
        for np in nps:
            bound = 1.5 if np <= 2 else 1.0
            p = pairs(ctl, case, "ctl.mpi.cached", "step_ms", bound, np=np)
            if p:
                cells.append(paired_cell(p, bound, ms, "≤ %.1f" % bound))
                continue
            g = med(ctl, case, "step_ms", np=np)
            m = med(ctl, "ctl.mpi.cached", "step_ms", np=np)
            if g is None or m is None or m == 0:
                cells.append(Cell())
                continue
            r = g / m
            cells.append(Cell("%s / %s = **%.2f×** (≤ %.1f)" % (ms(g), ms(m), r, bound), r <= bound,
                              le_over(r, bound)))
        return cells
    what = ("ResNet-50 control-only step (161 × 4 B, cache warm, submissions included) ≤ 1.5 × the "
            "Horovod-style MPI negotiation's cached step at np=2, ≤ 1 × at np=4")
    row(14, what + ": 161 `gs_allreduce_async` calls", control_cells("ctl.gs"), part="control")
    # the same step submitted otherwise, when the run has it (bench/control.sh)
    for case, how in (("ctl.gs.grouped", "one `gs_grouped_allreduce_async` of the 161"),
                      ("ctl.gs.persistent", "161 persistent ops started by one `gs_startall`")):
        cells = control_cells(case)
        if any(c.ok is not None for c in cells):
            row(14, what + ": " + how, cells)

    def barrier(np, rt):
        v = med(ctl, "ctl.gs", "barrier_ms", np=np)
        if v is None:
            return None
        return v, 2 * rt, "%s / (2 × %s)" % (ms(v), ms(rt))
    row2("`gs_barrier` ≤ 2 round trips", two("barrier", barrier, 1))

    def gap(np, rt):
        coll = med(ctl, "gap.gs", "collectives", np=np)
        tpo = med(ctl, "gap.gs", "tensors_per_op", np=np)
        # crit_last_ms: from the latest rank's last submission (the last
        # gradient of the job) to the latest completion of that op; crit_ms
        # (each rank from its own last submission) also holds how far the
        # ranks' submissions drifted apart (skew_ms), which no protocol can
        # take back. Runs older than crit_last_ms: crit_ms.
        crit = med(ctl, "gap.gs", "crit_last_ms", np=np)
        own, skew = med(ctl, "gap.gs", "crit_ms", np=np), med(ctl, "gap.gs", "skew_ms", np=np)
        ring = med(ctl, "ring.16384", "median_us", np=np)
        if crit is None:
            crit, own = own, None
        if coll is None or crit is None or ring is None:
            return None
        extra = "" if own is None else " (each rank from its own last submission: %s, the ranks' last submissions " \
            "%s apart)" % (ms(own), ms(skew) if skew is not None else "n/a")
        # the baseline, when the run has it: the same case with gradsyncd
        # --fast-path off (bench/control.sh's gap.gs.off)
        off = med(ctl, "gap.gs.off", "collectives", np=np)
        base = "" if off is None else ", fast path off: %g" % off
        return crit, 2 * (rt + ring / 1000), "%g collectives per step for 161 tensors (%g per op%s); crit %s%s / " \
            "2 × (%s + %s)" % (coll, tpo if tpo is not None else 0, base, ms(crit), extra, ms(rt), us(ring))
    row2("No loss of batching, ResNet-50/32 with 100 µs gaps: collectives per step (beside the same case with "
         "the fast path off when the run has it) and critical path ≤ 2 × (round trip + the last collective's ring time; "
         "the last collective, conv1 and the first layers / 32, is a few KiB: the TCP ring's 16 KiB time)",
         two("gap", gap, 1))

    # the simulator has no np: one cell
    s64 = med(ctl, "sim.64.c1", "step_over_floor", np=1)
    if s64 is not None:
        st, fl = med(ctl, "sim.64.c1", "step_ms", np=1), med(ctl, "sim.64.c1", "floor_ms", np=1)
        row(14, "Simulator, N = 64, warm cache: step ≤ 2 × the floor of the same run (no np: N simulated ranks)",
            "%s / %s = **%.2f×**" % (ms(st), ms(fl), s64),
            "met" if s64 <= 2 else "not met (%s)" % le_over(s64, 2))
    else:
        row(14, "Simulator, N = 64, warm cache: step ≤ 2 × the floor of the same run (no np: N simulated ranks)",
            absent("control"))
    on = med(ctl, "sim.1024.c1", "coord_peak_rss_kib", np=1)
    off = med(ctl, "sim.1024.c0", "coord_peak_rss_kib", np=1)
    t = "Simulator, N = 1024 completes; coordinator peak RSS < 512 MiB"
    if on is None and off is None:
        row(14, t, absent("control"))
    else:
        got = [x for x in (on, off) if x is not None]
        txt = "completed; peak RSS %s MiB (cache on), %s MiB (off)" % tuple(
            "%.1f" % (x / 1024) if x is not None else "n/a" for x in (on, off))
        row(14, t, txt, "met" if all(x < 512 * 1024 for x in got) and len(got) == 2
            else "not met" if any(x >= 512 * 1024 for x in got) else "met where measured")
    ns = sorted({int(c.split(".")[1]) for c, _ in (ctl or []) if c.startswith("sim.") and c.count(".") == 2
                 and c.split(".")[1].isdigit()})
    parts = []
    for n in ns:
        a_, b_ = (med(ctl, "sim.%d.c%d" % (n, c), "coord_cpu_us_per_rank_step", np=1) for c in (1, 0))
        parts.append("N=%d: %s / %s" % (n, "%.0f" % a_ if a_ is not None else "n/a",
                                        "%.0f" % b_ if b_ is not None else "n/a"))
    row(14, "Coordinator CPU per rank per step reported (µs, cache on / off; 10 ms clock ticks: short runs read 0)",
        "; ".join(parts) if parts else absent("control"), "reported")

    # ---- issue 15 --------------------------------------------------------------
    dp, tr, hs, sp = raw["dataplane"], raw["transport"], raw["hosts"], raw["steps"]

    def speed_cells(recs, gs_case, mpi_case, sizes, key, gs_match=None, mpi_match=None, min_ratio=1.0):
        """OpenMPI time / gradsync time at each size (>= min_ratio: met)."""
        cells = []
        for np in nps:
            got, ok, far = [], True, []
            for b in sizes:
                g = med(recs, gs_case, key, np=np, bytes=b, **(gs_match or {}))
                m = med(recs, mpi_case, key, np=np, bytes=b, **(mpi_match or {}))
                if g is None or m is None or g == 0:
                    continue
                r = m / g
                got.append("%s %.2f×" % (human(b), r))
                if r < min_ratio:
                    ok = False
                    far.append("%.2f× at %s" % (r, human(b)))
            cells.append(Cell("; ".join(got), ok, ", ".join(far)) if got else Cell())
        return cells

    def time_cells(recs, gs_case, mpi_case, sizes, key, bound, gs_match=None, mpi_match=None):
        """gradsync time / OpenMPI time at each size (<= bound: met)."""
        cells = []
        for np in nps:
            got, ok, far = [], True, []
            for b in sizes:
                g = med(recs, gs_case, key, np=np, bytes=b, **(gs_match or {}))
                m = med(recs, mpi_case, key, np=np, bytes=b, **(mpi_match or {}))
                if g is None or m is None or m == 0:
                    continue
                r = g / m
                got.append("%s: %s / %s = **%.2f×**" % (human(b), us(g), us(m), r))
                if r > bound:
                    ok = False
                    far.append(le_over(r, bound))
            cells.append(Cell("; ".join(got), ok, ", ".join(far)) if got else Cell())
        return cells

    big = [16777216, 67108864]
    upto = [65536, 1048576, 16777216, 67108864]
    # The full run measures the one-host size sweep once, in the transport
    # part; its data-plane part then reads it (run.sh --sweep-from) and has no
    # OpenMPI lines of its own. A run without the sweep (the data-plane part
    # alone) has them.
    swept = dp is not None and not any(c == "mpi.shm" for c, _ in dp)
    from_tr = "measured once, in the `transport` part (row above): the data-plane part reads its sweep"

    def dp_row(target, cells):
        if swept:
            row(15, target, from_tr, "see the `transport` row")
        else:
            row(15, target, cells, part="dataplane")

    row(15, "End to end (through the coordinator): bus bandwidth ≥ OpenMPI shm from 16 to 64 MiB — `transport` "
        "part (gs-shm e2e, GS_AVERAGE; ratio = OpenMPI time / gradsync time)",
        speed_cells(tr, "gs-shm", "ompi-shm", big, "median_us"), part="transport")
    dp_row("… the same — `dataplane` part (gradsync-dataplane e2e, default backend)",
           speed_cells(dp, "gs.e2e", "mpi.shm", big, "us"))
    row(15, "End to end: time ≤ 1.25 × OpenMPI shm's at 1 MiB — `transport` part (gs-shm e2e)",
        time_cells(tr, "gs-shm", "ompi-shm", [1048576], "median_us", 1.25), part="transport")
    dp_row("… the same at 1 MiB — `dataplane` part", time_cells(dp, "gs.e2e", "mpi.shm", [1048576], "us", 1.25))
    row(15, "Data plane alone (backend called directly) ≥ OpenMPI shm from 64 KiB — `transport` part "
        "(gs-shm-direct, the backend chosen on one host; ratio = OpenMPI time / gradsync time)",
        speed_cells(tr, "gs-shm-direct", "ompi-shm", upto, "median_us"), part="transport")
    row(15, "… the same with the TCP ring alone — `transport` part (gs-tcp-direct)",
        speed_cells(tr, "gs-tcp-direct", "ompi-shm", upto, "median_us"), part="transport")
    dp_row("… the same with the TCP ring alone — `dataplane` part (gradsync-dataplane direct)",
           speed_cells(dp, "gs.direct", "mpi.shm", upto, "us"))
    row(15, "Data plane alone within 2 × OpenMPI shm's time for small messages (4 KiB) — `transport` part "
        "(gs-shm-direct)", time_cells(tr, "gs-shm-direct", "ompi-shm", [4096], "median_us", 2.0),
        part="transport")
    row(15, "… 4 KiB with the TCP ring alone — `transport` part (gs-tcp-direct)",
        time_cells(tr, "gs-tcp-direct", "ompi-shm", [4096], "median_us", 2.0), part="transport")
    dp_row("… 4 KiB with the TCP ring alone — `dataplane` part",
           time_cells(dp, "gs.direct", "mpi.shm", [4096], "us", 2.0))

    def step_cells(src, gkey, mkey, mfield):
        """Per np: a step (ms) over OpenMPI shm's allreduce of its bytes (µs);
        per round the median, then the median over rounds."""
        cells = []
        for np in nps:
            g = med(src, gkey, "step_ms", np=np)
            m = med(src, mkey, mfield, np=np)
            if g is None or m is None or m == 0:
                cells.append(Cell())
                continue
            r = g / (m / 1000)
            cells.append(Cell("%s / %s = **%.2f×**" % (ms(g), ms(m / 1000), r), r <= 1, le_over(r, 1)))
        return cells

    for w, name in (("resnet50", "ResNet-50"), ("bert_base", "BERT-base")):
        row(15, "%s step ≤ OpenMPI shm's allreduce of the same bytes — `steps` part%s" %
            (name, " (BERT-base full size at every np)" if w == "bert_base" else ""),
            step_cells(sp, "gs." + w, "mpi." + w, "median_us"), part="steps")
        row(15, "… the %s step, the same — `dataplane` part%s" % (name, " (BERT-base / 4 at np > 2)"
                                                                  if w == "bert_base" else ""),
            step_cells(dp, "step." + w, "mpi.step." + w, "us"), part="dataplane")

    cells = []
    for np in nps:
        p = pairs(dp, "gs.e2e.avg", "gs.e2e.sum", "us", 1.03, np=np, bytes=67108864)
        if p:
            cells.append(paired_cell(p, 1.03, us, "≤ 1.03"))
            continue
        # a run older than the pairs: one AVERAGE run (16, 64 MiB) and one SUM
        # run (1, 16, 64 MiB) per round
        a_ = med(dp, "gs.avg", "us", np=np, bytes=67108864)
        s_ = med(dp, "gs.e2e", "us", np=np, bytes=67108864)
        if a_ is None or s_ is None or s_ == 0:
            cells.append(Cell())
            continue
        r = a_ / s_
        cells.append(Cell("%s / %s = **%.2f×**" % (us(a_), us(s_), r), r <= 1.03, le_over(r, 1.03)))
    row(15, "GS_AVERAGE ≤ 1.03 × GS_SUM at 64 MiB: time end to end — `dataplane` part", cells, part="dataplane")
    cells = []
    for np in nps:
        p = pairs(dp, "gs.direct.avg", "gs.direct.sum", "cpu_us", 1.03, np=np, bytes=67108864)
        if p:
            cells.append(paired_cell(p, 1.03, us, "≤ 1.03"))
            continue
        # a run older than the pairs: one AVERAGE and one SUM run per round
        a_ = med(dp, "gs.direct.avg", "cpu_us", np=np, bytes=67108864)
        s_ = med(dp, "gs.direct", "cpu_us", np=np, bytes=67108864)
        if a_ is None or s_ is None or s_ == 0:
            cells.append(Cell())
            continue
        r = a_ / s_
        cells.append(Cell("%s / %s = **%.2f×**" % (us(a_), us(s_), r), r <= 1.03, le_over(r, 1.03)))
    row(15, "… the same: CPU time per call, data plane alone, rank 0 (the load-proof measure) — `dataplane` part",
        cells, part="dataplane")

    hsizes = sorted({int(kv["bytes"]) for c, kv in (hs or []) if c == "gs" and kv.get("bytes", "").isdigit()
                     and int(kv["bytes"]) >= 1048576})
    row(15, "Across hosts (ranks in separate network namespaces) ≥ OpenMPI tcp at ≥ 1 MiB — `hosts` part "
        "(ratio = OpenMPI time / gradsync time)",
        speed_cells(hs, "gs", "ompi-tcp", hsizes, "us") if hsizes else [Cell() for _ in nps], part="hosts")

    cells = []
    for np in nps:
        g = med(hs, "gs-step", "us", np=np)
        o = med(hs, "ompi-step-tcp", "us", np=np)
        if g is None or o is None or g == 0:
            cells.append(Cell())
            continue
        r = o / g
        cells.append(Cell("%s / %s = **%.2f×**" % (us(o), us(g), r), r >= 1, "%.2f×" % r))
    row(15, "… a ResNet-50 step across hosts vs OpenMPI tcp's allreduce of the same bytes (OpenMPI time / "
        "gradsync step) — `hosts` part", cells, part="hosts")

    row(15, "No segment left in `/dev/shm` after `kill -9` of any rank",
        "a test, not a benchmark: `test_shm` (kill -9 of a peer, of the leader before it is attached) and `test_fault` "
        "(SIGKILL of the shm leader, of a member)", "checked by ctest, not by this run")
    det = []
    for np in nps:
        d = med(dp, "gs.det", "us", np=np, bytes=67108864)
        e = med(dp, "gs.e2e", "us", np=np, bytes=67108864)
        if d is not None and e:
            det.append("np=%d %.2f×" % (np, d / e))
    row(15, "Deterministic mode: identical checksums across 5 runs with different fusion thresholds and timings",
        "a test, not a benchmark: `test_deterministic`" +
        ("; its cost in this run (deterministic / default time at 64 MiB, `dataplane` part): " + ", ".join(det)
         if det else ""), "checked by ctest, not by this run")

    # ---- the table -------------------------------------------------------------
    print("### Against the targets of issues 14 and 15 (this run)")
    print()
    print("Computed by `bench/targets.py` from this run's raw lines (medians over rounds of each run's median, "
          "as in the parts' tables above; the rows measured in pairs, each pair the two sides run back to back in "
          "turns: the median of the per-pair ratios). Floors of issue 14: " + floor_note + ". Ratios in bold; "
          "\"how far\" is the ratio over its bound at the np that misses.")
    print()
    print("| issue | target | " + " | ".join("np=%d" % n for n in nps) + " | verdict |")
    print("|---|---|" + "---|" * len(nps) + "---|")
    for issue, target, cells, v in rows:
        print("| %d | %s | %s | %s |" % (issue, target, " | ".join(c if c else "" for c in cells), v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
