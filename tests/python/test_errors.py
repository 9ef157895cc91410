"""Failures surface as exceptions, never hangs: a desynced rank (rank 0
waits on one tensor, the others on another) gets every rank an exception
naming both tensors within seconds while the ranks wait in Python
(synchronize); under DDP the same desync raises from backward(); a forked
child's collectives raise at the call."""

import re

from conftest import expect_ok, run_ranks


def test_desync_raises_on_every_rank_naming_the_tensors():
    job = run_ranks(3, "desync", timeout=120)
    expect_ok(job, 3, "desync: ok")
    for r in range(3):
        line = [l for l in job.lines(r) if l.startswith("desync: rank %d raised" % r)]
        assert line, job.out
        assert "allreduce.grads.A" in line[0] and "allreduce.grads.B" in line[0], line[0]
        secs = float(re.search(r"after (\S+) s", line[0]).group(1))
        print("rank %d: exception after %.1f s" % (r, secs))


def test_ddp_desync_raises_from_backward():
    job = run_ranks(2, "ddp_deadlock", timeout=120)
    expect_ok(job, 2, "ddp_deadlock: ok")
    line = [l for l in job.lines(0) if "ddp: rank 0 step 2 raised" in l]
    assert line and "HorovodInternalError" in line[0] and "deadlock" in line[0], job.out


def test_no_false_deadlock_while_computing_past_pending_ops():
    """Ops submitted and not waited on (the completer thread collects them)
    do not make a computing rank look blocked: with a 1 s deadlock time and
    3 s of compute between two submissions in opposite orders, no deadlock
    is reported and the sums are right."""
    job = run_ranks(2, "compute_past_pending", timeout=120,
                    env={"GRADSYNC_DEADLOCK_TIME_MS": "1000"})
    expect_ok(job, 2, "compute_past_pending: ok")
    assert "deadlock: " not in job.out.lower(), job.out


def test_fork_child_raises_at_the_call_and_the_parent_goes_on():
    """os.fork() after hvd.init() on rank 0 with an op in flight: the
    child's collectives raise HorovodInternalError with the library's fork
    text at the call (no hang), and the parent's job finishes with the
    right values."""
    job = run_ranks(2, "fork", timeout=180)
    expect_ok(job, 2, "fork: ok")
    lines = job.lines(0)
    for what, head in (("allreduce", "allreduce() (tensor 'allreduce.fork.child'): rank 0"),
                       ("synchronize", "synchronize() (tensor 'allreduce.fork.inflight'): rank 0"),
                       ("barrier", "barrier(): rank 0")):
        line = [l for l in lines
                if l.startswith("fork-child: %s raised HorovodInternalError: %s" % (what, head))]
        assert line, job.out
        assert "this gradsync context was made by process " in line[0], line[0]
        assert "(a forked child) cannot use it" in line[0], line[0]
    assert "fork-child: synchronize on the finished op ok; shutdown() returned" in lines, job.out
    # init() again in that child is refused at once (gRPC cannot start in a
    # child forked while the parent's context is live); ranks.py checks the
    # whole text, pids included
    assert any(l.startswith("fork-child: init() raised HorovodInternalError: init() (rank 0): "
                            "process ") and "call init() in a process started with exec" in l
               for l in lines), job.out
    assert "FAIL" not in job.out, job.out


def test_a_rank_that_left_is_named_with_the_python_call():
    """Rank 1 calls shutdown() first: rank 0's next allreduce raises naming
    rank 1, its host and pid, and shutdown() (not the C gs_shutdown)."""
    job = run_ranks(2, "left", timeout=120)
    expect_ok(job, 2, "left: ok")
