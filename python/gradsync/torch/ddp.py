"""PyTorch DistributedDataParallel over gradsync.

- GradsyncStore: a torch.distributed.Store backed by the job's kv store at
  the coordinator (gs_kv_set/gs_kv_get): the rendezvous of the process
  group rides the job's authenticated channel; no MASTER_ADDR, no port of
  its own.
- init_process_group(): torch.distributed's default group (Gloo) over that
  store, with gradsync's rank and size.
- allreduce_hook: a DDP communication hook that averages each gradient
  bucket through gradsync (fusion, ordering, stall and deadlock reports),
  completing DDP's future from the completer thread; a failed collective
  becomes an exception raised from backward().

torch 1.13 facts this relies on (checked): a Python subclass of
torch.distributed.Store is accepted by ProcessGroupGloo and
init_process_group(store=...); the store only needs set/get/wait/add/check
for Gloo's rendezvous and the store-based barrier; compare_set, delete_key
and num_keys are not used by them.
"""

import ctypes
import datetime
import hashlib
import time

import torch
import torch.distributed as dist

from .. import _lib
from .._lib import lib
from . import _core
from .mpi_ops import Average, _handle_map, allreduce_async_, rank, size

_SLICE_MS = 1000


class GradsyncStore(dist.Store):
    """A torch.distributed.Store over gradsync's kv store. Keys live in the
    job's application namespace under `prefix`/. get() and wait() wait in
    bounded slices up to the store's timeout, then raise."""

    def __init__(self, prefix="torch", timeout=datetime.timedelta(seconds=300)):
        super().__init__()
        _core.ctx()
        self._prefix = prefix
        self._timeout_s = timeout.total_seconds()
        self._adds = {}

    def _key(self, key):
        return ("%s/%s" % (self._prefix, key)).encode()

    def set(self, key, value):
        """Sets key to value (bytes, or a str stored UTF-8 encoded) in the
        job's kv store, replacing any earlier value. Raises RuntimeError with
        gradsync's message when the coordinator refuses it or is lost."""
        if isinstance(value, str):
            value = value.encode()
        value = bytes(value)
        buf = ctypes.create_string_buffer(value, len(value))
        st = lib.gs_kv_set(_core.ctx(), self._key(key), buf, len(value))
        if st != _lib.GS_OK:
            raise RuntimeError("gradsync store: set '%s': %s" % (key, _core.last_error()))

    def _get(self, key, wait_ms):
        v = ctypes.c_void_p()
        n = ctypes.c_size_t()
        st = lib.gs_kv_get(_core.ctx(), self._key(key), wait_ms, ctypes.byref(v),
                           ctypes.byref(n))
        if st == _lib.GS_ERR_TIMEOUT:
            return None
        if st != _lib.GS_OK:
            raise RuntimeError("gradsync store: get '%s': %s" % (key, _core.last_error()))
        try:
            return ctypes.string_at(v.value, n.value)
        finally:
            lib.gs_free(v)

    def get(self, key):
        """The bytes set for key by any rank, waiting in bounded slices up
        to the store's timeout for a rank to set it. Raises RuntimeError
        naming the key, this rank and the timeout when nobody set it in
        time, or with gradsync's message when the job failed."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            left = deadline - time.monotonic()
            val = self._get(key, max(0, min(_SLICE_MS, int(left * 1000))))
            if val is not None:
                return val
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    "gradsync store: key '%s' was not set within %.0f s (rank %d of %d); a rank "
                    "of the process group did not get this far: check the other ranks' output"
                    % (key, self._timeout_s, rank(), size()))

    def add(self, key, amount):
        """Adds amount to the counter key and returns its value: the sum of
        what every rank added so far (this rank's adds always included,
        other ranks' as far as they have landed; exact once all landed).
        Raises RuntimeError as set()."""
        # A counter without an atomic add at the coordinator: each rank
        # publishes its own running total, and the value is the sum of all
        # ranks' totals. Monotonic and exact once every rank's adds landed,
        # which is what the store-based barrier (add(key, 0) until it equals
        # the world size) needs.
        own = self._adds.get(key, 0) + int(amount)
        self._adds[key] = own
        self.set("%s/add/%d" % (key, rank()), str(own))
        total = 0
        for r in range(size()):
            v = self._get("%s/add/%d" % (key, r), 0)
            if v is not None:
                total += int(v)
        return total

    def wait(self, keys, timeout=None):
        """Returns once every key of keys is set; each key waits up to the
        store's timeout (the timeout argument is not used) and raises
        RuntimeError as get() when it is not set in time."""
        for k in keys:
            self.get(k)

    def check(self, keys):
        """True when every key of keys is set now; never waits."""
        return all(self._get(k, 0) is not None for k in keys)

    def compare_set(self, key, expected, desired):
        """Not supported (the coordinator's kv store has no atomic
        compare-and-set): always raises NotImplementedError."""
        raise NotImplementedError("gradsync store: compare_set is not supported (the "
                                  "coordinator's kv store has no atomic compare-and-set)")

    def delete_key(self, key):
        """The kv store cannot delete keys: deletes nothing and returns
        False."""
        return False

    def num_keys(self):
        """Not supported: always raises NotImplementedError."""
        raise NotImplementedError("gradsync store: num_keys is not supported")


def init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=120), **kwargs):
    """torch.distributed.init_process_group with gradsync's rank and size,
    rendezvous through the job's kv store (call hvd.init() first). Returns
    the store."""
    if backend != "gloo":
        raise ValueError("gradsync.torch.init_process_group: backend %r: only 'gloo' is "
                         "supported (gradients go through gradsync; the group only carries "
                         "DDP's set-up broadcasts)" % (backend,))
    store = GradsyncStore(timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank(), world_size=size(),
                            timeout=timeout, **kwargs)
    return store


def _bucket_name(state, bucket):
    params = bucket.parameters()
    names = None
    if isinstance(state, torch.nn.Module):
        cache = getattr(state, "_gs_param_names", None)
        if cache is None:
            cache = {p: n for n, p in state.named_parameters()}
            state._gs_param_names = cache
        names = [cache.get(p) for p in params]
        if any(n is None for n in names):
            names = None
    # The parameters' names (or shapes) and count name the bucket: the same
    # on every rank, the same every step, and a new name once DDP rebuilds
    # its buckets with other contents.
    key = ",".join(names) if names else ";".join(
        "x".join(str(d) for d in p.shape) for p in params)
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    if names:
        label = names[0] if len(names) == 1 else "%s..%s" % (names[0], names[-1])
        return "ddp.bucket%d[%s](%s)" % (bucket.index(), label, digest)
    return "ddp.bucket%d(%d params,%s)" % (bucket.index(), len(params), digest)


def allreduce_hook(state, bucket):
    """DDP communication hook: averages the bucket over all ranks through
    gradsync. Register with model.register_comm_hook(model, allreduce_hook)
    (the model as state names buckets after their parameters in error
    messages; None works too)."""
    tensor = bucket.buffer()
    fut = torch.futures.Future()
    hid = allreduce_async_(tensor, name=_bucket_name(state, bucket), op=Average)
    op = _handle_map.pop(hid)

    def done(o):
        try:
            # an exception travels as the value and is raised in the
            # continuation below, which errors DDP's future with its message
            fut.set_result(o.error if o.error is not None else tensor)
        finally:
            _core.release(o)
    op.add_callback(done)
    return fut.then(_raise_or_tensor)


def _raise_or_tensor(fut):
    v = fut.value()
    if isinstance(v, BaseException):
        raise v
    return v
