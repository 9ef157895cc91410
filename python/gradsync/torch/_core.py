"""The process's gradsync context, its ops in flight and the completer thread.

Ownership and threads:
- `_state.ctx` is the gs_ctx of this process, created by init() and freed by
  shutdown() (or at interpreter exit).
- An _Op owns the C handles of one user-visible handle (a grouped op has
  several) and keeps every tensor the library reads or writes alive until
  the C handles are freed. Its fields are guarded by its own lock; `pins`
  and `released` by the module lock `_mu`.
- One completer thread per process waits on the C handles of every live op
  with gs_wait_any_passive in bounded slices (its waits do not make the rank
  look blocked: only the application's do; ops with callbacks, which the
  application waits on through torch futures, are tested as gs_test polls
  them), finishes ops as they complete (results
  copied out of the library's buffers, errors turned into exceptions) and
  runs their callbacks (futures of the DDP hook). Application threads that
  synchronize() wait on their own op in bounded gs_wait slices, so the
  library sees them blocked (deadlock detection names the tensors) and
  Ctrl-C interrupts them within a slice. Whichever thread sees an op
  complete first finishes it; the op's lock makes that happen once.
- A C handle is freed only when no thread has it in a wait (`pins` == 0)
  and the op was released (synchronized, or its callbacks ran).
- A persistent op's handle (persistent.py) is owned by its
  PersistentAllreduce object, never by an _Op: the completer sees it only
  when the object is freed while the op is active, as an _Op released by
  its own callback (freed, its tensors dropped, once the op completes).
- fork: a child forked after init() (os.fork(), a fork-started data-loader
  worker) has a copy of the context without the library's threads or this
  module's completer. The library answers every call on it there with
  GS_ERR_FORKED (gradsync.h): collectives raise HorovodInternalError with
  its text at the call, and so does synchronize() on an op still pending at
  the fork (an op finished before it still returns its result). The child
  gets a fresh `_mu` (a parent's thread may have held it at the fork) and
  no completer; shutdown() there forgets the context without leaving the
  parent's job, and the interpreter's exit does nothing (_at_exit).
"""

import atexit
import ctypes
import itertools
import os
import threading

from .. import _lib
from .._lib import lib

# Slices of the bounded waits, in ms.
WAIT_SLICE_MS = 100
COMPLETER_SLICE_MS = 50


class HorovodInternalError(RuntimeError):
    """A collective failed (mismatch across ranks, a lost rank, a stall or
    deadlock abort, shutdown): the message is gradsync's and names the
    tensor, the ranks and what to do."""


class _State:
    def __init__(self):
        self.ctx = None
        self.rank = self.size = self.local_rank = self.local_size = -1
        self.counter = itertools.count()


_state = _State()
_mu = threading.Lock()


def ctx():
    if _state.ctx is None:
        raise ValueError(
            "gradsync has not been initialized; run gradsync.torch.init() (hvd.init()) first")
    return _state.ctx


def next_id():
    return next(_state.counter)


def last_error():
    return _lib.error_text(lib.gs_last_error(_state.ctx))


def raise_if_forked(st, call):
    """st of a gs_test or wait: GS_ERR_FORKED (this process is a fork of the
    one that called init(), and the op was pending at the fork) raises the
    library's text at once, naming the Python call that waited."""
    if st == _lib.GS_ERR_FORKED:
        msg = last_error()
        head, sep, rest = msg.partition(" ")
        raise HorovodInternalError(call + sep + rest if head.endswith("()") else msg)


def raise_submit_error(st, what):
    """An error returned at the call: bad arguments and duplicate names are
    ValueError (as Horovod's), the job's failure HorovodInternalError."""
    msg = last_error() or _lib.text(lib.gs_status_str(st))
    if st in (_lib.GS_ERR_INVALID_ARG, _lib.GS_ERR_DUPLICATE_NAME):
        raise ValueError(msg)
    if st == _lib.GS_ERR_UNSUPPORTED:
        raise NotImplementedError(msg)
    raise HorovodInternalError(msg)


class _Op:
    """One user-visible async op: C handles, the tensors kept alive, and a
    finish step that builds the result once every C handle completed."""

    __slots__ = ("handles", "keep", "finish", "name", "lock", "event", "result", "error",
                 "finished", "callbacks", "pins", "released", "freed", "__weakref__")

    def __init__(self, handles, keep, finish, name):
        self.handles = handles  # list of c_void_p values (ints)
        self.keep = keep
        self.finish = finish
        self.name = name
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.result = None
        self.error = None
        self.finished = False
        self.callbacks = []
        self.pins = 0
        self.released = False
        self.freed = False

    def all_done(self, passive, call="poll()"):
        """Every C handle completed. passive (the completer): the check does
        not count as the application waiting on the op; otherwise (poll,
        synchronize) it does, as gs_test, and in a forked child raises
        naming call."""
        if passive:
            for h in self.handles:
                one = (ctypes.c_void_p * 1)(h)
                idx = ctypes.c_size_t(1)
                lib.gs_wait_any_passive(one, 1, 0, ctypes.byref(idx))
                if idx.value != 0:
                    return False
            return True
        done = ctypes.c_int(0)
        for h in self.handles:
            raise_if_forked(lib.gs_test(h, ctypes.byref(done)), call)
            if not done.value:
                return False
        return True

    def try_complete(self, passive=False, call="poll()"):
        """Finishes the op if every C handle completed; True when finished.
        The caller has the op pinned."""
        if self.finished:
            return True
        if not self.all_done(passive, call):
            return False
        with self.lock:
            if self.finished:
                return True
            err = None
            for h in self.handles:
                st = lib.gs_wait(h, 0)
                if st != _lib.GS_OK:
                    msg = (_lib.error_text(lib.gs_handle_error(h))
                           or _lib.text(lib.gs_status_str(st)))
                    err = HorovodInternalError(msg)
                    break
            if err is None:
                try:
                    self.result = self.finish(self.handles) if self.finish else None
                except BaseException as e:  # surfaced on the waiting thread
                    err = e
            self.error = err
            self.finished = True
            callbacks, self.callbacks = self.callbacks, []
        self.event.set()
        for cb in callbacks:
            cb(self)
        return True

    def add_callback(self, cb):
        """cb(op) runs once the op finished (at once if it already has), on
        the completer thread or the thread that finished it."""
        with self.lock:
            if not self.finished:
                self.callbacks.append(cb)
                return
        cb(self)


