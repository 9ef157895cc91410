#!/usr/bin/env python3
"""bench/targets.py: the table against the targets of issues 14 and 15 from raw lines.

Feeds it raw files in the formats the parts of bench/run.sh write (control,
dataplane, steps, transport, hosts) and checks the ratios, verdicts and the
rows of parts that did not run.
"""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = os.path.join(HERE, "..", "..", "bench", "targets.py")

CONTROL = """\
CASE rtt round=1 np=1 case=sim ranks=1 tensors=161 cache=1 steps=200 floor_ms=0.100 step_ms=0.2
CASE rtt round=2 np=1 case=sim ranks=1 tensors=161 cache=1 steps=200 floor_ms=0.080 step_ms=0.2
CASE rtt round=3 np=1 case=sim ranks=1 tensors=161 cache=1 steps=200 floor_ms=0.900 step_ms=0.2
CASE ring.4 round=1 np=2 impl=gs-tcp-direct np=2 bytes=4 median_us=20.0 busbw_gbs=0.00
CASE ring.16384 round=1 np=2 impl=gs-tcp-direct np=2 bytes=16384 median_us=50.0 busbw_gbs=0.2
CASE lat.gs.4 round=1 np=2 workload=raw4 np=2 tensors=1 bytes=4 step_ms=0.300 barrier_ms=0.1
CASE ctl.gs round=1 np=2 workload=resnet50 np=2 tensors=161 bytes=644 step_ms=0.600 barrier_ms=0.360
CASE ctl.mpi.cached round=1 np=2 case=mpi.negotiation np=2 tensors=161 cache=1 step_ms=0.500
CASE gap.gs round=1 np=2 workload=resnet50 np=2 tensors=161 collectives=40 tensors_per_op=4.03 crit_ms=0.250
CASE ring.4 round=1 np=4 impl=gs-tcp-direct np=4 bytes=4 median_us=100.0 busbw_gbs=0.00
CASE lat.gs.4 round=1 np=4 workload=raw4 np=4 tensors=1 bytes=4 step_ms=0.900
CASE ctl.gs round=1 np=4 workload=resnet50 np=4 tensors=161 bytes=644 step_ms=1.000 barrier_ms=0.100
CASE ctl.mpi.cached round=1 np=4 case=mpi.negotiation np=4 tensors=161 cache=1 step_ms=0.500
CASE sim.64.c1 round=1 np=1 case=sim ranks=64 floor_ms=1.5 step_ms=4.5 step_over_floor=3.00 coord_cpu_us_per_rank_step=62.5 coord_peak_rss_kib=20000
CASE sim.64.c0 round=1 np=1 case=sim ranks=64 floor_ms=1.5 step_ms=7.0 step_over_floor=4.67 coord_cpu_us_per_rank_step=135 coord_peak_rss_kib=22000
"""
TRANSPORT = """\
RESULT round=1 impl=ompi-shm np=2 bytes=1048576 median_us=800.0 busbw_gbs=1.3
RESULT round=1 impl=gs-shm np=2 bytes=1048576 median_us=900.0 busbw_gbs=1.1
RESULT round=1 impl=ompi-shm np=2 bytes=16777216 median_us=16000.0 busbw_gbs=1.0
RESULT round=1 impl=gs-shm np=2 bytes=16777216 median_us=8000.0 busbw_gbs=2.0
RESULT round=1 impl=ompi-shm np=4 bytes=1048576 median_us=1000.0 busbw_gbs=1.3
RESULT round=1 impl=gs-shm np=4 bytes=1048576 median_us=2000.0 busbw_gbs=0.5
"""
HOSTS = """\
RESULT round=1 impl=gs np=2 bytes=1048576 us=2000.0 busbw_gbs=0.5
RESULT round=1 impl=ompi-tcp np=2 bytes=1048576 us=24000.0 busbw_gbs=0.04
RESULT round=1 impl=gs np=4 bytes=1048576 us=4000.0 busbw_gbs=0.4
RESULT round=1 impl=ompi-tcp np=4 bytes=1048576 us=3000.0 busbw_gbs=0.5
RESULT round=1 impl=gs-step np=4 bytes=102228128 us=40000.0
RESULT round=1 impl=ompi-step-tcp np=4 bytes=102228128 us=30000.0 busbw_gbs=1
"""


