"""Horovod's PyTorch API over gradsync: `import gradsync.torch as hvd` runs a
Horovod training script unchanged (docs/pytorch.md lists the differences).

Collectives, DistributedOptimizer, broadcast_parameters /
broadcast_optimizer_state / broadcast_object / allgather_object, and the
DDP pieces (allreduce_hook, init_process_group, GradsyncStore), and
persistent allreduces of CPU tensors (allreduce_init, startall).
"""

import torch  # noqa: F401  (fail early with torch's own ImportError)

from ._core import HorovodInternalError
from .compression import Compression
from .ddp import GradsyncStore, allreduce_hook, init_process_group
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters, is_local_parameter, register_local_parameter)
from .mpi_ops import (Adasum, Average, Max, Min, ProcessSet, Product, Sum, add_process_set,
                      allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                      allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
                      broadcast_, broadcast_async, broadcast_async_, ccl_built, cross_rank,
                      cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                      global_process_set, grouped_allgather, grouped_allgather_async,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                      grouped_allreduce_async_, grouped_reducescatter,
                      grouped_reducescatter_async, init, is_homogeneous, is_initialized, join,
                      local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                      nccl_built, poll, rank, reducescatter, reducescatter_async,
                      remove_process_set, rocm_built, shutdown, size, sparse_allreduce_async,
                      start_timeline, stop_timeline, synchronize)
from .optimizer import DistributedOptimizer
from .persistent import PersistentAllreduce, allreduce_init, startall

__all__ = [n for n in dir() if not n.startswith("_") and n != "torch"]
