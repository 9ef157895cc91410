"""examples/pytorch_synthetic.py is a Horovod script with only its import
changed, and it trains on 2 ranks: the loss falls and the ranks end with
identical parameters."""

import os
import re

from conftest import REPO, expect_ok, run_ranks

EXAMPLE = os.path.join(REPO, "examples", "pytorch_synthetic.py")


def test_only_the_import_differs_from_horovod():
    src = open(EXAMPLE).read()
    code = "\n".join(l for l in src.split('"""', 2)[2].splitlines())
    assert code.count("import gradsync.torch as hvd") == 1
    assert "gradsync" not in code.replace("import gradsync.torch as hvd", "")


def test_example_trains_on_two_ranks():
    job = run_ranks(2, "--epochs", "4", script=EXAMPLE)
    expect_ok(job, 1, "done: parameters identical on all 2 ranks")
    losses = [float(m.group(1)) for l in job.lines(0)
              for m in [re.match(r"epoch \d+: loss (\S+)", l)] if m]
    assert len(losses) == 4, job.out
    assert losses[-1] < losses[0], losses
