"""Persistent allreduces (MPI-4's MPI_Allreduce_init / MPI_Startall, as
mpi4py's Allreduce_init, Prequest.Start and Prequest.Startall) over
gs_allreduce_init, gs_startall and gs_start.

Ownership and threads:
- A PersistentAllreduce owns its C handle; nothing else frees it (it is
  never registered with the completer while the object lives). Its _State
  keeps the tensors the library reads and writes (and the shape array) alive
  for the handle's whole life.
- free() (explicit, at garbage collection through weakref.finalize, or for
  every live op at shutdown) frees an inactive op's handle at once. An
  active one is handed, tensors included, to the completer thread, which
  frees the handle and drops the tensors once the op completes (gs_shutdown
  completes it at the latest): the library never writes into a freed tensor.
  The _State's lock and `freed` flag make that happen once.
- start/startall/wait/test may be called from any thread, but not on one op
  from two threads at once (gradsync.h: do not start an op while another
  thread waits on it).
"""

import ctypes
import threading
import weakref

from .. import _lib
from .._lib import lib
from . import _core

# id(_State) -> _State of every op not freed yet: shutdown frees them.
_live = {}
# An RLock: a finalizer (garbage collection) may run on a thread that holds it.
_live_mu = threading.RLock()


class _State:
    __slots__ = ("h", "keep", "name", "lock", "freed")

    def __init__(self, h, keep, name):
        self.h = h
        self.keep = keep
        self.name = name
        self.lock = threading.Lock()
        self.freed = False


def _done(h, call):
    """The application's test (gs_test: counts as waiting on the op); in a
    forked child an active op raises, naming call."""
    done = ctypes.c_int(0)
    _core.raise_if_forked(lib.gs_test(h, ctypes.byref(done)), call)
    return bool(done.value)


def _done_passive(h):
    """A test that does not count as this rank waiting on the op (freeing
    is not waiting: see gs_wait_any_passive)."""
    one = (ctypes.c_void_p * 1)(h)
    idx = ctypes.c_size_t(1)
    lib.gs_wait_any_passive(one, 1, 0, ctypes.byref(idx))
    return idx.value == 0


def _free_state(state):
    """Frees state's handle once (see the module comment). Safe from any
    thread and from a finalizer."""
    with state.lock:
        if state.freed:
            return
        state.freed = True
    with _live_mu:
        _live.pop(id(state), None)
    h, keep = state.h, state.keep
    state.keep = None
    if _done_passive(h) or _core._completer is None:
        # Inactive (after gs_shutdown every op is): nothing writes recv any
        # more.
        lib.gs_handle_free(h)
        return
    # Started and not complete: the completer frees it once it completes,
    # keeping the tensors alive until then.
    _core.submit([h], keep, None, state.name, callback=_core.release)


def free_all():
    """Frees every persistent op left (shutdown, after gs_shutdown)."""
    with _live_mu:
        states = list(_live.values())
    for s in states:
        _free_state(s)


def live_count():
    """Persistent ops of this process not freed yet (for tests)."""
    with _live_mu:
        return len(_live)


