#!/usr/bin/env python3
"""Joins the hand-off traces of one gradsync job into a per-op breakdown.

  bench/handoffs.py DIR

DIR holds the files a GRADSYNC_HANDOFF_TRACE=ON build writes when
$GRADSYNC_HANDOFF_TRACE=DIR (common/handoff_trace.h): gradsyncd.<pid>.trace
and one <program>.<pid>.trace per rank. Meant for runs with one op per plan
(gradsync-bench --raw-allreduce: a barrier, then the op, every step): for
each plan it follows the rank whose request completed the entry (the one
the coordinator received last) from its submission to the coordinator and
back, and every rank from the plan to its application thread waking, and
prints the median and quartiles of every hand-off, per kind of op.
"""
import glob
import os
import statistics
import sys

SUBMIT, COMM_WAKE, SENT, SEND_DONE, CO_RECV, CO_PLAN, PLAN_RECV, EXEC_WAKE, COMPLETE, PLAN_DONE, APP_WAKE, RANK = range(1, 13)
OPS = {0: "allreduce", 1: "allgather", 2: "broadcast", 3: "alltoall", 4: "reducescatter", 5: "barrier", 6: "join"}


def load(path):
    ev = []
    with open(path) as f:
        for line in f:
            ns, p, a, b = line.split()
            ev.append((int(ns), int(p), int(a), int(b)))
    ev.sort()
    return ev


def first_after(ev, i, point, pred=None):
    for j in range(i, len(ev)):
        if ev[j][1] == point and (pred is None or pred(ev[j])):
            return j
    return None


def rank_ops(ev):
    """Per plan seq: this rank's timestamps of the op that plan carried."""
    out = {}
    subs = [i for i, e in enumerate(ev) if e[1] == SUBMIT]
    for k, i in enumerate(subs):
        end = subs[k + 1] if k + 1 < len(subs) else len(ev)
        seg = ev[i:end]
        r = {"submit": seg[0][0], "op": seg[0][2]}
        for name, point in (("wake", COMM_WAKE), ("sent", SENT), ("send_done", SEND_DONE)):
            j = first_after(seg, 0, point)
            if j is not None:
                r[name] = seg[j][0]
        j = first_after(seg, 0, PLAN_RECV)
        if j is None:
            continue
        seq = seg[j][2]
        r["plan_recv"] = seg[j][0]
        # the exec thread's events of this plan may run past the next submission
        j0 = ev.index(seg[j])
        for name, point in (("exec_wake", EXEC_WAKE), ("plan_done", PLAN_DONE)):
            jj = first_after(ev, j0, point, lambda e: e[2] == seq)
            if jj is not None:
                r[name] = ev[jj][0]
        if "exec_wake" in r:
            jx = first_after(ev, ev.index(next(e for e in ev if e[1] == EXEC_WAKE and e[2] == seq)), COMPLETE)
            if jx is not None:
                r["complete"] = ev[jx][0]
                ja = first_after(ev, jx, APP_WAKE)
                if ja is not None:
                    r["app_wake"] = ev[ja][0]
        out[seq] = r
    return out


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    d = sys.argv[1]
    co_files = glob.glob(os.path.join(d, "gradsyncd.*.trace"))
    rank_files = sorted(set(glob.glob(os.path.join(d, "*.trace"))) - set(co_files))
    if len(co_files) != 1 or not rank_files:
        print(f"{d}: need one gradsyncd.*.trace and the ranks' files", file=sys.stderr)
        return 1
    co = load(co_files[0])
    plans = {}  # seq -> (ns of the CO_RECV that completed it, rank, ns sent, op)
    last_recv = None
    for e in co:
        if e[1] == CO_RECV and e[3] > 0:
            last_recv = e
        elif e[1] == CO_PLAN and last_recv:
            plans[e[2]] = (last_recv[0], last_recv[2], e[0], e[3])
    ranks = {}
    for f in rank_files:
        ev = load(f)
        rk = [e[2] for e in ev if e[1] == RANK]
        if rk:
            ranks[rk[0]] = rank_ops(ev)
    segs = {}

    def add(op, name, v):
        segs.setdefault(op, {}).setdefault(name, []).append(v / 1000.0)

    for seq, (co_recv, co_rank, co_plan, _) in sorted(plans.items()):
        rs = [r[seq] for r in ranks.values() if seq in r]
        if len(rs) != len(ranks):
            continue
        op = OPS.get(rs[0]["op"], str(rs[0]["op"]))
        if any(k not in r for r in rs for k in ("sent", "plan_recv", "exec_wake", "complete", "app_wake")):
            continue
        if seq not in ranks.get(co_rank, {}):
            continue
        last = ranks[co_rank][seq]  # the rank whose request completed the entry
        if "wake" in last and last["submit"] <= last["wake"] <= last["sent"]:
            add(op, "1 submit -> comm thread wakes (last rank)", last["wake"] - last["submit"])
            add(op, "2 comm thread wakes -> request written (start_batch returned)", last["sent"] - last["wake"])
        else:
            add(op, "1+2 submit -> request written, no kick needed (last rank)", last["sent"] - last["submit"])
        add(op, "3 request written -> coordinator has it decoded", co_recv - last["sent"])
        add(op, "4 coordinator: engine, encode, plan written to every stream", co_plan - co_recv)
        add(op, "5 plan written -> rank's comm thread decoded it (slowest rank)", max(r["plan_recv"] for r in rs) - co_plan)
        add(op, "6 plan decoded -> exec thread takes it (slowest rank)", max(r["exec_wake"] - r["plan_recv"] for r in rs))
        add(op, "7a exec threads' start skew (last - first to take the plan)", max(r["exec_wake"] for r in rs) - min(r["exec_wake"] for r in rs))
        add(op, "7b last exec thread takes it -> last op complete (ring)", max(r["complete"] for r in rs) - max(r["exec_wake"] for r in rs))
        add(op, "8 op complete -> application thread awake (slowest rank)", max(r["app_wake"] - r["complete"] for r in rs))
        add(op, "= first submission -> last application wake", max(r["app_wake"] for r in rs) - min(r["submit"] for r in rs))
        add(op, "  last submission -> last application wake", max(r["app_wake"] for r in rs) - last["submit"])
    for op, d2 in segs.items():
        n = len(next(iter(d2.values())))
        print(f"{op}: {n} plans, µs (median [q1, q3])")
        for name in sorted(d2):
            v = sorted(d2[name])
            q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
            print(f"  {name:<66} {q[1]:8.1f}  [{q[0]:.1f}, {q[2]:.1f}]  n={len(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
