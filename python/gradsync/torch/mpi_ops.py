"""Horovod's PyTorch collectives (horovod.torch.mpi_ops) over libgradsync.

Same names, arguments, defaults and return types as Horovod. Handles are
ints for poll()/synchronize(). Tensor names seen by the coordinator (and in
every error message) are "<op>.<name>" for a given name, else
"<op>.noname.<n>" with n counting this process's ops, so ranks that issue
the same ops in the same order agree on names, as in Horovod.

Scaling follows Horovod exactly: an Average is a Sum whose postscale factor
is divided by the number of ranks, and prescale/postscale are applied in the
tensor's own precision (float32 math for float32 and the 16-bit floats,
double for float64, integers via double then truncation toward zero).
"""

import ctypes
import itertools
import warnings

import torch

from .. import _lib
from .._lib import lib
from . import _core
from ._core import HorovodInternalError
from .compression import Compression

# Reduction ops: Horovod's values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_C_OP = {Average: _lib.GS_AVERAGE, Sum: _lib.GS_SUM, Min: _lib.GS_MIN, Max: _lib.GS_MAX,
         Product: _lib.GS_PRODUCT, Adasum: _lib.GS_ADASUM}
_OP_NAME = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
            Product: "Product"}

_DTYPES = {
    torch.float32: _lib.GS_FLOAT32,
    torch.float64: _lib.GS_FLOAT64,
    torch.float16: _lib.GS_FLOAT16,
    torch.bfloat16: _lib.GS_BFLOAT16,
    torch.int32: _lib.GS_INT32,
    torch.int64: _lib.GS_INT64,
    torch.int8: _lib.GS_INT8,
    torch.uint8: _lib.GS_UINT8,
    torch.int16: _lib.GS_INT16,
}
# As Horovod: reductions on int32, int64 and the floats; data movement also
# on the 8- and 16-bit integers.
_REDUCE_DTYPES = (torch.int32, torch.int64, torch.float16, torch.float32, torch.float64,
                  torch.bfloat16)
_MOVE_DTYPES = _REDUCE_DTYPES + (torch.uint8, torch.int8, torch.int16)

# handle (int) -> _core._Op
_handle_map = {}


# ---- process sets: only the global one ------------------------------------

class ProcessSet:
    """Horovod's process set, made from a list of ranks. gradsync has only
    the global process set (global_process_set, process_set_id 0) and cannot
    register another (add_process_set raises), so a ProcessSet(ranks) stays
    as Horovod leaves a set it has not registered: process_set_id None,
    size() and rank() None, and every collective refuses it at the call
    rather than run it on every rank. included() says, as in Horovod,
    whether this rank is in `ranks` (after init()). Two sets are equal only
    when they are the same object (Horovod defines no __eq__)."""

    def __init__(self, ranks=None):
        if ranks is None:  # the global set: only global_process_set below
            self._ranks = None
            self.process_set_id = 0
            return
        try:
            ranks = sorted(ranks)
        except TypeError:
            ranks = None
        if ranks is None or any(not isinstance(r, int) for r in ranks):
            raise ValueError(
                "ProcessSet should be initialized with a list of process ranks (ints), e.g. "
                "ProcessSet([0, 1]); gradsync has no MPI, so no mpi4py communicator")
        self._ranks = ranks
        self.process_set_id = None

    @property
    def ranks(self):
        """The set's ranks, sorted. The global set's: every rank of the job
        after init() ([0, 1, ..., size() - 1]), [] before (as Horovod's)."""
        if self._ranks is not None:
            return self._ranks
        return list(range(_core._state.size)) if _core.initialized() else []

    def size(self):
        """The number of ranks in the set: size() for the global set; None
        for a set that is not registered (every set but the global one here)."""
        if self.process_set_id is None:
            return None
        _check_registered(self)
        return size()

    def rank(self):
        """This rank's index in the set: rank() for the global set; None for
        a set that is not registered (every set but the global one here).
        As in Horovod, the collectives take global ranks (root_rank of
        broadcast is an index into hvd.rank()'s numbering)."""
        if self.process_set_id is None:
            return None
        _check_registered(self)
        return rank()

    def included(self):
        """Whether this rank (rank()) is one of the set's ranks, registered or
        not: True for the global set. Raises ValueError before init()."""
        return rank() in self.ranks

    def __repr__(self):
        return "ProcessSet(process_set_id=%r, ranks=%r)" % (self.process_set_id, self.ranks)


global_process_set = ProcessSet()


def _check_registered(process_set):
    """A set whose process_set_id someone set to an id gradsync never gave out."""
    if process_set.process_set_id != 0:
        raise ValueError(
            "process set %r was not registered by gradsync, which has only the global process "
            "set (process_set_id 0); use gradsync.torch.global_process_set" % (process_set,))