class PersistentAllreduce:
    """A persistent allreduce made by allreduce_init: start() (or
    startall([...])) it every step, then wait() for its output."""

    __slots__ = ("_state", "_finalizer", "name", "__weakref__")

    def __init__(self, state):
        self._state = state
        self.name = state.name
        self._finalizer = weakref.finalize(self, _free_state, state)

    @property
    def output(self):
        """The output tensor (None once freed: the object lets go of its
        tensors then)."""
        keep = self._state.keep
        return keep[1] if keep else None

    def _handle(self):
        s = self._state
        if s.freed:
            raise ValueError(
                "persistent allreduce %s was freed (by free() or gradsync.torch.shutdown()); "
                "make a new one with allreduce_init()" % s.name)
        return s.h

    def start(self):
        """Starts the op (gs_startall of one, which is gs_start); every
        rank must start the same names. Raises ValueError when it is still
        active (wait() for it first), another op of its name is in flight or
        it was freed (shutdown() frees it), HorovodInternalError when the
        job failed, with gradsync's text."""
        startall([self])

    def test(self):
        """True when the op is not active (completed, or never started)."""
        return _done(self._handle(), "test()")

    def wait(self):
        """Waits for the op in bounded slices (Ctrl-C works) and returns the
        output tensor; raises HorovodInternalError with gradsync's text when
        it failed. An op not active returns at once (its last status)."""
        h = self._handle()
        while not _done(h, "wait()"):
            lib.gs_wait(h, _core.WAIT_SLICE_MS)
        st = lib.gs_wait(h, 0)
        if st != _lib.GS_OK:
            msg = _lib.error_text(lib.gs_handle_error(h)) or _lib.text(lib.gs_status_str(st))
            raise _core.HorovodInternalError(msg)
        return self._state.keep[1]

    def error(self):
        """The last start's error text ("" when it succeeded or is running)."""
        h = self._handle()
        if not _done(h, "error()"):
            return ""
        return _lib.error_text(lib.gs_handle_error(h))

    def free(self):
        """Frees the op (a no-op when already freed). An active op is freed
        once it completes; its tensors stay alive until then."""
        self._finalizer()

    @property
    def freed(self):
        """True once the op was freed (free(), garbage collection or
        shutdown()); start(), test(), wait() and error() then raise
        ValueError."""
        return self._state.freed

    def __repr__(self):
        return "PersistentAllreduce(%r%s)" % (self.name, ", freed" if self._state.freed else "")


def allreduce_init(tensor, output=None, name=None, op=None, prescale_factor=1.0,
                   postscale_factor=1.0):
    """Makes a persistent allreduce of a CPU tensor into output (None: in
    place), named "allreduce.<name>" as allreduce_async's; it submits
    nothing. Both tensors are kept alive by the returned object and must
    keep their storage (no resize_, no set_) until it is freed. op:
    Average (default) or Sum, Min, Max, Product."""
    from . import mpi_ops as m

    op = m.Average if op is None else op
    m._check_reduce_op(op)
    full = m._op_name("allreduce", name)
    if tensor.is_cuda or (output is not None and output.is_cuda):
        raise ValueError("persistent allreduce %s: only CPU tensors are supported; use "
                         "allreduce_async_ for CUDA tensors" % full)
    gdt = m._gs_dtype(tensor, m._REDUCE_DTYPES)
    if output is None:
        output = tensor
    elif (output.dtype != tensor.dtype or output.numel() != tensor.numel()
          or not output.is_contiguous()):
        raise ValueError("persistent allreduce %s: output must be a contiguous %s tensor of %d "
                         "elements, got %s of %d" % (full, tensor.dtype, tensor.numel(),
                                                     output.dtype, output.numel()))
    c = _core.ctx()
    # As allreduce_async (a local name is refused by gs_allreduce_init).
    c_op, opts, shape = m._allreduce_opts(tensor, op, prescale_factor, postscale_factor, True)
    h = ctypes.c_void_p()
    st = lib.gs_allreduce_init(c, full.encode(), tensor.data_ptr(), output.data_ptr(),
                               tensor.numel(), gdt, c_op, ctypes.byref(opts), ctypes.byref(h))
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, full)
    state = _State(h.value, (tensor, output, shape), full)
    with _live_mu:
        _live[id(state)] = state
    return PersistentAllreduce(state)


def startall(ops):
    """Starts every op of the list at once (one gs_startall): all or none.
    On an error nothing is started and the exception carries gradsync's
    text naming the op."""
    ops = list(ops)
    if not ops:
        return
    for p in ops:
        if not isinstance(p, PersistentAllreduce):
            raise ValueError("startall takes PersistentAllreduce objects (from allreduce_init), "
                             "got %r" % (p,))
    hs = [p._handle() for p in ops]
    c = _core.ctx()
    arr = (ctypes.c_void_p * len(hs))(*hs)
    st = lib.gs_startall(c, len(hs), arr)
    if st != _lib.GS_OK:
        _core.raise_submit_error(st, ops[0].name)
