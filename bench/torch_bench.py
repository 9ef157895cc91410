"""Benchmarks of gradsync.torch, side by side in one run (run under
gradsync-run; see bench/torch_bench.sh):

1. per-op overhead: microseconds per small synchronous allreduce through
   the C API called directly (ctypes: gs_allreduce_async + gs_wait +
   gs_handle_free on preallocated buffers) vs hvd.allreduce_ (in place) vs
   hvd.allreduce (autograd function, new output tensor);
2. step time of a small MLP: DistributedOptimizer over gradsync, DDP with
   gradsync's allreduce_hook, and PyTorch's own DDP over Gloo (the same
   process group, created over gradsync's kv store).

Methods alternate in rounds so that machine noise hits them alike; each
figure is the median over rounds of the per-round mean. Rank 0 prints a
markdown table.
"""

import argparse
import ctypes
import statistics
import time

import torch
import torch.nn as nn

import gradsync.torch as hvd
from gradsync import _lib

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=15)
p.add_argument("--ops", type=int, default=200, help="small allreduces per round and method")
p.add_argument("--elems", type=int, default=16)
p.add_argument("--steps", type=int, default=10, help="training steps per round and method")
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--batch", type=int, default=32)
args = p.parse_args()

torch.set_num_threads(1)
hvd.init()
hvd.init_process_group()
lib, ctx = _lib.lib, hvd._core._state.ctx


def c_api_ops(buf, n):
    h = ctypes.c_void_p()
    ptr = buf.data_ptr()
    for i in range(n):
        st = lib.gs_allreduce_async(ctx, b"bench.c", ptr, ptr, buf.numel(), _lib.GS_FLOAT32,
                                    _lib.GS_SUM, None, ctypes.byref(h))
        assert st == 0, hvd._core.last_error()
        assert lib.gs_wait(h, -1) == 0
        lib.gs_handle_free(h)


def inplace_ops(buf, n):
    for i in range(n):
        hvd.allreduce_(buf, name="bench.inplace", op=hvd.Sum)


def autograd_ops(buf, n):
    for i in range(n):
        hvd.allreduce(buf, name="bench.autograd", op=hvd.Sum)


def timed(fn, *a):
    hvd.barrier()
    t0 = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t0


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                         nn.ReLU(), nn.Linear(args.hidden, 10))


data = [(torch.randn(args.batch, 128), torch.randint(0, 10, (args.batch,))) for _ in range(4)]


def train(model, opt, n):
    for i in range(n):
        x, y = data[i % len(data)]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


m_opt = mlp()
o_opt = hvd.DistributedOptimizer(torch.optim.SGD(m_opt.parameters(), lr=0.01),
                                 named_parameters=m_opt.named_parameters())
m_hook = nn.parallel.DistributedDataParallel(mlp())
m_hook.register_comm_hook(m_hook, hvd.allreduce_hook)
o_hook = torch.optim.SGD(m_hook.parameters(), lr=0.01)
m_gloo = nn.parallel.DistributedDataParallel(mlp())
o_gloo = torch.optim.SGD(m_gloo.parameters(), lr=0.01)
nparams = sum(q.numel() for q in m_opt.parameters())

ops = {"C API (ctypes)": c_api_ops, "hvd.allreduce_": inplace_ops,
       "hvd.allreduce": autograd_ops}
steps = {"DistributedOptimizer (gradsync)": (m_opt, o_opt),
         "DDP + allreduce_hook (gradsync)": (m_hook, o_hook),
         "DDP over Gloo (PyTorch)": (m_gloo, o_gloo)}
res = {k: [] for k in list(ops) + list(steps)}
buf = torch.ones(args.elems)
for k, fn in ops.items():  # warm-up: caches, connections, DDP bucket rebuild
    timed(fn, buf, 20)
for k, (m, o) in steps.items():
    timed(train, m, o, 3)
for r in range(args.rounds):
    for k, fn in ops.items():
        res[k].append(timed(fn, buf, args.ops) / args.ops * 1e6)
    for k, (m, o) in steps.items():
        res[k].append(timed(train, m, o, args.steps) / args.steps * 1e3)

med = {k: statistics.median(v) for k, v in res.items()}
if hvd.rank() == 0:
    print("ranks %d, %d rounds; small allreduce of %d float32; MLP of %d parameters, batch %d"
          % (hvd.size(), args.rounds, args.elems, nparams, args.batch))
    print()
    print("| per-op overhead | µs per allreduce (median) | ratio to the C API |")
    print("|---|---|---|")
    base = med["C API (ctypes)"]
    for k in ops:
        print("| %s | %.1f | %.2f |" % (k, med[k], med[k] / base))
    print()
    print("| training step (MLP) | ms per step (median) | ratio to DDP over Gloo |")
    print("|---|---|---|")
    base = med["DDP over Gloo (PyTorch)"]
    for k in steps:
        print("| %s | %.2f | %.2f |" % (k, med[k], med[k] / base))
hvd.shutdown()