def add_process_set(process_set):
    """Horovod's add_process_set(process_set or list of ranks). gradsync has
    only the global process set and cannot register another: always raises
    NotImplementedError (ValueError first for a list that is not of ranks).
    The set stays unregistered (process_set_id None)."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    raise NotImplementedError(
        "gradsync.torch.add_process_set(%r): gradsync has only the global process set (every "
        "rank of the job) and cannot register a set of some ranks; run the collectives on every "
        "rank with no process_set argument (the default, global_process_set)" % (ps.ranks,))


def remove_process_set(process_set):
    """Horovod's remove_process_set: returns whether the set was removed.
    As Horovod does for the global set and for a set that is not registered,
    the only two kinds here, returns False and changes nothing."""
    return False


def _check_ps(process_set):
    """Refuses, at the call, any process set but the global one."""
    if process_set is global_process_set:
        return
    if not hasattr(process_set, "process_set_id"):
        raise TypeError(
            "process_set must be a gradsync.torch.ProcessSet, not %s %r; pass no process_set "
            "(the default, global_process_set)" % (type(process_set).__name__, process_set))
    if process_set.process_set_id != 0:
        raise NotImplementedError(
            "gradsync does not support process sets other than the global one yet; pass no "
            "process_set (the default, global_process_set)")


# ---- basics ----------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Joins the job (settings from GRADSYNC_* variables, as set by
    gradsync-run). Safe to call again: a second call does nothing.
    process_sets: gradsync has only the global process set, so anything but
    None, [] or [global_process_set] raises NotImplementedError (before
    joining), where Horovod would register the sets."""
    if comm is not None:
        raise NotImplementedError("gradsync.torch.init: MPI communicators are not supported; "
                                  "ranks come from GRADSYNC_RANK/GRADSYNC_SIZE")
    if process_sets is not None:
        listed = [process_sets] if isinstance(process_sets, str) else list(process_sets)
        if any(ps is not global_process_set for ps in listed):
            raise NotImplementedError(
                "gradsync.torch.init(process_sets=%r): gradsync has only the global process set "
                "(every rank of the job) and cannot register others; call init() without "
                "process_sets and run the collectives with no process_set argument" %
                (process_sets,))
    _core.init_ctx()


def shutdown():
    """Leaves the job. Ops still pending fail with a shutdown error."""
    _core.shutdown_ctx()
    _handle_map.clear()


def is_initialized():
    """True between init() and shutdown() (or the interpreter's exit), else
    False. Never raises."""
    return _core.initialized()


def size():
    """Number of ranks in the job (every process gradsync-run started).
    Raises ValueError before init()."""
    _core.ctx()
    return _core._state.size


def rank():
    """This process's rank in the job, 0 <= rank() < size(). Raises
    ValueError before init()."""
    _core.ctx()
    return _core._state.rank


def local_size():
    """Number of ranks of the job on this rank's host. Raises ValueError
    before init()."""
    _core.ctx()
    return _core._state.local_size


def local_rank():
    """This rank's index among the ranks on its host, 0 <= local_rank() <
    local_size(), e.g. to pick a GPU: torch.cuda.set_device(hvd.local_rank()).
    Raises ValueError before init()."""
    _core.ctx()
    return _core._state.local_rank