def table(files):
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            with open(os.path.join(d, name + ".txt"), "w") as f:
                f.write(text)
        out = subprocess.run([sys.executable, TARGETS, d, "--np", "2 4"], capture_output=True, text=True,
                             timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        if line.startswith("| 1"):
            cols = [c.strip() for c in line.strip("|").split("|")]
            rows.setdefault(cols[1], cols)
    return out.stdout, rows


def find(rows, start):
    for k, v in rows.items():
        if k.startswith(start):
            return v
    raise AssertionError("no row starting with %r in %r" % (start, list(rows)))


class Targets(unittest.TestCase):
    def test_control_rows(self):
        text, rows = table({"control": CONTROL})
        self.assertIn("### Against the targets of issues 14 and 15 (this run)", text)
        # round trip: the median of 0.100, 0.080, 0.900 ms = 0.100 ms
        lone = find(rows, "Lone 4 B allreduce")
        self.assertIn("0.3 ms / (0.1 ms + 20.0 µs) = **2.50×**", lone[2])
        self.assertIn("with the 19 µs ping-pong: **7.69×**", lone[2])  # 0.3 / 0.039
        self.assertIn("0.9 ms / (0.1 ms + 100.0 µs) = **4.50×**", lone[3])
        self.assertEqual(lone[4], "against the round trip through gradsyncd: not met at np=4 "
                         "(np=4: 1.50× the bound); against the 19 µs ping-pong: not met "
                         "(np=2: 2.56× the bound; np=4: 2.52× the bound)")
        ctl = find(rows, "ResNet-50 control-only step")
        self.assertIn("**1.20×** (≤ 1.5)", ctl[2])
        self.assertIn("**2.00×** (≤ 1.0)", ctl[3])
        self.assertEqual(ctl[4], "not met at np=4 (np=4: 2.00× the bound)")
        bar = find(rows, "`gs_barrier`")
        self.assertIn("0.36 ms / (2 × 0.1 ms) = **1.80×**", bar[2])
        self.assertIn("0.1 ms / (2 × 0.1 ms) = **0.50×**", bar[3])
        gap = find(rows, "No loss of batching")
        self.assertIn("40 collectives per step for 161 tensors (4.03 per op); crit 0.25 ms / "
                      "2 × (0.1 ms + 50.0 µs) = **0.83×**", gap[2])
        self.assertTrue(gap[3].startswith("not measured in this run"), gap[3])  # no ring.16384 at np=4
        self.assertIn("np=4 not measured in this run", gap[4])
        sim = find(rows, "Simulator, N = 64")
        self.assertEqual(sim[2], "4.5 ms / 1.5 ms = **3.00×**")
        self.assertEqual(sim[4], "not met (1.50× the bound)")
        big = find(rows, "Simulator, N = 1024")
        self.assertEqual(big[2], "not measured in this run")
        cpu = find(rows, "Coordinator CPU per rank per step")
        self.assertEqual(cpu[2], "N=64: 62 / 135")
        # issue 15's parts did not run
        self.assertEqual(find(rows, "Across hosts")[2], "not measured in this run (no `hosts` part)")
        self.assertEqual(find(rows, "Across hosts")[4], "not measured in this run")
        self.assertIn("`test_deterministic`", find(rows, "Deterministic mode")[2])
        self.assertIn("`test_shm`", find(rows, "No segment left")[2])

    def test_batching_reads_crit_last(self):
        # a run with crit_last_ms: the row's figure is crit_last_ms, crit_ms and skew_ms beside it
        line = "crit_ms=0.250"
        self.assertIn(line, CONTROL)
        _, rows = table({"control": CONTROL.replace(
            line, line + " crit_last_ms=0.060 crit_last_q1=0.050 crit_last_q3=0.070 skew_ms=0.190")})
        gap = find(rows, "No loss of batching")
        self.assertIn("40 collectives per step for 161 tensors (4.03 per op); crit 60.0 µs (each rank from "
                      "its own last submission: 0.25 ms, the ranks' last submissions 0.19 ms apart) / "
                      "2 × (0.1 ms + 50.0 µs) = **0.20×**", gap[2])
        # ranks on different hosts: the bench prints n/a, the row falls back to crit_ms as before
        _, rows = table({"control": CONTROL.replace(
            line, line + " crit_last_ms=n/a crit_last_q1=n/a crit_last_q3=n/a skew_ms=n/a")})
        gap = find(rows, "No loss of batching")
        self.assertIn("40 collectives per step for 161 tensors (4.03 per op); crit 0.25 ms / "
                      "2 × (0.1 ms + 50.0 µs) = **0.83×**", gap[2])

    def test_batching_shows_the_fast_path_off_baseline(self):
        # a run with the same case under gradsyncd --fast-path off: its collectives per step beside
        extra = "\nCASE gap.gs.off round=1 np=2 workload=resnet50 np=2 tensors=161 collectives=38 " \
            "tensors_per_op=4.24 crit_ms=0.900\n"
        _, rows = table({"control": CONTROL + extra})
        gap = find(rows, "No loss of batching")
        self.assertIn("40 collectives per step for 161 tensors (4.03 per op, fast path off: 38); crit 0.25 ms / "
                      "2 × (0.1 ms + 50.0 µs) = **0.83×**", gap[2])

    def test_dataplane_rows(self):
        _, rows = table({"transport": TRANSPORT, "hosts": HOSTS})
        e2e = find(rows, "End to end (through the coordinator): bus bandwidth")
        self.assertEqual(e2e[2], "16 MiB 2.00×")
        self.assertEqual(e2e[3], "not measured in this run")
        self.assertEqual(e2e[4], "met; np=4 not measured in this run")
        t1 = find(rows, "End to end: time ≤ 1.25 × OpenMPI shm's at 1 MiB — `transport` part")
        self.assertEqual(t1[2], "1 MiB: 900.0 µs / 800.0 µs = **1.12×**")
        self.assertEqual(t1[4], "not met at np=4 (np=4: 1.60× the bound)")
        hosts = find(rows, "Across hosts")
        self.assertEqual(hosts[2], "1 MiB 12.00×")
        self.assertEqual(hosts[3], "1 MiB 0.75×")
        self.assertEqual(hosts[4], "not met at np=4 (np=4: 0.75× at 1 MiB)")
        step = find(rows, "… a ResNet-50 step across hosts")
        self.assertEqual(step[2], "not measured in this run")
        self.assertEqual(step[3], "30.00 ms / 40.00 ms = **0.75×**")
        self.assertEqual(step[4], "not met (np=4: 0.75×); np=2 not measured in this run")
        self.assertTrue(find(rows, "Lone 4 B")[2].startswith("not measured in this run (no `control` part)"))
        self.assertTrue(find(rows, "… the same — `dataplane` part (gradsync-dataplane e2e")[2].startswith(
            "not measured in this run (no `dataplane` part)"))

    def test_dataplane_reads_the_transport_sweep(self):
        # the full run: the data-plane part has no OpenMPI sweep of its own
        dp = ("CASE gs.e2e round=1 impl=gradsync mode=e2e np=2 op=sum det=0 bytes=67108864 us=40000.0 cpu_us=1\n"
              "CASE gs.avg round=1 impl=gradsync mode=e2e np=2 op=average det=0 bytes=67108864 us=40800.0 cpu_us=1\n"
              "CASE step.resnet50 round=1 workload=resnet50 np=2 tensors=161 bytes=102228128 step_ms=60.0\n"
              "CASE mpi.step.resnet50 round=1 impl=x np=2 bytes=102228128 us=50000.0 busbw_gbs=1\n")
        _, rows = table({"dataplane": dp, "transport": TRANSPORT})
        self.assertTrue(find(rows, "… the same — `dataplane` part (gradsync-dataplane e2e")[2].startswith(
            "measured once, in the `transport` part"))
        avg = find(rows, "GS_AVERAGE ≤ 1.03 × GS_SUM at 64 MiB: time end to end")
        self.assertEqual(avg[2], "40.80 ms / 40.00 ms = **1.02×**")
        self.assertEqual(avg[4], "met; np=4 not measured in this run")
        st = find(rows, "… the ResNet-50 step, the same — `dataplane` part")
        self.assertEqual(st[2], "60 ms / 50 ms = **1.20×**")
        self.assertEqual(st[4], "not met (np=2: 1.20× the bound); np=4 not measured in this run")

    def test_control_rows_from_pairs(self):
        # bench/control.sh's pairs: the row is the median of the per-pair
        # ratios (1.2, 2.0, 1.4 -> 1.4), not the ratio of the medians (1.2)
        paired = "".join(
            "CASE ctl.gs round=1 np=2 pair=%d workload=resnet50 np=2 tensors=161 step_ms=%s barrier_ms=0.01\n"
            "CASE ctl.mpi.cached round=1 np=2 pair=%d case=mpi.negotiation np=2 tensors=161 step_ms=%s\n"
            % (k, g, k, m) for k, g, m in ((1, "0.024", "0.020"), (2, "0.040", "0.020"), (3, "0.021", "0.015")))
        # a pair with one side missing (a failed run) counts for nothing
        paired += "CASE ctl.gs round=1 np=2 pair=4 workload=resnet50 np=2 tensors=161 step_ms=0.500\n"
        ctl = "".join(l + "\n" for l in CONTROL.splitlines() if not l.startswith(("CASE ctl.gs ", "CASE ctl.mpi")))
        _, rows = table({"control": ctl + paired})
        row = find(rows, "ResNet-50 control-only step")
        self.assertEqual(row[2], "24.0 µs / 20.0 µs (medians of 3 pairs) = **1.40×**, the median of the per-pair "
                         "ratios (1.20–2.00; ≤ 1.5: 2 of 3 pairs)")
        self.assertEqual(row[3], "not measured in this run")
        self.assertEqual(row[4], "met; np=4 not measured in this run")

    def test_average_cpu_row_from_pairs(self):
        # run.sh --dataplane's pairs (ratios 1.033, 0.967, 1.017 -> 1.017), the
        # AVERAGE side's 16 MiB line ignored; then a run older than the pairs
        dp = "".join(
            "CASE gs.direct.sum round=1 pair=%d impl=gradsync mode=direct np=2 op=sum det=0 bytes=67108864 us=1 "
            "cpu_us=30000.0\n"
            "CASE gs.direct.avg round=1 pair=%d impl=gradsync mode=direct np=2 op=average det=0 bytes=67108864 us=1 "
            "cpu_us=%s\n" % (k, k, a) for k, a in ((1, "31000.0"), (2, "29000.0"), (3, "30500.0")))
        dp += ("CASE gs.direct.avg round=1 pair=3 impl=gradsync mode=direct np=2 op=average det=0 bytes=16777216 "
               "us=1 cpu_us=90000.0\n")
        _, rows = table({"dataplane": dp})
        cpu = find(rows, "… the same: CPU time per call, data plane alone")
        self.assertEqual(cpu[2], "30.50 ms / 30.00 ms (medians of 3 pairs) = **1.02×**, the median of the per-pair "
                         "ratios (0.97–1.03; ≤ 1.03: 2 of 3 pairs)")
        self.assertEqual(cpu[4], "met; np=4 not measured in this run")
        old = ("CASE gs.direct round=1 impl=gradsync mode=direct np=2 op=sum det=0 bytes=67108864 us=1 cpu_us=30000.0\n"
               "CASE gs.direct.avg round=1 impl=gradsync mode=direct np=2 op=average det=0 bytes=67108864 us=1 "
               "cpu_us=31000.0\n")
        _, rows = table({"dataplane": old})
        cpu = find(rows, "… the same: CPU time per call, data plane alone")
        self.assertEqual(cpu[2], "31.00 ms / 30.00 ms = **1.03×**")
        self.assertEqual(cpu[4], "not met (np=2: 1.00× the bound); np=4 not measured in this run")

    def test_average_time_row_from_pairs(self):
        # run.sh --dataplane's end-to-end pairs, both sides --sizes "16777216
        # 67108864": at 64 MiB ratios 1.02, 0.98, 1.06 -> 1.02 (met), where the
        # ratio of the medians, 44.52 / 42.00 ms, would be 1.06 (not met)
        line = ("CASE gs.e2e.%s round=1 pair=%d impl=gradsync mode=e2e np=2 op=%s det=0 bytes=%d us=%s "
                "busbw_gbs=1 cpu_us=1\n")
        dp = "".join(line % ("sum", k, "sum", 16777216, "10000.0") + line % ("sum", k, "sum", 67108864, s) +
                     line % ("avg", k, "average", 16777216, "90000.0") + line % ("avg", k, "average", 67108864, a)
                     for k, s, a in ((1, "40000.0", "40800.0"), (2, "50000.0", "49000.0"),
                                     (3, "42000.0", "44520.0")))
        # a pair whose AVERAGE run failed counts for nothing; the unpaired SUM
        # run (the deterministic rows' reference) is not a side of this row
        dp += line % ("sum", 4, "sum", 67108864, "10000.0")
        dp += ("CASE gs.e2e round=1 impl=gradsync mode=e2e np=2 op=sum det=0 bytes=67108864 us=20000.0 "
               "cpu_us=1\n")
        _, rows = table({"dataplane": dp})
        avg = find(rows, "GS_AVERAGE ≤ 1.03 × GS_SUM at 64 MiB: time end to end")
        self.assertEqual(avg[2], "44.52 ms / 42.00 ms (medians of 3 pairs) = **1.02×**, the median of the per-pair "
                         "ratios (0.98–1.06; ≤ 1.03: 2 of 3 pairs)")
        self.assertEqual(avg[3], "not measured in this run")
        self.assertEqual(avg[4], "met; np=4 not measured in this run")
        # run.sh's own row (bench/lib.sh pair_stat) gives the same figures
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(dp)
            f.flush()
            out = subprocess.run(["bash", "-c", '. "$1"; out=$2; pair_stat gs.e2e.avg gs.e2e.sum us 2 1.03 '
                                  'bytes=67108864', "bash", os.path.join(HERE, "..", "..", "bench", "lib.sh"),
                                  f.name], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["3", "1.02", "2", "44520", "42000", "0.98", "1.06"])


if __name__ == "__main__":
    unittest.main()
