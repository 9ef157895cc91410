"""The package itself: import with PYTHONPATH=<repo>/python, gradsync.version
== gs_version() == the header's GS_VERSION_STRING, the ImportError that
names every place tried, `pip install ./python` (pure Python, loads the
library from the install prefix), and the ctypes struct mirrors against the
C header (sizes and offsets from a probe compiled against gradsync.h)."""

import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import LIB, REPO

HEADER = os.path.join(REPO, "worker", "include", "gradsync.h")


def py(code, env=None, cwd=None):
    e = {k: v for k, v in os.environ.items() if k not in ("GRADSYNC_LIB", "PYTHONPATH")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=e, cwd=cwd or "/",
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)


def header_version():
    m = re.search(r'#define GS_VERSION_STRING "([^"]+)"', open(HEADER).read())
    return m.group(1)


def test_version_matches_gs_version():
    p = py("import gradsync; print(gradsync.version); print(gradsync.library_path)",
           {"PYTHONPATH": os.path.join(REPO, "python")})
    assert p.returncode == 0, p.stdout
    version, path = p.stdout.split()
    lib = ctypes.CDLL(LIB)
    lib.gs_version.restype = ctypes.c_char_p
    assert version == lib.gs_version().decode() == header_version()
    assert os.path.realpath(path) == os.path.realpath(LIB)


def test_import_error_names_the_places_tried(tmp_path):
    p = py("import gradsync", {"PYTHONPATH": os.path.join(REPO, "python"),
                               "GRADSYNC_LIB": str(tmp_path / "nope.so")})
    assert p.returncode != 0
    assert "ImportError: gradsync: could not load libgradsync.so; tried:" in p.stdout
    assert "GRADSYNC_LIB: %s (no such file)" % (tmp_path / "nope.so") in p.stdout


def pip_install(target):
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                        "--no-deps", "--no-index", "--target", str(target),
                        os.path.join(REPO, "python")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout
    # pure Python: nothing compiled
    for root, _, files in os.walk(target):
        assert not [f for f in files if f.endswith((".so", ".pyd"))], (root, files)


def test_pip_install_loads_from_the_install_prefix(tmp_path):
    # <prefix>/lib/libgradsync.so.0 beside <prefix>/lib/python3/dist-packages
    prefix = tmp_path / "prefix"
    site = prefix / "lib" / "python3" / "dist-packages"
    pip_install(site)
    shutil.copy(LIB, prefix / "lib" / "libgradsync.so.0")
    p = py("import gradsync; print(gradsync.version, gradsync.library_path)",
           {"PYTHONPATH": str(site)})
    assert p.returncode == 0, p.stdout
    assert p.stdout.split() == [header_version(), str(prefix / "lib" / "libgradsync.so.0")]
    # without the library there, the error lists the prefix and the hint
    os.remove(prefix / "lib" / "libgradsync.so.0")
    p = py("import gradsync", {"PYTHONPATH": str(site)})
    if p.returncode == 0:
        pytest.skip("a libgradsync is installed system-wide; the not-found path is not testable")
    assert "install prefix: %s" % (prefix / "lib" / "libgradsync.so.0") in p.stdout, p.stdout
    assert "set GRADSYNC_LIB=" in p.stdout