def cross_size():
    """Number of hosts, assuming local_size() ranks on every host (as
    gradsync-run -H lays them out)."""
    _core.ctx()
    return max(1, _core._state.size // max(1, _core._state.local_size))


def cross_rank():
    """Index of this rank's host, assuming consecutive ranks per host."""
    _core.ctx()
    return _core._state.rank // max(1, _core._state.local_size)


def is_homogeneous():
    """True when size() is a multiple of local_size(), i.e., as gradsync-run -H
    lays ranks out (local_size() consecutive ranks per host), when every host
    runs the same number of ranks. Only this host's local_size() is looked at.
    Raises ValueError before init()."""
    _core.ctx()
    return _core._state.size % max(1, _core._state.local_size) == 0


def mpi_threads_supported():
    """False: gradsync does not use MPI. Works before init()."""
    return False


def mpi_enabled():
    """False: gradsync does not use MPI (see mpi_built()). Works before init()."""
    return False


def mpi_built():
    """False: gradsync does not use MPI."""
    return False


def gloo_enabled():
    """False: gradsync's collectives do not run on Gloo (see gloo_built());
    init_process_group() still makes a Gloo group for torch.distributed itself.
    Works before init()."""
    return False


def gloo_built():
    """False: gradsync's CPU data plane is its own (shared memory within a
    host, a TCP ring between hosts), not Gloo."""
    return False


def nccl_built():
    """As Horovod: NCCL's version code when the library has the NCCL
    backend, else 0."""
    return int(lib.gs_nccl_version())


def cuda_built():
    """True when the library was built with its nccl backend (nccl_built() > 0),
    which takes CUDA tensors; says nothing about GPUs being present. Works
    before init()."""
    return nccl_built() > 0


def rocm_built():
    """False: gradsync has no ROCm backend. Works before init()."""
    return False


def ddl_built():
    """False: gradsync has no IBM DDL backend. Works before init()."""
    return False


def ccl_built():
    """False: gradsync has no oneCCL backend. Works before init()."""
    return False


def start_timeline(file_path, mark_cycles=False):
    """Horovod's start_timeline: always raises NotImplementedError. gradsync
    records the timeline at the coordinator, for the whole job (gradsyncctl,
    docs/operations.md); file_path and mark_cycles are not used."""
    raise NotImplementedError("gradsync records the timeline at the coordinator; "
                              "see docs/pytorch.md")


def stop_timeline():
    """Horovod's stop_timeline: always raises NotImplementedError (see
    start_timeline())."""
    raise NotImplementedError("gradsync records the timeline at the coordinator; "
                              "see docs/pytorch.md")


# ---- helpers -----------------------------------------------------------------

def _gs_dtype(tensor, allowed):
    if tensor.dtype not in allowed:
        raise ValueError("Tensor type %s is not supported." % tensor.type())
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    # CUDA tensors go to the library as device pointers with the current
    # stream in the op's options; it answers for itself whether its nccl
    # backend can take them.
    return _DTYPES[tensor.dtype]


def _op_name(kind, name):
    if name is None or name == "":
        return "%s.noname.%d" % (kind, _core.next_id())
    return "%s.%s" % (kind, name)


def _shape(t):
    dims = list(t.shape) or [1]
    return (ctypes.c_int64 * len(dims))(*dims), len(dims)


_handle_ids = itertools.count(1)


def _register(op):
    hid = next(_handle_ids)
    _handle_map[hid] = op
    return hid


def _resolve_op(op, average, default=Average):
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning)
        return Average if average else Sum
    return default if op is None else op


def _scale_(t, factor):
    """t *= factor in t's own precision (Horovod's ScaleBuffer)."""
    if factor == 1.0:
        return t
    if t.dtype == torch.float64:
        return t.mul_(factor)
    if t.dtype.is_floating_point:  # float32 math, the factor rounded to float
        f32 = torch.tensor(factor, dtype=torch.float32)
        if t.dtype == torch.float32:
            return t.mul_(f32)
        return t.copy_((t.float() * f32).to(t.dtype))
    return t.copy_(torch.trunc(t.double() * factor).to(t.dtype))


def _cuda_stream_of(tensor):
    if tensor.is_cuda:
        return torch.cuda.current_stream(tensor.device).cuda_stream
    return None


def _torch_stream_of(tensor):
    """The current stream of a CUDA tensor's device (None for a CPU tensor):
    the op's stream, on which the library orders its work and a gathering
    op's result copy."""
    return torch.cuda.current_stream(tensor.device) if tensor.is_cuda else None


# ---- allreduce ---------------------------------------------------------------

def _check_reduce_op(op):
    if op == Adasum:
        raise NotImplementedError(
            "gradsync does not support the Adasum reduction yet; use op=Average or op=Sum")
    if op not in _C_OP:
        raise ValueError("op %r is not one of Average, Sum, Min, Max, Product, Adasum" % (op,))


