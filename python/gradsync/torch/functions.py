"""Horovod's helpers over the collectives: broadcasting parameters,
optimizer state and Python objects, gathering objects, and gradsync's
local (model-parallel) parameters."""

import io
import pickle
import weakref

import torch

from . import _core
from .mpi_ops import (_check_ps, allgather, broadcast_, broadcast_async_, global_process_set,
                      rank, synchronize)

# Parameters registered local (model parallel), by identity.
_local = weakref.WeakValueDictionary()


def register_local_parameter(p):
    """Marks p as local to this rank (model parallel): its gradient never
    leaves the rank, DistributedOptimizer scales it by 1/size as for a
    global average (Horovod's scale_local_gradients), and
    broadcast_parameters leaves it untouched."""
    if not isinstance(p, torch.Tensor):
        raise ValueError("register_local_parameter expects a tensor (a parameter), got %s"
                         % type(p).__name__)
    _local[id(p)] = p


def is_local_parameter(p):
    """True when p itself (by identity, not by value) was registered local to
    this rank, with register_local_parameter() or DistributedOptimizer's
    local_parameters; such parameters are never communicated."""
    return _local.get(id(p)) is p


def broadcast_parameters(params, root_rank, prefix=None):
    """Broadcasts params (a state_dict, named_parameters() or a list of
    tensors / (name, tensor) pairs) from root_rank in place. Parameters
    registered local are skipped."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        # generators such as model.named_parameters()
        try:
            params = [p if isinstance(p, tuple) else (None, p) for p in params]
        except TypeError:
            raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in params:
        if not isinstance(p, torch.Tensor):
            continue
        if is_local_parameter(p):
            continue
        if name is not None and prefix is not None:
            name = prefix + name
        t = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(broadcast_async_(t, root_rank, name))
    for h in handles:
        synchronize(h)


def _to_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    return buf.getvalue()


def _from_bytes(b):
    return torch.load(io.BytesIO(b), map_location="cpu")


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Serializes obj on root_rank and returns a copy of it on every rank."""
    _check_ps(process_set)
    name = name or type(obj).__name__
    if rank() == root_rank:
        b = _to_bytes(obj)
        t = torch.frombuffer(bytearray(b), dtype=torch.uint8) if b else \
            torch.empty(0, dtype=torch.uint8)
        sz = torch.tensor([t.numel()], dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
    else:
        sz = torch.tensor([0], dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
        t = torch.empty(int(sz.item()), dtype=torch.uint8)
    broadcast_(t, root_rank, name + ".t", process_set)
    if rank() == root_rank:
        return obj
    return _from_bytes(t.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's obj, in rank order."""
    _check_ps(process_set)
    name = name or type(obj).__name__
    b = _to_bytes(obj)
    t = torch.frombuffer(bytearray(b), dtype=torch.uint8) if b else \
        torch.empty(0, dtype=torch.uint8)
    sizes = allgather(torch.tensor([t.numel()], dtype=torch.int64), name=name + ".sz",
                      process_set=process_set)
    data = allgather(t, name=name + ".t", process_set=process_set)
    out, at = [], 0
    raw = data.numpy().tobytes()
    for s in sizes.tolist():
        out.append(_from_bytes(raw[at:at + s]))
        at += s
    return out


def broadcast_optimizer_state(optimizer, root_rank, prefix="Parameter.", model=None):
    """Makes every rank's optimizer state (per-parameter state such as
    momentum buffers, and the param groups' options such as lr) equal to
    root_rank's. Tensors are copied into the existing state in place where
    shapes agree."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    _core.ctx()
    state = optimizer.state_dict() if rank() == root_rank else None
    state = broadcast_object(state, root_rank, name=prefix + "optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)
