"""Every collective x dtype against torch references, on 2 and 3 ranks
(odd sizes expose the scaling of averages), plus poll(), duplicate names,
bad alltoall splits, compression, autograd, objects and sparse allreduce."""

import pytest

from conftest import expect_ok, run_ranks


@pytest.mark.parametrize("np_", [3])
def test_collectives(np_):
    job = run_ranks(np_, "collectives")
    expect_ok(job, np_, "collectives: ok (234 checks)")


def test_persistent_allreduce_np2():
    job = run_ranks(2, "persistent")
    expect_ok(job, 2, "persistent: ok (57 checks)")


def test_mismatch_raises_runtime_error_on_every_rank():
    job = run_ranks(2, "mismatch")
    expect_ok(job, 2, "mismatch: ok")
    for r in range(2):
        assert any("tensor 'allreduce.shape': mismatched shapes: ranks [0] sent [3], "
                   "ranks [1] sent [4]" in l for l in job.lines(r)), job.out


def test_process_sets_np2():
    """The values of the global set and of an unregistered ProcessSet([1])
    after init() on 2 ranks (ranks.py mode_process_sets)."""
    job = run_ranks(2, "process_sets", timeout=120)
    expect_ok(job, 2, "process_sets: ok (7 checks)")