def _allreduce_opts(tensor, op, prescale_factor, postscale_factor, average_as_sum):
    """The C op and gs_allreduce_opts of an allreduce of tensor; the shape
    array is returned too, to be kept alive as long as opts. With
    average_as_sum, Average is, as in Horovod, a sum postscaled by 1/size in
    the tensor's precision."""
    c_op = _C_OP[op]
    post = float(postscale_factor)
    if op == Average and average_as_sum:
        c_op = _lib.GS_SUM
        post = post / _core._state.size
    shape, ndim = _shape(tensor)
    opts = _lib.allreduce_opts()
    opts.stream = _cuda_stream_of(tensor)
    opts.shape = shape
    opts.ndim = ndim
    opts.prescale = float(prescale_factor)
    opts.postscale = post
    return c_op, opts, shape


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    _check_ps(process_set)
    _check_reduce_op(op)
    gdt = _gs_dtype(tensor, _REDUCE_DTYPES)
    c = _core.ctx()
    full = _op_name("allreduce", name)
    # (A local tensor keeps GS_AVERAGE: the library scales it by 1/size
    # without communicating.)
    c_op, opts, shape = _allreduce_opts(tensor, op, prescale_factor, postscale_factor,
                                        not lib.gs_is_local(c, full.encode()))
    h = ctypes.c_void_p()
    st = lib.gs_allreduce_async(c, full.encode(), tensor.data_ptr(), output.data_ptr(),
                                tensor.numel(), gdt, c_op, ctypes.byref(opts), ctypes.byref(h))
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, full)
    op_ = _core.submit([h.value], (tensor, output), lambda hs: output, full)
    return _register(op_)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts averaging (or summing, ...) tensor over all ranks into a new
    tensor; returns a handle for poll()/synchronize()."""
    op = _resolve_op(op, average)
    output = tensor.new(tensor.shape)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce_async."""
    op = _resolve_op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce as an autograd function (the gradient is allreduced too)."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output.contiguous(), average=ctx.average, op=ctx.op,
                          prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor, process_set=ctx.process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Averages (or sums, ...) tensor over all ranks; returns a new tensor."""
    tensor_compressed, cctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(tensor_compressed, average, name, op, prescale_factor,
                                     postscale_factor, process_set)
    return compression.decompress(reduced, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


# ---- grouped allreduce --------------------------------------------------------

def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set):
    _check_ps(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped allreduce needs at least one tensor")
    _check_reduce_op(op)
    dts = {t.dtype for t in tensors}
    if len(dts) > 1:
        raise ValueError("grouped allreduce: all tensors must have the same dtype, got %s"
                         % sorted(str(d) for d in dts))
    gdt = _gs_dtype(tensors[0], _REDUCE_DTYPES)
    for t in tensors[1:]:
        _gs_dtype(t, _REDUCE_DTYPES)
    c = _core.ctx()
    base = _op_name("grouped_allreduce", name)
    names = ["%s.%d" % (base, i) for i in range(len(tensors))]
    c_op = _C_OP[op]
    post = float(postscale_factor)
    if op == Average:
        c_op = _lib.GS_SUM
        post = post / _core._state.size
    n = len(tensors)
    c_names = (ctypes.c_char_p * n)(*[s.encode() for s in names])
    sends = (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors])
    recvs = (ctypes.c_void_p * n)(*[o.data_ptr() for o in outputs])
    counts = (ctypes.c_size_t * n)(*[t.numel() for t in tensors])
    opts = _lib.allreduce_opts()
    opts.stream = _cuda_stream_of(tensors[0])
    opts.prescale = float(prescale_factor)
    opts.postscale = post
    hs = (ctypes.c_void_p * n)()
    st = lib.gs_grouped_allreduce_async(c, n, c_names, sends, recvs, counts, gdt, c_op,
                                        ctypes.byref(opts), hs)
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, base)
    outs = list(outputs)
    op_ = _core.submit(list(hs), (tensors, outs), lambda _: outs, base)
    return _register(op_)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts averaging (or summing, ...) a list of tensors over all ranks as one
    group: the coordinator negotiates them together and runs them in one plan.
    Returns a handle for poll()/synchronize(); synchronize() returns a list of
    new tensors, one per input, in order. The inputs are not modified.

    tensors: a non-empty list of contiguous tensors, all of one dtype (int32,
    int64, float16, bfloat16, float32 or float64); every rank must pass the
    same number of tensors with the same shapes. They are named
    "grouped_allreduce.<name>.<i>" ("grouped_allreduce.noname.<n>.<i>" when
    name is None). op: Average (the default), Sum, Min, Max or Product;
    average (deprecated): True for Average, False for Sum. prescale_factor
    multiplies the inputs and postscale_factor the results, in each tensor's
    precision; an Average is a Sum postscaled by 1/size(). CUDA tensors are
    passed as device pointers with the first tensor's current stream.

    Raises ValueError at the call for an empty list, mixed dtypes, an
    unsupported dtype, a non-contiguous tensor, a name already in flight on
    this rank, both op and average given, or before init();
    NotImplementedError for Adasum or a process set other than the global one;
    HorovodInternalError when the job has already failed. A collective that
    fails (e.g. shapes that differ across ranks) raises HorovodInternalError
    from synchronize()."""
    op = _resolve_op(op, average)
    outputs = [t.new(t.shape) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped_allreduce_async: each tensor receives its own result;
    synchronize() returns the list of the tensors given. Arguments and errors
    as grouped_allreduce_async()."""
    op = _resolve_op(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor,
                                    postscale_factor, process_set)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set,
                *tensors):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        reduced = grouped_allreduce([g.contiguous() for g in grad_output], average=ctx.average, op=ctx.op,
                                    prescale_factor=ctx.prescale_factor,
                                    postscale_factor=ctx.postscale_factor,
                                    process_set=ctx.process_set)
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Averages (or sums, ...) a list of tensors over all ranks as one group and
    returns a list of new tensors, one per input, in order; blocks until done.
    Differentiable: the gradients are grouped-allreduced with the same op and
    factors. compression (Compression.none, .fp16 or .bf16) is applied to
    each tensor before the reduction and undone after. Other arguments as
    grouped_allreduce_async(); raises the same errors at the call, and
    HorovodInternalError when the collective fails."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor,
                                            postscale_factor, process_set, *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce: each tensor receives its own result; blocks
    and returns the list of the tensors given. Arguments and errors as
    grouped_allreduce_async(); HorovodInternalError when the collective fails."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ---- allgather ------------------------------------------------------------------

def _result_size(h):
    """The size in bytes of a completed op's result (gs_handle_result)."""
    data = ctypes.c_void_p()
    nbytes = ctypes.c_size_t()
    st = lib.gs_handle_result(h, ctypes.byref(data), ctypes.byref(nbytes))
    if st != _lib.GS_OK:
        raise HorovodInternalError(_core.last_error())
    return nbytes.value


def _result_tensor(h, nbytes, shape, like, stream):
    """A new tensor of shape, with like's dtype, on like's device, holding
    the op's result: the library copies it there (gs_handle_result_copy) from
    where the op ran, a memcpy for a CPU tensor and, for a CUDA tensor, a
    device copy on the op's stream (stream: the torch stream current when
    the op was submitted; the tensor is allocated on it). Raises
    HorovodInternalError when the library refuses (a shape that does not
    match the result's size names both)."""
    if like.is_cuda:
        with torch.cuda.device(like.device), torch.cuda.stream(stream):
            out = torch.empty(shape, dtype=like.dtype, device=like.device)
    else:
        out = torch.empty(shape, dtype=like.dtype)
    st = lib.gs_handle_result_copy(h, out.data_ptr() if nbytes else None, nbytes)
    if st != _lib.GS_OK:
        raise HorovodInternalError(_core.last_error())
    return out


def _allgather_submit(tensor, full):
    gdt = _gs_dtype(tensor, _MOVE_DTYPES)
    c = _core.ctx()
    shape, ndim = _shape(tensor)
    h = ctypes.c_void_p()
    opts = _lib.op_opts(_cuda_stream_of(tensor))
    st = lib.gs_allgather_async(c, full.encode(), tensor.data_ptr(), shape, ndim, gdt,
                                ctypes.byref(opts), ctypes.byref(h))
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, full)
    return h.value, _torch_stream_of(tensor)


