"""Shared helpers of the Python tests: the repository and build paths, and
running a scenario of ranks.py on N ranks under the real gradsync-run (a
real gradsyncd on 127.0.0.1 and N real Python processes)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("GRADSYNC_BUILD_DIR", os.path.join(REPO, "build"))
RUN = os.path.join(BUILD, "bin", "gradsync-run")
LIB = os.path.join(BUILD, "lib", "libgradsync.so")


def env_for_ranks(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python")
    env["GRADSYNC_LIB"] = LIB
    env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


class Job:
    def __init__(self, rc, out):
        self.rc = rc
        self.out = out

    def lines(self, rank):
        p = "[%d] " % rank
        return [l[len(p):] for l in self.out.splitlines() if l.startswith(p)]


def run_ranks(np_, mode, *args, timeout=240, env=None, script=None):
    """Runs `python3 ranks.py mode args...` on np_ ranks; returns Job. The
    timeout is a hang guard only."""
    script = script or os.path.join(HERE, "ranks.py")
    cmd = [RUN, "-np", str(np_), sys.executable, script] + [str(a) for a in (mode,) + args]
    try:
        p = subprocess.run(cmd, env=env_for_ranks(env), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout, text=True)
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode()
        pytest.fail("hang: %s did not finish within %d s; output:\n%s" % (cmd, timeout, out))
    return Job(p.returncode, p.stdout)


def expect_ok(job, np_, marker):
    """Every rank printed `marker` and the job exited 0."""
    if job.rc != 0:
        pytest.fail("job failed (exit %d):\n%s" % (job.rc, job.out))
    for r in range(np_):
        if not any(marker in l for l in job.lines(r)):
            pytest.fail("rank %d did not print %r:\n%s" % (r, marker, job.out))
