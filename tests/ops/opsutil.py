"""Shared by the operator-view test scripts (test_ops.py,
test_node_client.py): pass/fail lines and the processes a test started."""
import os
import subprocess
import sys

procs = []
failures = []


def check(cond, what):
    """Prints 'ok   WHAT' or 'FAIL WHAT'; a failure is remembered."""
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def start(args, env=None, **kw):
    """Popen, remembered for cleanup()."""
    p = subprocess.Popen(args, env=env, **kw)
    procs.append(p)
    return p


def cleanup():
    """Kills and reaps every process start() started that still runs."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def finish(log):
    """Exits 1 naming the failures and showing the end of gradsyncd's log,
    else removes the log and exits 0."""
    if failures:
        print("%d FAILED; gradsyncd log: %s" % (len(failures), log))
        print(open(log).read()[-4000:])
        sys.exit(1)
    os.unlink(log)
    print("all passed")
    sys.exit(0)