def _allgather_finish(h, tensor, stream):
    nbytes = _result_size(h)
    total = ctypes.c_int64()
    lib.gs_allgather_dims(h, None, 0, ctypes.byref(total))
    rest = list(tensor.shape[1:]) if tensor.dim() > 0 else []
    return _result_tensor(h, nbytes, [total.value] + rest, tensor, stream)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's tensor along the first dimension
    (which may differ per rank); returns a handle whose synchronize() gives
    the result, a new tensor on tensor's device (for a CUDA tensor, written
    on the stream that was current at this call)."""
    _check_ps(process_set)
    full = _op_name("allgather", name)
    h, stream = _allgather_submit(tensor, full)
    op_ = _core.submit([h], (tensor,), lambda hs: _allgather_finish(hs[0], tensor, stream), full)
    return _register(op_)


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output.contiguous(), op=Average,
                                 process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64),
                         process_set=ctx.process_set)
        offset = int(dims[:rank()].sum().item())
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenation of every rank's tensor along the first dimension, as a
    new tensor on tensor's device."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of each tensor of a list (named
    "grouped_allgather.<name>.<i>"); returns a handle whose synchronize()
    gives the list of results, in order: for each tensor, the concatenation
    of every rank's tensor along the first dimension (which may differ per
    rank; the other dimensions must agree), built as a new tensor on that
    tensor's device. The inputs are not modified.

    Dtypes: those of allreduce plus uint8, int8 and int16; tensors must be
    contiguous. Raises ValueError at the call for an unsupported dtype, a
    non-contiguous tensor, a name already in flight or before init() (tensors
    of the list already submitted then still complete and are freed);
    NotImplementedError for a process set other than the global one. A failed
    collective raises HorovodInternalError from synchronize()."""
    _check_ps(process_set)
    tensors = list(tensors)
    base = _op_name("grouped_allgather", name)
    hs, streams = [], []
    try:
        for i, t in enumerate(tensors):
            h, s = _allgather_submit(t, "%s.%d" % (base, i))
            hs.append(h)
            streams.append(s)
    except BaseException:
        for h in hs:  # the ones already submitted complete and are freed
            _core.release(_core.submit([h], None, None, base))
        raise
    op_ = _core.submit(hs, (tensors,),
                       lambda hh: [_allgather_finish(h, t, s)
                                   for h, t, s in zip(hh, tensors, streams)], base)
    return _register(op_)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Blocking grouped_allgather_async(): returns the list of gathered tensors
    (new tensors, each on its input's device), in the order of tensors.
    Unlike allgather(), records no autograd graph. Errors as
    grouped_allgather_async(), and HorovodInternalError when the collective
    fails."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---- broadcast --------------------------------------------------------------------

def _broadcast_async(tensor, output, root_rank, name, process_set):
    _check_ps(process_set)
    gdt = _gs_dtype(tensor, _MOVE_DTYPES)
    c = _core.ctx()
    full = _op_name("broadcast", name)
    if output is not tensor:
        output.copy_(tensor)
    h = ctypes.c_void_p()
    opts = _lib.op_opts(_cuda_stream_of(output))
    st = lib.gs_broadcast_async(c, full.encode(), output.data_ptr(), output.numel(), gdt,
                                int(root_rank), ctypes.byref(opts), ctypes.byref(h))
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, full)
    op_ = _core.submit([h.value], (tensor, output), lambda hs: output, full)
    return _register(op_)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's tensor to every rank into a new tensor (a
    copy of tensor, on its device, overwritten with root_rank's values);
    tensor itself is not modified. Returns a handle whose synchronize() gives
    the new tensor.

    tensor: contiguous, of dtype int32, int64, float16, bfloat16, float32,
    float64, uint8, int8 or int16, with the same number of elements and
    dtype on every rank. root_rank: the rank whose values every rank receives.
    name: the op is named "broadcast.<name>" ("broadcast.noname.<n>" when
    None). A CUDA tensor is passed as a device pointer with its device's
    current stream.

    Raises ValueError at the call for an unsupported dtype, a non-contiguous
    tensor, a root_rank that is not a rank of the job, a name already in
    flight or before init(); NotImplementedError for a process set other than
    the global one; HorovodInternalError when the job has already failed. A
    collective that fails raises HorovodInternalError from synchronize()."""
    return _broadcast_async(tensor, tensor.new(tensor.shape), root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast_async: starts overwriting tensor with root_rank's
    values; synchronize() returns tensor. Arguments and errors as
    broadcast_async()."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output.contiguous(), op=Average,
                                 process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced *= 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns a new tensor holding root_rank's tensor, on every rank; tensor is
    not modified. Blocks until done. Differentiable as in Horovod: the
    gradient is averaged over all ranks and is zero on every rank but
    root_rank. Arguments and errors as broadcast_async();
    HorovodInternalError when the collective fails."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast: overwrites tensor with root_rank's values, blocks
    until done and returns tensor. Arguments and errors as broadcast_async();
    HorovodInternalError when the collective fails."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall -------------------------------------------------------------------------

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[q] rows of tensor to rank q (equal parts when splits is
    None); synchronize() returns (output, received_splits), output a new
    tensor on tensor's device (for a CUDA tensor, written on the stream that
    was current at this call)."""
    _check_ps(process_set)
    gdt = _gs_dtype(tensor, _MOVE_DTYPES)
    c = _core.ctx()
    n = _core._state.size
    c_splits = None
    if splits is not None:
        sp = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
        if len(sp) != n:
            raise ValueError("alltoall: splits has %d entries, but there are %d ranks; give one "
                             "entry per rank" % (len(sp), n))
        c_splits = (ctypes.c_int64 * n)(*[int(x) for x in sp])
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    full = _op_name("alltoall", name)
    shape, ndim = _shape(tensor)
    h = ctypes.c_void_p()
    opts = _lib.op_opts(_cuda_stream_of(tensor))
    st = lib.gs_alltoall_async(c, full.encode(), tensor.data_ptr(), shape, ndim, gdt, c_splits,
                               ctypes.byref(opts), ctypes.byref(h))
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, full)
    splits_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    stream = _torch_stream_of(tensor)

    def finish(hs):
        nbytes = _result_size(hs[0])
        recv = (ctypes.c_int64 * n)()
        lib.gs_alltoall_recv_splits(hs[0], recv, n)
        out = _result_tensor(hs[0], nbytes, [sum(recv)] + list(tensor.shape[1:]), tensor, stream)
        return out, torch.tensor(list(recv), dtype=splits_dtype)

    op_ = _core.submit([h.value], (tensor, c_splits), finish, full)
    return _register(op_)


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set = process_set
        ctx.recvsplits = received_splits
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *dead):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.recvsplits,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """The rows every rank sent to this one, in rank order, as a new tensor
    on tensor's device; with splits given, also the tensor of rows received
    from each rank."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ---- reducescatter -----------------------------------------------------------------------

def _reducescatter_submit(tensor, full, op, prescale_factor):
    if op not in (Average, Sum):
        raise ValueError("reducescatter supports op=Average and op=Sum, not %s"
                         % _OP_NAME.get(op, op))
    gdt = _gs_dtype(tensor, _REDUCE_DTYPES)
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    c = _core.ctx()
    send = tensor
    if prescale_factor != 1.0:
        send = _scale_(tensor.clone(), prescale_factor)
    shape, ndim = _shape(send)
    h = ctypes.c_void_p()
    opts = _lib.op_opts(_cuda_stream_of(send))
    st = lib.gs_reducescatter_async(c, full.encode(), send.data_ptr(), shape, ndim, gdt,
                                    _lib.GS_SUM, ctypes.byref(opts), ctypes.byref(h))
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, full)
    return h.value, send


def _reducescatter_finish(h, tensor, op, postscale_factor, stream):
    nbytes = _result_size(h)
    rest = list(tensor.shape[1:])
    row = tensor.element_size()
    for d in rest:
        row *= d
    if row:
        rows = nbytes // row
    else:  # rows of zero elements: this rank's share of the first dimension
        n, r, d0 = _core._state.size, _core._state.rank, tensor.shape[0]
        rows = d0 // n + (1 if r < d0 % n else 0)
    out = _result_tensor(h, nbytes, [rows] + rest, tensor, stream)
    post = float(postscale_factor)
    if op == Average:
        post = post / _core._state.size
    if stream is None:
        return _scale_(out, post)
    with torch.cuda.device(tensor.device), torch.cuda.stream(stream):
        return _scale_(out, post)  # on the op's stream, after the copy


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Reduces tensor over ranks and leaves this rank its share of the first
    dimension (lower ranks get the extra rows), a new tensor on tensor's
    device (for a CUDA tensor, written on the stream that was current at
    this call)."""
    _check_ps(process_set)
    full = _op_name("reducescatter", name)
    h, send = _reducescatter_submit(tensor, full, op, prescale_factor)
    stream = _torch_stream_of(tensor)
    op_ = _core.submit([h], (tensor, send),
                       lambda hs: _reducescatter_finish(hs[0], tensor, op, postscale_factor,
                                                        stream), full)
    return _register(op_)


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output.contiguous(), process_set=ctx.process_set)
        scale = ctx.scale / (size() if ctx.op == Average else 1)
        return grad * scale if scale != 1.0 else grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces tensor over all ranks and returns this rank's share of the result
    along the first dimension, as a new tensor on tensor's device: the rows
    are split as evenly as possible, lower ranks getting the extra ones.
    Blocks until done.

    tensor: contiguous, at least one dimension, of dtype int32, int64,
    float16, bfloat16, float32 or float64, of the same shape on every rank.
    op: Average (the default) or Sum. compression (Compression.none, .fp16 or
    .bf16) is applied before and undone after. prescale_factor multiplies the
    input and postscale_factor the result, in the tensor's precision; an
    Average is a Sum postscaled by 1/size(). Differentiable: the gradient is
    the allgather of the output's gradient times prescale_factor *
    postscale_factor (divided by size() for Average).

    Raises ValueError for another op, a 0-dimensional tensor, an unsupported
    dtype, a non-contiguous tensor, a name already in flight or before init();
    NotImplementedError for a process set other than the global one;
    HorovodInternalError when the collective fails."""
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter of each tensor of a list (named
    "grouped_reducescatter.<name>.<i>"); returns a handle whose synchronize()
    gives the list of this rank's shares (new tensors, each on its input's
    device), in order, each as reducescatter() computes it. op: Average (the
    default) or Sum; prescale_factor / postscale_factor as reducescatter().
    The inputs are not modified.

    Raises ValueError at the call for another op, a 0-dimensional tensor, an
    unsupported dtype, a non-contiguous tensor, a name already in flight or
    before init() (tensors of the list already submitted then still complete
    and are freed); NotImplementedError for a process set other than the
    global one. A failed collective raises HorovodInternalError from
    synchronize()."""
    _check_ps(process_set)
    tensors = list(tensors)
    base = _op_name("grouped_reducescatter", name)
    hs, sends = [], []
    try:
        for i, t in enumerate(tensors):
            h, s = _reducescatter_submit(t, "%s.%d" % (base, i), op, prescale_factor)
            hs.append(h)
            sends.append(s)
    except BaseException:
        for h in hs:
            _core.release(_core.submit([h], (sends,), None, base))
        raise
    streams = [_torch_stream_of(t) for t in tensors]
    op_ = _core.submit(hs, (tensors, sends),
                       lambda hh: [_reducescatter_finish(h, t, op, postscale_factor, s)
                                   for h, t, s in zip(hh, tensors, streams)], base)
    return _register(op_)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Blocking grouped_reducescatter_async(): returns the list of this rank's
    shares (new tensors, each on its input's device), in the order of
    tensors. compression is applied to each tensor before and undone after.
    Unlike reducescatter(), records no autograd graph. Errors as grouped_reducescatter_async(), and
    HorovodInternalError when the collective fails."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    outs = synchronize(grouped_reducescatter_async(list(compressed), name, op, process_set,
                                                   prescale_factor, postscale_factor))
    return [compression.decompress(t, c) for t, c in zip(outs, ctxs)]