def test_struct_mirrors_match_the_header(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "python"))
    os.environ["GRADSYNC_LIB"] = LIB
    from gradsync import _lib
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "gradsync.h"',
             'int main(void) {']
    for name, st in _lib.STRUCTS.items():
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (name, name))
        for fname, _ in st._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));'
                         % (name, fname, name, fname))
    lines.append("return 0; }")
    src = tmp_path / "probe.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "probe"
    c = subprocess.run([cc, "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert c.returncode == 0, "a field of the ctypes mirror is not in gradsync.h:\n" + c.stdout
    want = dict(l.split() for l in subprocess.check_output([str(exe)], text=True).splitlines())
    for name, st in _lib.STRUCTS.items():
        assert ctypes.sizeof(st) == int(want[name]), \
            "%s: ctypes mirror is %d bytes, gradsync.h says %s" % (name, ctypes.sizeof(st),
                                                                  want[name])
        for fname, _ in st._fields_:
            assert getattr(st, fname).offset == int(want[name + "." + fname]), (name, fname)
    # and every field of the C struct is mirrored: same size and offsets of
    # every mirrored field leave no room for a missing one in the middle;
    # a field added at the end changes sizeof.


def test_nccl_built_tells_the_truth():
    """nccl_built() is NCCL's version code when libgradsync links NCCL (what
    the dynamic linker resolves for it, not what the package believes), else
    0; cuda_built/gloo_built/mpi_built follow Horovod's conventions."""
    ldd = subprocess.run(["ldd", LIB], stdout=subprocess.PIPE, text=True, timeout=60).stdout
    m = re.search(r"libnccl\.so\S* => (\S+)", ldd)
    p = py("import gradsync.torch as hvd; print(hvd.nccl_built(), hvd.cuda_built(), "
           "hvd.gloo_built(), hvd.mpi_built())",
           {"PYTHONPATH": os.path.join(REPO, "python"), "GRADSYNC_LIB": LIB})  # the library ldd read
    assert p.returncode == 0, p.stdout
    nccl, cuda, gloo, mpi = p.stdout.split()[-4:]
    assert (gloo, mpi) == ("False", "False")
    if m is None:
        assert (nccl, cuda) == ("0", "False"), ldd
        return
    nccl_lib = ctypes.CDLL(m.group(1))
    v = ctypes.c_int(0)
    assert nccl_lib.ncclGetVersion(ctypes.byref(v)) == 0
    assert v.value > 0 and int(nccl) == v.value and cuda == "True", (nccl, v.value, ldd)


def _lib_module():
    """gradsync._lib imported with the build's library (no job needed)."""
    sys.path.insert(0, os.path.join(REPO, "python"))
    os.environ["GRADSYNC_LIB"] = LIB
    from gradsync import _lib
    return _lib


def test_every_rewritten_c_phrase_is_still_in_the_library():
    """The Python texts replace C phrases of libgradsync: each must still be
    in the library, or a reworded C text would reach Python users with its
    C names."""
    _lib = _lib_module()
    data = open(LIB, "rb").read()
    missing = [c for c, _ in _lib.PY_PHRASES if c.encode() not in data]
    assert not missing, missing
    for fmt in (b"gs_init: %s", b"gs_init (rank %d): %s", b"gs_%s: tensor name '%.40s...'"):
        assert fmt in data, fmt
    coord = open(os.path.join(os.path.dirname(os.path.dirname(LIB)), "bin", "gradsyncd"),
                 "rb").read()
    missing = [c for c, _ in _lib.PY_COORD_PHRASES if c.encode() not in coord]
    assert not missing, missing


def test_python_texts():
    """Library texts as a Python user reads them: Python calls, not C ones;
    a text without C names is unchanged."""
    t = _lib_module().py_text
    assert t("tensor 'allreduce.w': rank 0 (host vm) started this persistent op while it is "
             "still active; wait for it (gs_wait, gs_test) before starting it again") == (
        "tensor 'allreduce.w': rank 0 (host vm) started this persistent op while it is "
        "still active; wait for it (wait(), test()) before starting it again")
    assert t("tensor 'allreduce.b': gs_startall lists this persistent op twice (rank 0, host vm);"
             " list each op once") == (
        "tensor 'allreduce.b': startall() lists this persistent op twice (rank 0, host vm); "
        "list each op once")
    assert t("tensor 'allreduce.w': rank 1 (host vm) registered this name local "
             "(gs_register_local) after gs_allreduce_init; a persistent op cannot be local: free "
             "it and use gs_allreduce_async") == (
        "tensor 'allreduce.w': rank 1 (host vm) registered this name local "
        "(register_local_parameter()) after allreduce_init(); a persistent op cannot be local: "
        "free() it and use allreduce_async()")
    assert t("tensor 'allreduce.w': rank 1 (host vm) registered this name local "
             "(gs_register_local); a persistent op cannot be local: use gs_allreduce_async for "
             "it") == (
        "tensor 'allreduce.w': rank 1 (host vm) registered this name local "
        "(register_local_parameter()); a persistent op cannot be local: use allreduce_async() "
        "for it")
    assert t("tensor 'allreduce.d': rank 2 already has an op of this name in flight; wait for it "
             "to complete (gs_wait) before submitting the name again, or use another name") == (
        "tensor 'allreduce.d': rank 2 already has an op of this name in flight; wait for it to "
        "complete (synchronize() its handle, or wait() of a persistent op) before submitting "
        "the name again, or use another name")
    assert t("tensor 'allreduce.d': gs_shutdown has been called") == (
        "tensor 'allreduce.d': shutdown() has been called")
    assert t("gs_shutdown was called while this op was in flight; wait for ops before shutting "
             "down") == ("shutdown() was called while this op was in flight; wait for ops before "
                         "shutting down")
    assert t("gs_init: this process's rank is unknown: set GRADSYNC_RANK and GRADSYNC_SIZE (or "
             "gs_options), or start it under a launcher") == (
        "init(): this process's rank is unknown: set GRADSYNC_RANK and GRADSYNC_SIZE, or start "
        "it under a launcher")
    assert t("gs_init (rank 3): timed out after 100 ms") == (
        "init() (rank 3): timed out after 100 ms")
    assert t("gs_allreduce: tensor name 'allreduce.xx...' is 510 bytes; the limit is 255") == (
        "allreduce(): tensor name 'allreduce.xx...' is 510 bytes; the limit is 255")
    assert t("tensor 'allreduce.x': rank 1 (vm, pid 7) has already left the job (gs_shutdown), "
             "so this collective can never complete") == (
        "tensor 'allreduce.x': rank 1 (vm, pid 7) has already left the job (shutdown()), so "
        "this collective can never complete")
    plain = "tensor 'a': mismatched shapes: ranks [0] sent [3], ranks [1] sent [4] (gs_wait)"
    assert t(plain) == plain


DOCSTRING_PROBE = r'''
import inspect
import gradsync
import gradsync.torch as hvd
from gradsync.torch.optimizer import _DistributedOptimizer


def own_doc(o):
    d = vars(o).get("__doc__") if inspect.isclass(o) else getattr(o, "__doc__", None)
    return (d or "").strip()


missing, classes = [], []
for mod in (gradsync, hvd):
    for n in mod.__all__:
        o = getattr(mod, n)
        if not callable(o):
            continue
        if not own_doc(o):
            missing.append("%s.%s" % (mod.__name__, n))
        if inspect.isclass(o) and o.__module__.startswith("gradsync"):
            classes.append(("%s.%s" % (mod.__name__, n), o))
# what DistributedOptimizer() returns: its methods are the optimizer's API
classes.append(("DistributedOptimizer(...)", _DistributedOptimizer))
seen = set()
while classes:
    cname, c = classes.pop()
    if c in seen:
        continue
    seen.add(c)
    for m, v in vars(c).items():
        if m.startswith("_"):
            continue
        if inspect.isclass(v):  # Compression.none, .fp16, ...
            if not own_doc(v):
                missing.append("%s.%s" % (cname, m))
            classes.append(("%s.%s" % (cname, m), v))
            continue
        f = getattr(c, m)  # unwraps staticmethod / classmethod
        if isinstance(v, property):
            f = v
        if (callable(f) or isinstance(v, property)) and not own_doc(f):
            missing.append("%s.%s" % (cname, m))
print("MISSING", " ".join(missing))
'''


def test_every_public_callable_has_a_docstring():
    """help(hvd.broadcast) and the like must say something: every public
    callable of gradsync and gradsync.torch (the names in __all__), and the
    public methods of their classes and of the DistributedOptimizer object,
    has a non-empty docstring of its own (not one inherited from torch)."""
    p = py(DOCSTRING_PROBE, {"PYTHONPATH": os.path.join(REPO, "python"), "GRADSYNC_LIB": LIB})
    assert p.returncode == 0, p.stdout
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("MISSING")][-1]
    assert line.split()[1:] == [], "no docstring: " + line


def test_an_unknown_reduce_op_is_a_value_error():
    """op=42 is refused with the same ValueError by every allreduce, the
    grouped ones included (they raised KeyError), before any job is needed."""
    code = (
        "import torch, gradsync.torch as hvd\n"
        "for f in (hvd.allreduce_async, hvd.grouped_allreduce_async,"
        " hvd.grouped_allreduce_async_):\n"
        "    arg = torch.zeros(2) if f is hvd.allreduce_async else [torch.zeros(2)]\n"
        "    try:\n"
        "        f(arg, op=42)\n"
        "    except Exception as e:\n"
        "        print(f.__name__, type(e).__name__, e)\n")
    p = py(code, {"PYTHONPATH": os.path.join(REPO, "python"), "GRADSYNC_LIB": LIB})
    assert p.returncode == 0, p.stdout
    want = "ValueError op 42 is not one of Average, Sum, Min, Max, Product, Adasum"
    assert p.stdout.splitlines() == [
        "allreduce_async " + want, "grouped_allreduce_async " + want,
        "grouped_allreduce_async_ " + want], p.stdout


PROCESS_SET_PROBE = r'''
import torch, gradsync.torch as hvd
t, ts = torch.zeros(4, 2), [torch.zeros(4, 2), torch.zeros(2)]
sp = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1, 2), (4, 2))
calls = {
    "allreduce_async": lambda ps: hvd.allreduce_async(t, process_set=ps),
    "allreduce": lambda ps: hvd.allreduce(t, process_set=ps),
    "allreduce_": lambda ps: hvd.allreduce_(t, process_set=ps),
    "grouped_allreduce_async": lambda ps: hvd.grouped_allreduce_async(ts, process_set=ps),
    "grouped_allreduce": lambda ps: hvd.grouped_allreduce(ts, process_set=ps),
    "grouped_allreduce_": lambda ps: hvd.grouped_allreduce_(ts, process_set=ps),
    "allgather_async": lambda ps: hvd.allgather_async(t, process_set=ps),
    "allgather": lambda ps: hvd.allgather(t, process_set=ps),
    "grouped_allgather_async": lambda ps: hvd.grouped_allgather_async(ts, process_set=ps),
    "grouped_allgather": lambda ps: hvd.grouped_allgather(ts, process_set=ps),
    "broadcast_async": lambda ps: hvd.broadcast_async(t, 0, process_set=ps),
    "broadcast": lambda ps: hvd.broadcast(t, 0, process_set=ps),
    "broadcast_": lambda ps: hvd.broadcast_(t, 0, process_set=ps),
    "alltoall_async": lambda ps: hvd.alltoall_async(t, process_set=ps),
    "alltoall": lambda ps: hvd.alltoall(t, process_set=ps),
    "reducescatter_async": lambda ps: hvd.reducescatter_async(t, process_set=ps),
    "reducescatter": lambda ps: hvd.reducescatter(t, process_set=ps),
    "grouped_reducescatter_async": lambda ps: hvd.grouped_reducescatter_async(
        ts, process_set=ps),
    "grouped_reducescatter": lambda ps: hvd.grouped_reducescatter(ts, process_set=ps),
    "sparse_allreduce_async": lambda ps: hvd.sparse_allreduce_async(sp, "s", hvd.Average,
                                                                    process_set=ps),
    "barrier": lambda ps: hvd.barrier(process_set=ps),
    "broadcast_object": lambda ps: hvd.broadcast_object(1, process_set=ps),
    "allgather_object": lambda ps: hvd.allgather_object(1, process_set=ps),
    "DistributedOptimizer": lambda ps: hvd.DistributedOptimizer(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1), process_set=ps),
}
class Registered:  # what another library's registered set looks like
    process_set_id = 3
for ps in (hvd.ProcessSet([0]), hvd.ProcessSet([0, 1]), Registered(), [0, 1]):
    for name, call in calls.items():
        try:
            call(ps)
            print(name, "ACCEPTED")
        except Exception as e:
            print(name, type(e).__name__, e)
print("repr", repr(hvd.ProcessSet([0])), repr(hvd.global_process_set))
'''


def test_a_process_set_other_than_the_global_one_is_refused_at_the_call():
    """Every collective, the grouped ones included, and DistributedOptimizer
    refuse a process set other than the global one with NotImplementedError
    when called, before any job is needed (the check comes first): a set
    made from a list of ranks (Horovod's unregistered set, which ran on every
    rank before) as well as one with another process_set_id; something that
    is not a process set at all (a list of ranks, which ran on every rank
    before) with TypeError."""
    p = py(PROCESS_SET_PROBE, {"PYTHONPATH": os.path.join(REPO, "python"), "GRADSYNC_LIB": LIB})
    assert p.returncode == 0, p.stdout
    want = ("NotImplementedError gradsync does not support process sets other than the global "
            "one yet; pass no process_set (the default, global_process_set)")
    want_list = ("TypeError process_set must be a gradsync.torch.ProcessSet, not list [0, 1]; "
                 "pass no process_set (the default, global_process_set)")
    lines = p.stdout.splitlines()
    names = [ln.split()[0] for ln in lines[:-1]]
    assert len(lines) == 4 * 24 + 1 and len(set(names)) == 24, p.stdout
    for ln in lines[:3 * 24]:
        assert ln.split(" ", 1)[1] == want, ln
    for ln in lines[3 * 24:-1]:
        assert ln.split(" ", 1)[1] == want_list, ln
    # before init() the global set's ranks are [], as in Horovod
    assert lines[-1] == ("repr ProcessSet(process_set_id=None, ranks=[0]) "
                         "ProcessSet(process_set_id=0, ranks=[])"), lines[-1]


PROCESS_SET_SEMANTICS = r'''
import gradsync.torch as hvd
def show(what, f):
    try:
        print(what, "=", repr(f()))
    except Exception as e:
        print(what, "!", type(e).__name__, e)
ps = hvd.ProcessSet([2, 0])
show("ranks", lambda: ps.ranks)
show("id", lambda: ps.process_set_id)
show("size", ps.size)
show("rank", ps.rank)
show("included", ps.included)
show("global.size", hvd.global_process_set.size)
show("eq same ranks", lambda: ps == hvd.ProcessSet([0, 2]))
show("eq itself", lambda: ps == ps)
show("eq global", lambda: hvd.ProcessSet([0, 2]) == hvd.global_process_set)
show("add list", lambda: hvd.add_process_set([1, 0]))
show("add set", lambda: hvd.add_process_set(ps))
show("id after add", lambda: ps.process_set_id)
show("add bad", lambda: hvd.add_process_set(["a"]))
show("remove set", lambda: hvd.remove_process_set(ps))
show("remove global", lambda: hvd.remove_process_set(hvd.global_process_set))
show("new int", lambda: hvd.ProcessSet(3))
show("new str", lambda: hvd.ProcessSet(["0"]))
show("init sets", lambda: hvd.init(process_sets=[ps]))
show("init dynamic", lambda: hvd.init(process_sets="dynamic"))
show("initialized", hvd.is_initialized)
forged = hvd.ProcessSet([0])
forged.process_set_id = 7
show("forged size", forged.size)
'''


def test_process_set_semantics_before_init():
    """A ProcessSet(ranks) behaves as Horovod's unregistered set: ranks
    sorted, process_set_id/size()/rank() None, included() needs init()
    (ValueError, as every rank query), == is identity (Horovod defines no
    __eq__); add_process_set raises NotImplementedError naming the ranks
    and what to do (ValueError first for a list that is not of ranks) and
    leaves the set unregistered; remove_process_set returns False, as
    Horovod's does for an unregistered set and for the global one;
    init(process_sets=...) with any set but the global one is refused
    before joining. The values after init() are test_collectives'
    test_process_sets_np2."""
    p = py(PROCESS_SET_SEMANTICS, {"PYTHONPATH": os.path.join(REPO, "python"),
                                   "GRADSYNC_LIB": LIB})
    assert p.returncode == 0, p.stdout
    not_init = ("ValueError gradsync has not been initialized; run gradsync.torch.init() "
                "(hvd.init()) first")
    add = ("NotImplementedError gradsync.torch.add_process_set(%s): gradsync has only the "
           "global process set (every rank of the job) and cannot register a set of some "
           "ranks; run the collectives on every rank with no process_set argument (the "
           "default, global_process_set)")
    bad = ("ValueError ProcessSet should be initialized with a list of process ranks (ints), "
           "e.g. ProcessSet([0, 1]); gradsync has no MPI, so no mpi4py communicator")
    init = ("NotImplementedError gradsync.torch.init(process_sets=%s): gradsync has only the "
            "global process set (every rank of the job) and cannot register others; call "
            "init() without process_sets and run the collectives with no process_set argument")
    assert p.stdout.splitlines() == [
        "ranks = [0, 2]",
        "id = None",
        "size = None",
        "rank = None",
        "included ! " + not_init,
        "global.size ! " + not_init,
        "eq same ranks = False",
        "eq itself = True",
        "eq global = False",
        "add list ! " + add % "[0, 1]",
        "add set ! " + add % "[0, 2]",
        "id after add = None",
        "add bad ! " + bad,
        "remove set = False",
        "remove global = False",
        "new int ! " + bad,
        "new str ! " + bad,
        "init sets ! " + init % "[ProcessSet(process_set_id=None, ranks=[0, 2])]",
        "init dynamic ! " + init % "'dynamic'",
        "initialized = False",
        "forged size ! ValueError process set ProcessSet(process_set_id=7, ranks=[0]) was not "
        "registered by gradsync, which has only the global process set (process_set_id 0); "
        "use gradsync.torch.global_process_set",
    ], p.stdout