def _free_locked(op):
    if op.freed:
        return
    op.freed = True
    for h in op.handles:
        lib.gs_handle_free(h)
    op.keep = None


def pin(ops):
    with _mu:
        for op in ops:
            op.pins += 1


def unpin(ops):
    with _mu:
        for op in ops:
            op.pins -= 1
            if op.pins == 0 and op.released:
                _free_locked(op)


def release(op):
    """The user is done with op: free its C handles once no wait holds them."""
    with _mu:
        op.released = True
        if op.pins == 0:
            _free_locked(op)


class _Completer:
    def __init__(self):
        self.cv = threading.Condition()
        self.live = []
        self.running = True
        self.thread = threading.Thread(target=self.run, name="gradsync-completer", daemon=True)
        self.thread.start()

    def add(self, op):
        with self.cv:
            self.live.append(op)
            self.cv.notify()

    def stop(self):
        with self.cv:
            self.running = False
            self.cv.notify()
        self.thread.join(timeout=5)

    def run(self):
        idx = ctypes.c_size_t(0)
        while True:
            with self.cv:
                self.live = [op for op in self.live if not op.finished]
                while self.running and not self.live:
                    self.cv.wait(1.0)
                if not self.running:
                    return
                ops = list(self.live)
            pin(ops)
            try:
                # Passive: only the application's own waits (synchronize,
                # poll) make this rank look blocked to deadlock detection;
                # ops it submitted and computes past are not waited on.
                pending = [h for op in ops if not op.finished for h in op.handles]
                if pending:
                    arr = (ctypes.c_void_p * len(pending))(*pending)
                    lib.gs_wait_any_passive(arr, len(pending), COMPLETER_SLICE_MS,
                                            ctypes.byref(idx))
                # An op with callbacks (the DDP hook's futures) is waited on
                # by the application through torch, where we cannot see it:
                # testing it here counts as that wait (as gs_test polling).
                for op in ops:
                    op.try_complete(passive=not op.callbacks)
            finally:
                unpin(ops)
            # ops only the completer finishes (callbacks, fire-and-forget)
            # are released by their callbacks.


_completer = None


def submit(handles, keep, finish, name, callback=None):
    """Registers the C handles of a new op with the completer."""
    op = _Op(handles, keep, finish, name)
    if callback is not None:
        op.callbacks.append(callback)
    _completer.add(op)
    return op


def wait(op):
    """Blocks until op finished, in bounded slices; returns its result or
    raises its error. Does not release the op."""
    pin([op])
    try:
        while not op.try_complete(call="synchronize()"):
            for h in op.handles:
                done = ctypes.c_int(0)
                raise_if_forked(lib.gs_test(h, ctypes.byref(done)), "synchronize()")
                if not done.value:
                    lib.gs_wait(h, WAIT_SLICE_MS)
                    break
    finally:
        unpin([op])
    if op.error is not None:
        raise op.error
    return op.result


def initialized():
    return _state.ctx is not None


def init_ctx():
    global _completer
    if _state.ctx is not None:
        return
    opts = _lib.options()
    c = ctypes.c_void_p()
    st = lib.gs_init(ctypes.byref(opts), ctypes.byref(c))
    if st != _lib.GS_OK:
        msg = _lib.error_text(lib.gs_last_error(None)) or _lib.text(lib.gs_status_str(st))
        if st == _lib.GS_ERR_INVALID_ARG:
            raise ValueError(msg)
        raise HorovodInternalError(msg)
    _state.ctx = c.value
    _state.rank = lib.gs_rank(c)
    _state.size = lib.gs_size(c)
    _state.local_rank = lib.gs_local_rank(c)
    _state.local_size = lib.gs_local_size(c)
    _completer = _Completer()


def shutdown_ctx():
    global _completer
    if _state.ctx is None:
        return
    c = _state.ctx
    ops = []
    # The completer waits inside the library: stop it before the context
    # goes (it leaves its wait within one slice).
    if _completer is not None:
        with _completer.cv:
            ops = list(_completer.live)
        _completer.stop()
        _completer = None
    # gs_shutdown completes every pending op with GS_ERR_SHUTDOWN; completed
    # handles stay readable without the context, so the ops left are
    # finished here (their futures and waiters get the error).
    lib.gs_shutdown(c)
    _state.ctx = None
    for op in ops:
        op.try_complete(passive=True)
    # Every persistent op is inactive now: free the ones still alive (their
    # objects' free() and finalizers are no-ops afterwards).
    from . import persistent
    persistent.free_all()


def _at_exit():
    # The process is ending: leave the job cleanly so that the other ranks
    # are told this rank left rather than lost.
    if _state.ctx is not None and os.getpid() == _init_pid[0]:
        shutdown_ctx()


def _after_fork_in_child():
    # This process is a fork of the one that called init(): none of its
    # other threads exist here, and one of them may have held _mu (the
    # completer pins ops under it) or the completer's lock.
    global _mu, _completer
    _mu = threading.Lock()
    _completer = None


_init_pid = [os.getpid()]
atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