# ---- sparse -------------------------------------------------------------------------------

def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO gradient by gathering every rank's
    (index, row) pairs; returns a callable that waits and returns the
    (uncoalesced) sparse result, values divided by size for Average, on the
    tensor's device. A CPU tensor with one sparse dimension goes through the
    library's sparse op (one packed allgather, host memory only); a CUDA
    tensor, or one with several sparse dimensions, is gathered as two
    allgathers (indices, values) on its own device, as in Horovod. Every
    rank must pass the same kind of tensor (the op names differ)."""
    _check_ps(process_set)
    if op not in (Average, Sum):
        raise ValueError("sparse allreduce supports op=Average and op=Sum")
    t = tensor
    if t.sparse_dim() != 1 or t.is_cuda:
        # indices and values gathered separately, on the tensor's device
        ih = allgather_async(t._indices().transpose(0, 1).contiguous(), name="%s.indices" % name,
                             process_set=process_set)
        vh = allgather_async(t._values().contiguous(), name="%s.values" % name,
                             process_set=process_set)

        def gathered():
            values = synchronize(vh)
            indices = synchronize(ih)
            if op == Average:
                values = values / size()
            return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size())
        return gathered
    values = t._values().contiguous()
    gdt = _gs_dtype(values, _REDUCE_DTYPES)
    indices = t._indices().reshape(-1).contiguous()
    nnz = indices.numel()
    row_len = 1
    for d in values.shape[1:]:
        row_len *= d
    c = _core.ctx()
    full = "sparse_allreduce.%s" % name
    h = ctypes.c_void_p()
    st = lib.gs_sparse_allreduce_async(
        c, full.encode(), ctypes.cast(indices.data_ptr(), ctypes.POINTER(ctypes.c_int64)),
        values.data_ptr(), nnz, row_len, gdt, _C_OP[op], None, ctypes.byref(h))
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, full)
    rest = list(values.shape[1:])

    def finish(hs):
        ip = ctypes.POINTER(ctypes.c_int64)()
        vp = ctypes.c_void_p()
        total = ctypes.c_size_t()
        if lib.gs_sparse_result(hs[0], ctypes.byref(ip), ctypes.byref(vp),
                                ctypes.byref(total)) != _lib.GS_OK:
            raise HorovodInternalError(_core.last_error())
        m = total.value
        # Sparse ops run on host buffers only, so the indices are host
        # memory; the values are the handle's result.
        idx = torch.empty([m], dtype=torch.int64)
        if m:
            ctypes.memmove(idx.data_ptr(), ctypes.cast(ip, ctypes.c_void_p).value, m * 8)
        vals = _result_tensor(hs[0], m * row_len * values.element_size(), [m] + rest, values,
                              None)
        return torch.sparse_coo_tensor(idx.view(1, m), vals, t.size())

    op_ = _core.submit([h.value], (indices, values), finish, full)
    hid = _register(op_)

    def result():
        return synchronize(hid)
    return result


# ---- completion -----------------------------------------------------------------------------

def poll(handle):
    """True once the op completed (successfully or not); never blocks."""
    op = _handle_map.get(handle)
    if op is None:
        return True
    _core.pin([op])
    try:
        return op.try_complete()
    finally:
        _core.unpin([op])


def synchronize(handle):
    """Waits for the op and returns its result (the output tensor, a list for
    grouped ops, (output, received_splits) for alltoall). Raises
    HorovodInternalError (a RuntimeError) with gradsync's message when the
    collective failed. The wait is bounded in slices, so Ctrl-C works."""
    op = _handle_map.get(handle)
    if op is None:
        return None
    try:
        return _core.wait(op)
    finally:
        _handle_map.pop(handle, None)
        _core.release(op)


def join(device=-1):
    """This rank has run out of data: takes part in the other ranks'
    allreduces with zeros until every rank joined. Returns the rank that
    joined last."""
    c = _core.ctx()
    last = ctypes.c_int(-1)
    st = lib.gs_join(c, ctypes.byref(last))
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, "join")
    return last.value


def barrier(process_set=global_process_set):
    """Blocks until every rank reached the barrier."""
    _check_ps(process_set)
    st = lib.gs_barrier(_core.ctx())
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, "barrier")
