"""Training with DistributedOptimizer and with DDP + allreduce_hook matches
one process training on the concatenated batches (max |delta| <= 1e-6 in
float64): plain MLP, backward_passes_per_step=2, Embedding(sparse=True)
gathered and densified, local parameters, parameters without a gradient on
some ranks; broadcast_parameters and broadcast_optimizer_state."""

import re

import pytest

from conftest import expect_ok, run_ranks

MODES = ["mlp DistributedOptimizer backward_passes_per_step=1",
         "mlp DistributedOptimizer backward_passes_per_step=2",
         "Embedding(sparse=True) gathered",
         "Embedding(sparse=True) sparse_as_dense",
         "local parameters (tower per rank, trunk averaged)",
         "parameters without a gradient on odd ranks",
         "mlp DDP allreduce_hook"]


@pytest.mark.parametrize("np_", [2, 4])
def test_training_matches_one_process(np_):
    job = run_ranks(np_, "train", timeout=400)
    expect_ok(job, np_, "train: ok")
    for r in range(np_):
        lines = job.lines(r)
        for m in MODES:
            got = [l for l in lines if l.startswith(m + ": max|delta| = ")]
            assert got, "rank %d: no result for %r:\n%s" % (r, m, job.out)
            d = float(re.search(r"= (\S+)$", got[0]).group(1))
            assert d <= 1e-6, got[0]
        assert any("broadcast_parameters / broadcast_optimizer_state: equal to rank 0's" in l
                   for l in lines)
        assert any("optimizer API: synchronize/skip_synchronize/warning/zero_grad ok" in l
                   for l in lines)
