"""The rank side of the Python tests: run as `ranks.py MODE` on every rank
under gradsync-run (tests/python/test_*.py start it). Each mode checks its
results on every rank against references computed locally with torch, prints
"<mode>: ... ok" and exits 0, or prints what differed and exits 1."""

import ctypes
import datetime
import os
import sys
import time
import traceback

import torch
import torch.nn as nn

import gradsync.torch as hvd
from gradsync._lib import lib

torch.set_num_threads(1)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: %s" % what, flush=True)


def same(a, b, what):
    ok = a.dtype == b.dtype and list(a.shape) == list(b.shape) and torch.equal(a, b)
    check(ok, "%s: got %s %s %s, want %s %s %s" % (what, a.dtype, list(a.shape), a.flatten()[:8],
                                                   b.dtype, list(b.shape), b.flatten()[:8]))


# ---- collectives x dtypes ------------------------------------------------------

REDUCE_DT = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
             torch.int64]
MOVE_DT = REDUCE_DT + [torch.uint8, torch.int8, torch.int16]


def inp(r, dt, shape, seed, op=hvd.Sum):
    """Rank r's input: small integers (exact sums in every dtype);
    {-1, 1, 2} for products; non-negative for uint8."""
    g = torch.Generator().manual_seed(1000 * seed + r)
    if op == hvd.Product:
        v = torch.tensor([-1, 1, 2])[torch.randint(0, 3, shape, generator=g)]
    elif dt == torch.uint8:
        v = torch.randint(0, 40, shape, generator=g)
    else:
        v = torch.randint(-20, 21, shape, generator=g)
    return v.to(dt)


def hscale(t, f):
    """Horovod's ScaleBuffer, written independently: float types multiply by
    the factor rounded to float32 (float64: double), integers in double then
    truncated."""
    if f == 1.0:
        return t.clone()
    if t.dtype == torch.float64:
        return t * f
    if t.dtype.is_floating_point:
        return (t.float() * torch.tensor(f, dtype=torch.float32)).to(t.dtype)
    return torch.trunc(t.double() * f).to(t.dtype)


def ref_allreduce(n, dt, shape, seed, op, pre=1.0, post=1.0):
    xs = [hscale(inp(r, dt, shape, seed, op), pre) for r in range(n)]
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in (hvd.Sum, hvd.Average):
            acc = (acc.double() + x.double()).to(dt) if dt.is_floating_point else acc + x
        elif op == hvd.Min:
            acc = torch.minimum(acc, x)
        elif op == hvd.Max:
            acc = torch.maximum(acc, x)
        elif op == hvd.Product:
            acc = acc * x
    if op == hvd.Average:
        post = post / n
    return hscale(acc, post)


def mode_collectives():
    n, r = hvd.size(), hvd.rank()
    shape = [3, 5]
    count = 0
    for seed, dt in enumerate(REDUCE_DT):
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            x = inp(r, dt, shape, seed, op)
            name = "ar.%s.%d" % (dt, op)
            same(hvd.allreduce(x, name=name, op=op), ref_allreduce(n, dt, shape, seed, op),
                 "allreduce %s op %d" % (dt, op))
            y = x.clone()
            hvd.allreduce_(y, name=name + ".inplace", op=op)
            same(y, ref_allreduce(n, dt, shape, seed, op), "allreduce_ %s op %d" % (dt, op))
            count += 2
        # Prescaled inputs stay exact (powers of two; integers truncate per
        # element), so only the scaling arithmetic decides the result.
        scales = [(0.5, 3.0), (2.0, 1.0 / 3.0), (0.25, 0.7)]
        if not dt.is_floating_point:
            scales.append((1.0 / 3.0, 0.7))
        for pre, post in scales:
            for op in (hvd.Sum, hvd.Average):
                x = inp(r, dt, shape, seed)
                h = hvd.allreduce_async(x, name="sc.%s.%d.%g.%g" % (dt, op, pre, post), op=op,
                                        prescale_factor=pre, postscale_factor=post)
                got = hvd.synchronize(h)
                same(got, ref_allreduce(n, dt, shape, seed, op, pre, post),
                     "allreduce %s op %d prescale %g postscale %g" % (dt, op, pre, post))
                same(x, inp(r, dt, shape, seed), "allreduce_async left its input untouched")
                count += 1
        # grouped
        xs = [inp(r, dt, [4], seed * 10 + k) for k in range(3)]
        got = hvd.grouped_allreduce(xs, name="grp.%s" % dt)
        for k in range(3):
            same(got[k], ref_allreduce(n, dt, [4], seed * 10 + k, hvd.Average),
                 "grouped_allreduce %s [%d]" % (dt, k))
        ys = [x.clone() for x in xs]
        hvd.synchronize(hvd.grouped_allreduce_async_(ys, name="grp_.%s" % dt, op=hvd.Sum))
        for k in range(3):
            same(ys[k], ref_allreduce(n, dt, [4], seed * 10 + k, hvd.Sum),
                 "grouped_allreduce_async_ %s [%d]" % (dt, k))
        hvd.grouped_allreduce_(ys, name="grp__.%s" % dt, op=hvd.Max)
        count += 7
        # reducescatter: 7 rows over n ranks, lower ranks get the extra rows
        for op in (hvd.Sum, hvd.Average):
            x = inp(r, dt, [7, 2], seed + 50)
            full = ref_allreduce(n, dt, [7, 2], seed + 50, op)
            rows = [7 // n + (1 if q < 7 % n else 0) for q in range(n)]
            start = sum(rows[:r])
            same(hvd.reducescatter(x, name="rs.%s.%d" % (dt, op), op=op),
                 full[start:start + rows[r]], "reducescatter %s op %d" % (dt, op))
            count += 1
        outs = hvd.grouped_reducescatter([inp(r, dt, [n, 3], seed + 60)], name="grs.%s" % dt,
                                         op=hvd.Sum)
        same(outs[0], ref_allreduce(n, dt, [n, 3], seed + 60, hvd.Sum)[r:r + 1],
             "grouped_reducescatter %s" % dt)
        count += 1
    for dt in (torch.int8, torch.uint8, torch.int16, torch.bool):
        try:
            hvd.allreduce(torch.zeros(2, dtype=dt), name="bad.%s" % dt)
            check(False, "allreduce on %s must raise ValueError (as Horovod)" % dt)
        except ValueError as e:
            check("not supported" in str(e), "allreduce %s: message %r" % (dt, str(e)))
    for seed, dt in enumerate(MOVE_DT):
        # allgather: rank q contributes q rows (rank 0 none)
        x = inp(r, dt, [r, 3], seed + 100)
        want = torch.cat([inp(q, dt, [q, 3], seed + 100) for q in range(n)])
        same(hvd.allgather(x, name="ag.%s" % dt), want, "allgather %s" % dt)
        g = hvd.grouped_allgather([x, x[:, :1].contiguous()], name="gag.%s" % dt)
        same(g[0], want, "grouped_allgather %s [0]" % dt)
        same(g[1], want[:, :1], "grouped_allgather %s [1]" % dt)
        # broadcast from the last rank, four ways
        root = n - 1
        x = inp(r, dt, [2, 3], seed + 200)
        want = inp(root, dt, [2, 3], seed + 200)
        same(hvd.broadcast(x, root, name="bc.%s" % dt), want, "broadcast %s" % dt)
        same(x, inp(r, dt, [2, 3], seed + 200), "broadcast left its input untouched")
        same(hvd.synchronize(hvd.broadcast_async(x, root, name="bca.%s" % dt)), want,
             "broadcast_async %s" % dt)
        y = x.clone()
        hvd.broadcast_(y, root, name="bc_.%s" % dt)
        same(y, want, "broadcast_ %s" % dt)
        y = x.clone()
        hvd.synchronize(hvd.broadcast_async_(y, root, name="bca_.%s" % dt))
        same(y, want, "broadcast_async_ %s" % dt)
        # alltoall: equal parts, then rank r sends q+1 rows to rank q
        x = inp(r, dt, [2 * n, 2], seed + 300)
        want = torch.cat([inp(q, dt, [2 * n, 2], seed + 300)[2 * r:2 * r + 2] for q in range(n)])
        same(hvd.alltoall(x, name="a2a.%s" % dt), want, "alltoall %s" % dt)
        rows = sum(q + 1 for q in range(n))
        x = inp(r, dt, [rows, 2], seed + 400)
        splits = torch.tensor([q + 1 for q in range(n)], dtype=torch.int32)
        off = sum(q + 1 for q in range(r))
        want = torch.cat([inp(q, dt, [rows, 2], seed + 400)[off:off + r + 1] for q in range(n)])
        out, recv = hvd.alltoall(x, splits=splits, name="a2as.%s" % dt)
        same(out, want, "alltoall with splits %s" % dt)
        same(recv, torch.full([n], r + 1, dtype=torch.int32), "alltoall received splits %s" % dt)
        count += 8
    # results of no bytes (gs_handle_result_copy of 0 bytes): an allgather
    # of 0 rows everywhere, and reducescatter shares of 0 rows (1 row over n
    # ranks: only rank 0 gets it)
    same(hvd.allgather(torch.zeros(0, 3), name="ag.empty"), torch.zeros(0, 3),
         "allgather of 0 rows on every rank")
    x = torch.tensor([[1.0, 2.0]]) * (r + 1)
    want = torch.tensor([[1.0, 2.0]]) * sum(q + 1 for q in range(n))
    same(hvd.reducescatter(x, name="rs.one-row", op=hvd.Sum), want if r == 0 else want[:0],
         "reducescatter of 1 row over %d ranks" % n)
    count += 2
    # poll() is False until the op completed: rank 1 submits only after
    # rank 0 has polled (told through the job's kv store)
    store = hvd.GradsyncStore(prefix="test-poll")
    x = torch.ones(3)
    if r == 0:
        h = hvd.allreduce_async(x, name="poll")
        check(hvd.poll(h) is False, "poll() must be False before every rank submitted")
        store.set("polled", b"1")
    else:
        store.get("polled")
        h = hvd.allreduce_async(x, name="poll")
    same(hvd.synchronize(h), torch.ones(3), "allreduce after poll")
    check(hvd.poll(h) is True, "poll() of a synchronized handle")
    # the job's kv store (gs_kv_set/gs_kv_get) through GradsyncStore
    kv = hvd.GradsyncStore(prefix="kvtest", timeout=datetime.timedelta(seconds=1))
    kv.set("bin/%d" % r, bytes(range(256)) * 3)
    check(kv.get("bin/%d" % ((r + 1) % n)) == bytes(range(256)) * 3,
          "kv: another rank's binary value")
    kv.set("empty/%d" % r, b"")
    check(kv.get("empty/%d" % r) == b"", "kv: an empty value")
    check(kv.add("counter", 2) >= 2 and kv.check(["bin/%d" % r]) and not kv.check(["never"]),
          "kv: add and check")
    try:
        kv.get("never")
        check(False, "kv: get of a key never set must time out")
    except RuntimeError as e:
        check("'never' was not set within 1 s" in str(e), "kv timeout message: %r" % str(e))
    v, ln = ctypes.c_void_p(), ctypes.c_size_t()
    check(lib.gs_kv_set(hvd._core._state.ctx, b"", None, 0) == 1 and
          "key is NULL or empty" in hvd._core.last_error(), "kv: empty key refused")
    check(lib.gs_kv_set(hvd._core._state.ctx, b"k" * 449, None, 0) == 1 and
          "GS_KV_KEY_MAX" in hvd._core.last_error(), "kv: over-long key refused")
    check(lib.gs_kv_get(hvd._core._state.ctx, b"k", 60001, ctypes.byref(v), ctypes.byref(ln))
          == 1 and v.value is None, "kv: wait over GS_KV_WAIT_MAX_MS refused")
    # duplicate in-flight name and bad alltoall splits: ValueError at the call
    # (each rank in turn holds 'dup.<q>' in flight: the others submit it
    # only after rank q tried the duplicate)
    for q in range(n):
        if r == q:
            h = hvd.allreduce_async(torch.ones(2), name="dup.%d" % q)
            try:
                hvd.allreduce_async(torch.ones(2), name="dup.%d" % q)
                check(False, "a duplicate in-flight name must raise ValueError")
            except ValueError as e:
                check(str(e) == "tensor 'allreduce.dup.%d': rank %d already has an op of this "
                      "name in flight; wait for it to complete (synchronize() its handle, or "
                      "wait() of a persistent op) before submitting the name again, or use "
                      "another name" % (q, q), "duplicate-name message: %r" % str(e))
            store.set("dup/%d" % q, b"1")
        else:
            store.get("dup/%d" % q)
            h = hvd.allreduce_async(torch.ones(2), name="dup.%d" % q)
        same(hvd.synchronize(h), torch.ones(2), "the first op of a duplicated name")
    for bad in ([1] * (n + 1), [-1] + [2] * (n - 1), [5] * n):
        try:
            hvd.alltoall(torch.zeros(2 * n, 2), splits=bad, name="bad-split")
            check(False, "alltoall splits %s must raise ValueError" % bad)
        except ValueError as e:
            check("split" in str(e), "bad split message: %r" % str(e))
    try:
        hvd.allreduce(torch.ones(2), name="adasum", op=hvd.Adasum)
        check(False, "Adasum must raise")
    except NotImplementedError as e:
        check("Adasum" in str(e), "Adasum message: %r" % str(e))
    # compression, autograd
    x = inp(r, torch.float32, [6], 7) / 4
    got = hvd.allreduce(x, name="fp16", compression=hvd.Compression.fp16)
    want = hscale(sum(hscale(inp(q, torch.float32, [6], 7) / 4, 1.0).half().float()
                      for q in range(n)).half(), 1.0 / n).float()
    same(got, want, "allreduce with Compression.fp16")
    c, ctx = hvd.Compression.fp16.compress(torch.ones(2))
    check(c.dtype == torch.float16 and hvd.Compression.fp16.decompress(c, ctx).dtype ==
          torch.float32, "Compression.fp16 compress/decompress dtypes")
    w = torch.full([3], float(r + 1), dtype=torch.float64, requires_grad=True)
    y = hvd.allreduce(w, name="grad.fwd", op=hvd.Sum)
    y.sum().backward()
    same(w.grad, torch.full([3], float(n), dtype=torch.float64),
         "gradient of allreduce(Sum) is the summed upstream gradient")
    # objects
    obj = hvd.broadcast_object({"rank": r, "data": [1, 2, r]}, root_rank=n - 1)
    check(obj == {"rank": n - 1, "data": [1, 2, n - 1]}, "broadcast_object: %r" % (obj,))
    objs = hvd.allgather_object(("x", r))
    check(objs == [("x", q) for q in range(n)], "allgather_object: %r" % (objs,))
    # sparse
    t = torch.sparse_coo_tensor(torch.tensor([[r, 0]]), torch.tensor([[1.0, 2.0], [3.0, r]]),
                                (n + 1, 2))
    got = hvd.sparse_allreduce_async(t, name="sp", op=hvd.Average)().coalesce().to_dense()
    want = sum(torch.sparse_coo_tensor(torch.tensor([[q, 0]]),
                                       torch.tensor([[1.0, 2.0], [3.0, q]]),
                                       (n + 1, 2)).to_dense() for q in range(n)) / n
    check(torch.allclose(got, want, rtol=0, atol=1e-6),
          "sparse_allreduce_async (Average): %s vs %s" % (got, want))
    hvd.barrier()
    check(hvd.join() in range(n), "join returns a rank")
    return count


# ---- training against one process on the concatenated batches ------------------------

D_IN, D_H, BATCH, STEPS = 6, 8, 4, 4


def batch(step, r, micro=0):
    g = torch.Generator().manual_seed(7919 * step + 31 * r + micro)
    x = torch.randn(BATCH, D_IN, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, 1, generator=g, dtype=torch.float64)
    return x, y


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, D_H), nn.Tanh(), nn.Linear(D_H, D_H), nn.Tanh(),
                         nn.Linear(D_H, 1)).double()


def maxdiff(ma, mb):
    return max((a - b).abs().max().item() for a, b in zip(ma.parameters(), mb.parameters()))


def report(mode, d, tol=1e-6):
    check(d <= tol, "%s: max |delta| %.3g vs one process exceeds %g" % (mode, d, tol))
    print("%s: max|delta| = %.3g" % (mode, d), flush=True)


def ref_train(model, opt, steps, n, micro=1):
    for s in range(steps):
        opt.zero_grad()
        for k in range(micro):
            xs, ys = zip(*[batch(s, q, k) for q in range(n)])
            x, y = torch.cat(xs), torch.cat(ys)
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def mode_mlp_opt(passes=1):
    n, r = hvd.size(), hvd.rank()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes)
    for s in range(STEPS):
        opt.zero_grad()
        for k in range(passes):
            x, y = batch(s, r, k)
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    ref = mlp()
    ref_train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), STEPS, n, passes)
    report("mlp DistributedOptimizer backward_passes_per_step=%d" % passes, maxdiff(model, ref))


def mode_mlp_ddp():
    n, r = hvd.size(), hvd.rank()
    if not torch.distributed.is_initialized():
        hvd.init_process_group()
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0005)
    ddp.register_comm_hook(ddp, hvd.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for s in range(STEPS + 2):  # DDP rebuilds its buckets after the first step
        opt.zero_grad()
        x, y = batch(s, r)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    ref = mlp()
    ref_train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), STEPS + 2, n)
    report("mlp DDP allreduce_hook", maxdiff(model, ref))


class EmbNet(nn.Module):
    def __init__(self, sparse):
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.Embedding(20, 4, sparse=sparse).double()
        self.out = nn.Linear(4, 1).double()

    def forward(self, idx):
        return self.out(self.emb(idx).mean(1))


def emb_batch(step, r):
    g = torch.Generator().manual_seed(104729 * step + r)
    return torch.randint(0, 20, (BATCH, 3), generator=g), torch.randn(BATCH, 1, generator=g,
                                                                     dtype=torch.float64)


def mode_embedding(sparse_as_dense):
    n, r = hvd.size(), hvd.rank()
    model = EmbNet(sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    for s in range(STEPS):
        opt.zero_grad()
        i, y = emb_batch(s, r)
        nn.functional.mse_loss(model(i), y).backward()
        check(sparse_as_dense or model.emb.weight.grad.is_sparse, "embedding grad is sparse")
        opt.step()
    ref = EmbNet(sparse=True)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for s in range(STEPS):
        ropt.zero_grad()
        ii, yy = zip(*[emb_batch(s, q) for q in range(n)])
        nn.functional.mse_loss(ref(torch.cat(ii)), torch.cat(yy)).backward()
        ropt.step()
    report("Embedding(sparse=True) %s" % ("sparse_as_dense" if sparse_as_dense else "gathered"),
           maxdiff(model, ref))


class Towers(nn.Module):
    """A shared trunk and one private tower per rank (model parallel)."""

    def __init__(self, n):
        super().__init__()
        torch.manual_seed(5)
        self.trunk = nn.Linear(D_IN, D_H).double()
        self.towers = nn.ModuleList()
        for q in range(n):
            torch.manual_seed(100 + q)
            self.towers.append(nn.Linear(D_H, 1).double())

    def forward(self, x, q):
        return self.towers[q](torch.tanh(self.trunk(x)))


def mode_local():
    n, r = hvd.size(), hvd.rank()
    model = Towers(n)
    mine = model.towers[r]
    params = list(model.trunk.parameters()) + list(mine.parameters())
    named = [("trunk." + k, v) for k, v in model.trunk.named_parameters()] + \
        [("tower." + k, v) for k, v in mine.named_parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=named,
                                   local_parameters=list(mine.parameters()))
    before = [p.detach().clone() for p in mine.parameters()]
    for s in range(STEPS):
        opt.zero_grad()
        x, y = batch(s, r)
        nn.functional.mse_loss(model(x, r), y).backward()
        opt.step()
    ref = Towers(n)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(STEPS):
        ropt.zero_grad()
        loss = sum(nn.functional.mse_loss(ref(*batch(s, q)[:1], q), batch(s, q)[1])
                   for q in range(n)) / n
        loss.backward()
        ropt.step()
    d = max(maxdiff(model.trunk, ref.trunk), maxdiff(mine, ref.towers[r]))
    report("local parameters (tower per rank, trunk averaged)", d)
    # the towers stayed distinct: gathered, rank q's tower is q's own
    w = hvd.allgather(mine.weight.detach().clone().reshape(1, -1), name="towers")
    check(all(not torch.equal(w[q], w[(q + 1) % n]) for q in range(n)) or n == 1,
          "local towers must differ across ranks (never averaged)")
    check(not torch.equal(before[0], mine.weight.detach()), "local tower was trained")


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.a = nn.Linear(D_IN, 1).double()
        self.b = nn.Linear(D_IN, 1).double()  # used on even ranks only

    def forward(self, x, q):
        out = self.a(x)
        return out + self.b(x) if q % 2 == 0 else out


def mode_nograd():
    n, r = hvd.size(), hvd.rank()
    model = Branchy()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for s in range(STEPS):
        opt.zero_grad()
        x, y = batch(s, r)
        nn.functional.mse_loss(model(x, r), y).backward()
        opt.step()
    ref = Branchy()
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(STEPS):
        ropt.zero_grad()
        loss = sum(nn.functional.mse_loss(ref(batch(s, q)[0], q), batch(s, q)[1])
                   for q in range(n)) / n
        loss.backward()
        ropt.step()
    report("parameters without a gradient on odd ranks", maxdiff(model, ref))


def mode_bcast_state():
    r = hvd.rank()
    model = mlp(seed=r)  # different initial weights on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch(99, r)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()  # rank-specific momentum buffers
    opt.param_groups[0]["lr"] = 0.1 + r
    root_params = hvd.broadcast_object([p.detach().clone() for p in model.parameters()], 0)
    root_state = hvd.broadcast_object(opt.state_dict(), 0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for p, q in zip(model.parameters(), root_params):
        same(p.detach(), q, "broadcast_parameters: parameter equals rank 0's")
    st = opt.state_dict()
    check(st["param_groups"][0]["lr"] == 0.1, "broadcast_optimizer_state: lr is rank 0's")
    for k, v in root_state["state"].items():
        same(st["state"][k]["momentum_buffer"], v["momentum_buffer"],
             "broadcast_optimizer_state: momentum buffer %s equals rank 0's" % k)
    print("broadcast_parameters / broadcast_optimizer_state: equal to rank 0's", flush=True)


def mode_optimizer_api():
    """synchronize()/skip_synchronize(), Horovod's warning, zero_grad guard."""
    import warnings
    r = hvd.rank()
    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = batch(0, r)
    nn.functional.mse_loss(model(x), y).backward()
    try:
        opt.zero_grad()
        check(False, "zero_grad between backward and step must raise")
    except AssertionError as e:
        check("before optimizer.step() or optimizer.synchronize()" in str(e), str(e))
    opt.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with opt.skip_synchronize():
            opt.step()
        check(not w, "no warning inside skip_synchronize(): %s" % [str(m.message) for m in w])
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.step()
        check(any("optimizer.step() called without optimizer.skip_synchronize()" in
                  str(m.message) for m in w), "Horovod's warning after a manual synchronize()")
    for bad in (dict(op=hvd.Sum, gradient_predivide_factor=2.0),):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **bad)
            check(False, "%s must raise ValueError" % bad)
        except ValueError:
            pass
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("same", p) for p in model.parameters()])
        check(False, "duplicate parameter names must raise ValueError")
    except ValueError as e:
        check("must be unique" in str(e), str(e))
    print("optimizer API: synchronize/skip_synchronize/warning/zero_grad ok", flush=True)


def mode_train():
    mode_optimizer_api()
    mode_mlp_opt(1)
    mode_mlp_opt(2)
    mode_embedding(False)
    mode_embedding(True)
    mode_local()
    mode_nograd()
    mode_bcast_state()
    mode_mlp_ddp()


# ---- failures ---------------------------------------------------------------------------

def mode_desync():
    """Rank 0 waits on 'grads.A', the others on 'grads.B': every rank must
    get an exception naming the tensors, in seconds, while waiting in
    Python (synchronize)."""
    r = hvd.rank()
    name = "grads.A" if r == 0 else "grads.B"
    t0 = time.monotonic()
    h = hvd.allreduce_async(torch.ones(4), name=name)
    try:
        hvd.synchronize(h)
        check(False, "desync: synchronize returned")
    except hvd.HorovodInternalError as e:
        msg = str(e)
        dt = time.monotonic() - t0
        print("desync: rank %d raised %s after %.1f s: %s" % (r, type(e).__name__, dt, msg),
              flush=True)
        check(isinstance(e, RuntimeError), "HorovodInternalError is a RuntimeError")
        check("allreduce.grads.A" in msg and "allreduce.grads.B" in msg,
              "the error names both tensors: %r" % msg)


def mode_compute_past_pending():
    """Ranks submit two tensors in opposite orders and compute (sleep) for
    longer than the deadlock time in between, without waiting: the
    completer thread waits on the pending op meanwhile, which must not make
    the rank look blocked (no false deadlock). Then the right sums."""
    r, n = hvd.rank(), hvd.size()
    first, second = ("compute.A", "compute.B") if r == 0 else ("compute.B", "compute.A")
    h1 = hvd.allreduce_async(torch.full((4,), float(r + 1)), name=first, op=hvd.Sum)
    time.sleep(3.0)  # "computing": nobody waits on h1
    h2 = hvd.allreduce_async(torch.full((4,), float(r + 1)), name=second, op=hvd.Sum)
    want = torch.full((4,), float(n * (n + 1) // 2))
    try:
        same(hvd.synchronize(h1), want, first)
        same(hvd.synchronize(h2), want, second)
    except hvd.HorovodInternalError as e:
        check(False, "compute_past_pending: rank %d raised %s" % (r, e))
    print("compute_past_pending: rank %d done" % r, flush=True)


def mode_process_sets():
    """After init(): the global set's size/rank/ranks are the job's;
    ProcessSet([1]) stays unregistered (size()/rank() None) while
    included() says whether this rank is 1; a collective refuses it and the
    job goes on; after shutdown() the global set's ranks are [] again."""
    n, r = hvd.size(), hvd.rank()
    g = hvd.global_process_set
    check((g.size(), g.rank(), g.ranks, g.included()) == (n, r, list(range(n)), True),
          "global set: %r %r %r %r" % (g.size(), g.rank(), g.ranks, g.included()))
    check(repr(g) == "ProcessSet(process_set_id=0, ranks=%r)" % (list(range(n)),), repr(g))
    one = hvd.ProcessSet([1])
    check((one.size(), one.rank(), one.process_set_id) == (None, None, None),
          "ProcessSet([1]): %r %r %r" % (one.size(), one.rank(), one.process_set_id))
    check(one.included() is (r == 1), "ProcessSet([1]).included() on rank %d: %r"
          % (r, one.included()))
    try:
        hvd.allreduce(torch.ones(2), name="ps", process_set=one)
        check(False, "allreduce on ProcessSet([1]) was accepted")
    except NotImplementedError as e:
        check("process sets other than the global one" in str(e), str(e))
    s = hvd.allreduce(torch.ones(2), name="ps", op=hvd.Sum)
    same(s, torch.full((2,), float(n)), "allreduce after the refused one")
    hvd.shutdown()
    check(g.ranks == [] and repr(g) == "ProcessSet(process_set_id=0, ranks=[])",
          "global set after shutdown: %r" % (g,))
    try:
        one.included()
        check(False, "included() after shutdown answered")
    except ValueError as e:
        check("has not been initialized" in str(e), str(e))
    return 7


def mode_mismatch():
    r = hvd.rank()
    try:
        hvd.allreduce(torch.ones(3 + (r % 2)), name="shape")
        check(False, "mismatched shapes must raise")
    except RuntimeError as e:
        print("mismatch: rank %d: %s" % (r, e), flush=True)
        check("allreduce.shape" in str(e) and "shape" in str(e), "names tensor: %r" % str(e))
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.float32 if r == 0 else torch.float64),
                      name="dtype")
        check(False, "mismatched dtypes must raise")
    except RuntimeError as e:
        check("allreduce.dtype" in str(e), "names tensor: %r" % str(e))
    same(hvd.allreduce(torch.ones(2), name="after"), torch.ones(2), "job usable after mismatch")


def mode_left():
    """Rank 1 shuts down first: rank 0's next allreduce raises
    HorovodInternalError naming rank 1 (host, pid) and the Python call it
    made, shutdown() (the coordinator's text says gs_shutdown)."""
    import socket

    r = hvd.rank()
    pids = hvd.allgather_object(os.getpid(), name="left.pids")
    if r == 1:
        hvd.shutdown()
        return
    try:
        hvd.allreduce(torch.ones(2), name="after")
        check(False, "an allreduce after rank 1 left must raise")
    except hvd.HorovodInternalError as e:
        want = ("tensor 'allreduce.after': rank 1 (%s, pid %d) has already left the job "
                "(shutdown()), so this collective can never complete; every rank must submit "
                "the same tensors before shutting down" % (socket.gethostname(), pids[1]))
        check(want in str(e), "rank 1 left: %r" % str(e))


def mode_fork():
    """Rank 0 calls os.fork() after some steps, with an op in flight (rank 1
    submits it only after rank 0's child exited) and one finished: in the
    child, hvd.allreduce, hvd.synchronize on the pending op and hvd.barrier
    raise HorovodInternalError at the call with the library's text (rank,
    host, both pids), synchronize on the finished op returns its result and
    hvd.shutdown() returns, and hvd.init() there raises HorovodInternalError
    at once saying gRPC cannot start again in that child (it hung before);
    the child exits 0. The parent's job goes on with the right values."""
    import signal
    import socket

    r, n = hvd.rank(), hvd.size()

    def step(s):
        got = hvd.allreduce(torch.full((4,), float(r + s)), op=hvd.Sum, name="fork.step")
        same(got, torch.full((4,), float(sum(q + s for q in range(n)))), "step %d" % s)

    for s in range(3):
        step(s)
    done = hvd.allreduce_async(torch.full((2,), float(r + 1)), op=hvd.Sum, name="fork.done")
    while not hvd.poll(done):
        time.sleep(0.01)
    want_inflight = torch.full((3,), float(sum(q + 100 for q in range(n))))
    if r == 0:
        h = hvd.allreduce_async(torch.full((3,), float(r + 100)), op=hvd.Sum, name="fork.inflight")
        parent = os.getpid()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.alarm(60)  # hang guard: a hang kills the child, the parent sees it
                want = ("rank 0 (host %s): this gradsync context was made by process %d before "
                        "a fork; process %d (a forked child) cannot use it: call gradsync only "
                        "from the process that called init() (fork before init()" %
                        (socket.gethostname(), parent, os.getpid()))
                calls = (("allreduce", "allreduce() (tensor 'allreduce.fork.child'): ",
                          lambda: hvd.allreduce(torch.ones(2), name="fork.child")),
                         ("synchronize", "synchronize() (tensor 'allreduce.fork.inflight'): ",
                          lambda: hvd.synchronize(h)),
                         ("barrier", "barrier(): ", hvd.barrier))
                for what, head, call in calls:
                    try:
                        call()
                        print("fork-child: FAIL: %s did not raise" % what, flush=True)
                        code = 1
                    except hvd.HorovodInternalError as e:
                        if not str(e).startswith(head) or want not in str(e):
                            print("fork-child: FAIL: %s: %r" % (what, str(e)), flush=True)
                            code = 1
                        print("fork-child: %s raised HorovodInternalError: %s" % (what, e),
                              flush=True)
                got = hvd.synchronize(done)
                if not torch.equal(got, torch.full((2,), float(sum(q + 1 for q in range(n))))):
                    print("fork-child: FAIL: finished op read %s" % got, flush=True)
                    code = 1
                hvd.shutdown()
                print("fork-child: synchronize on the finished op ok; shutdown() returned",
                      flush=True)
                # init() again in the child: gRPC cannot start there (the
                # parent's context is live); refused at once, not a hang
                want = ("init() (rank 0): process %d was forked by process %d while gradsync's "
                        "gRPC client was live there (a gradsync context that had not been shut "
                        "down); gRPC cannot start again in such a child (it would hang, and "
                        "could take events of the parent's connections): call init() in a "
                        "process started with exec (e.g. multiprocessing's 'spawn' start "
                        "method), or fork before the parent's init() or after its shutdown()" %
                        (os.getpid(), parent))
                try:
                    hvd.init()
                    print("fork-child: FAIL: init() in the child did not raise", flush=True)
                    code = 1
                except hvd.HorovodInternalError as e:
                    if str(e) != want:
                        print("fork-child: FAIL: init(): %r" % str(e), flush=True)
                        code = 1
                    print("fork-child: init() raised HorovodInternalError: %s" % e, flush=True)
                if hvd.is_initialized():
                    print("fork-child: FAIL: initialized after a failed init()", flush=True)
                    code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)  # the child's alarm bounds it
        check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
              "fork child: status %#x" % status)
        hvd.broadcast_object(True, root_rank=0, name="fork.go")
        same(hvd.synchronize(h), want_inflight, "the parent's op in flight at the fork")
    else:
        check(hvd.broadcast_object(None, root_rank=0, name="fork.go") is True, "go")
        same(hvd.allreduce(torch.full((3,), float(r + 100)), op=hvd.Sum, name="fork.inflight"),
             want_inflight, "fork.inflight")
    hvd.synchronize(done)
    for s in range(3, 6):
        step(s)


def mode_ddp_deadlock():
    """DDP: rank 1 stops doing backward at step 2 and waits on another
    tensor; rank 0's backward() must raise, not hang."""
    r = hvd.rank()
    hvd.init_process_group()
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(ddp, hvd.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(3):
        x, y = batch(s, r)
        try:
            if s == 2 and r == 1:
                hvd.allreduce(torch.ones(1), name="elsewhere")
            else:
                opt.zero_grad()
                nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
        except RuntimeError as e:
            print("ddp: rank %d step %d raised: %s" % (r, s, e), flush=True)
            check(s == 2, "only step 2 fails")
            check("allreduce.ddp.bucket0[" in str(e) and "allreduce.elsewhere" in str(e),
                  "names the tensors of both ranks: %r" % str(e))
            return
    check(False, "ddp deadlock: no exception")


def mode_persistent():
    """Persistent allreduces (allreduce_init, start, startall, wait) at
    np=2: values over steps, refusals with gradsync's exact texts, all or
    none, free while active, garbage collection, shutdown."""
    import gc
    import socket
    import weakref
    from gradsync.torch import persistent

    r, n = hvd.rank(), hvd.size()
    host = socket.gethostname()
    count = 0
    # in place, Sum and Average, restarted after each wait
    x = torch.zeros(5, dtype=torch.float64)
    y = torch.zeros(3, dtype=torch.float32)
    y_out = torch.zeros(3, dtype=torch.float32)
    z = torch.zeros(4, dtype=torch.int64)
    px = hvd.allreduce_init(x, name="p.x", op=hvd.Sum)
    py = hvd.allreduce_init(y, output=y_out, name="p.y")  # Average, out of place
    pz = hvd.allreduce_init(z, name="p.z", op=hvd.Sum, postscale_factor=2.0)
    check(px.name == "allreduce.p.x" and py.name == "allreduce.p.y", "names %s %s" %
          (px.name, py.name))
    check(px.test() and px.error() == "", "inactive before the first start")
    for step in range(6):
        def val(q, k, m):
            return torch.arange(m, dtype=torch.float64) * (step + 1) + 10 * q + k
        x.copy_(val(r, 0, 5))
        y.copy_(val(r, 1, 3).float())
        z.copy_(val(r, 2, 4).long())
        if step % 2 == 0:
            hvd.startall([px, py, pz])
        else:
            px.start()
            py.start()
            pz.start()
        got_y = py.wait()
        same(px.wait(), sum(val(q, 0, 5) for q in range(n)), "persistent Sum step %d" % step)
        same(got_y, (sum(val(q, 1, 3) for q in range(n)) / n).float(),
             "persistent Average step %d" % step)
        check(got_y is y_out, "wait() returns the output tensor")
        same(y, val(r, 1, 3).float(), "out of place leaves the input (step %d)" % step)
        same(pz.wait(), sum(val(q, 2, 4) for q in range(n)).long() * 2,
             "persistent Sum postscale 2 step %d" % step)
        check(px.test() and px.error() == "", "inactive after wait")
        count += 5

    # Refusals on rank 0 while its op "p.a" is active (rank 1 starts it only
    # after the allreduce "p.sig"): a second start, all or none, listed twice.
    a = torch.full((2,), float(r + 1))
    b = torch.full((2,), float(10 * (r + 1)))
    pa = hvd.allreduce_init(a, name="p.a", op=hvd.Sum)
    pb = hvd.allreduce_init(b, name="p.b", op=hvd.Sum)
    if r == 0:
        pa.start()
        check(not pa.test(), "p.a active before rank 1 starts it")
        active = ("tensor 'allreduce.p.a': rank 0 (host %s) started this persistent op while it "
                  "is still active; wait for it (wait(), test()) before starting it again"
                  % host)
        try:
            pa.start()
            check(False, "starting an active op must raise")
        except ValueError as e:
            check(str(e) == active, "active start text: %r" % str(e))
        try:
            hvd.startall([pb, pa])
            check(False, "startall with an active op must raise")
        except ValueError as e:
            check(str(e) == active, "startall text: %r" % str(e))
        check(pb.test(), "all or none: p.b was not started")
        try:
            hvd.startall([pb, pb])
            check(False, "an op listed twice must raise")
        except ValueError as e:
            check(str(e) == "tensor 'allreduce.p.b': startall() lists this persistent op twice "
                  "(rank 0, host %s); list each op once" % host, "twice text: %r" % str(e))
        check(pb.test(), "p.b not started by the refused startall")
        try:
            hvd.startall([pb, "x"])
            check(False, "a non-persistent op must raise")
        except ValueError as e:
            check("startall takes PersistentAllreduce objects" in str(e), "type text %r" % str(e))
        hvd.allreduce(torch.ones(1), name="p.sig")
    else:
        hvd.allreduce(torch.ones(1), name="p.sig")
        pa.start()
    same(pa.wait(), torch.full((2,), 3.0), "p.a after the refusals")
    pb.start()
    same(pb.wait(), torch.full((2,), 30.0), "p.b started after the refused startall")
    count += 8

    # A name over the library's limit: refused at allreduce_init, the text
    # starting with the Python call's name, not the C one (gs_allreduce).
    try:
        hvd.allreduce_init(torch.ones(2), name="x" * 500)
        check(False, "an over-long name must raise")
    except ValueError as e:
        check(str(e) == "allreduce(): tensor name 'allreduce.%s...' is 510 bytes; the limit is "
              "255" % ("x" * 30), "over-long name text: %r" % str(e))
    count += 1

    # A failed start: shapes differ across ranks. wait() raises with the
    # coordinator's text, error() keeps it, and the op may be started again
    # (here with its tensor refilled; the shapes still differ) or freed.
    m = torch.ones(3 + r)
    pm = hvd.allreduce_init(m, name="p.mm", op=hvd.Sum)
    mism = "tensor 'allreduce.p.mm': mismatched shapes: ranks [0] sent [3], ranks [1] sent [4]"
    for attempt in range(2):
        pm.start()
        try:
            pm.wait()
            check(False, "a mismatched persistent op must raise")
        except hvd.HorovodInternalError as e:
            check(mism in str(e), "mismatch text (attempt %d): %r" % (attempt, str(e)))
        check(pm.test() and mism in pm.error(), "error() after the failure: %r" % pm.error())
    pm.free()
    same(hvd.allreduce(torch.ones(2), name="p.after_mm"), torch.ones(2),
         "job usable after the mismatch")
    count += 5

    # Garbage collection of an inactive op frees its handle at once.
    live = persistent.live_count()
    g = hvd.allreduce_init(torch.ones(3), name="p.gc", op=hvd.Sum)
    g.start()
    same(g.wait(), torch.full((3,), float(n)), "p.gc")
    check(persistent.live_count() == live + 1, "p.gc counted live")
    wg = weakref.ref(g)
    del g
    gc.collect()
    check(wg() is None and persistent.live_count() == live,
          "p.gc freed by garbage collection (live %d, was %d)" % (persistent.live_count(), live))
    count += 3

    # Free (explicitly, and by garbage collection) while active: rank 1
    # starts the ops only after p.sig2; the tensors stay alive until the ops
    # complete, then are dropped.
    live = persistent.live_count()
    c1 = torch.full((4,), float(r + 1))
    c2 = torch.full((4,), float(r + 1))
    w1, w2 = weakref.ref(c1), weakref.ref(c2)
    p1 = hvd.allreduce_init(c1, name="p.c1", op=hvd.Sum)
    p2 = hvd.allreduce_init(c2, name="p.c2", op=hvd.Sum)
    del c1, c2
    if r == 0:
        hvd.startall([p1, p2])
        p1.free()
        p1.free()  # no double free
        check(p1.freed, "p1 freed")
        wp2 = weakref.ref(p2)
        del p2
        gc.collect()
        check(wp2() is None, "p2 object collected while active")
        check(w1() is not None and w2() is not None, "tensors kept while the ops are active")
        try:
            p1.start()
            check(False, "a freed op must raise")
        except ValueError as e:
            check(str(e) == "persistent allreduce allreduce.p.c1 was freed (by free() or "
                  "gradsync.torch.shutdown()); make a new one with allreduce_init()",
                  "freed text %r" % str(e))
        hvd.allreduce(torch.ones(1), name="p.sig2")
    else:
        hvd.allreduce(torch.ones(1), name="p.sig2")
        hvd.startall([p1, p2])
        same(p1.wait(), torch.full((4,), 3.0), "p.c1 on rank 1")
        same(p2.wait(), torch.full((4,), 3.0), "p.c2 on rank 1")
        p1.free()
        del p2
    check(persistent.live_count() == live, "p.c1/p.c2 not live (live %d, was %d)"
          % (persistent.live_count(), live))
    hvd.allreduce(torch.ones(1), name="p.sig3")
    # rank 0's completer frees them once they complete: bounded hang guard
    deadline = time.monotonic() + 60
    while (w1() is not None or w2() is not None) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    check(w1() is None and w2() is None, "tensors dropped once the freed ops completed")
    count += 6

    # An op freed while active that never completes before shutdown (rank 1
    # never starts it), and ops still alive at shutdown.
    d = torch.ones(2)
    wd = weakref.ref(d)
    pd = hvd.allreduce_init(d, name="p.d", op=hvd.Sum)
    del d
    if r == 0:
        pd.start()
        pd.free()
    keep = hvd.allreduce_init(torch.ones(2), name="p.keep", op=hvd.Sum)
    hvd.allreduce(torch.ones(1), name="p.sig4")
    hvd.shutdown()
    check(persistent.live_count() == 0, "shutdown freed every persistent op (%d left)"
          % persistent.live_count())
    check(keep.freed and (r != 0 or pd.freed), "objects read as freed after shutdown")
    keep.free()  # no double free
    del keep, pd
    gc.collect()
    check(wd() is None, "p.d's tensor dropped at shutdown")
    try:
        px.start()
        check(False, "start after shutdown must raise")
    except ValueError as e:
        check("persistent allreduce allreduce.p.x was freed" in str(e), "after shutdown %r"
              % str(e))
    count += 4
    return count


def main():
    mode = sys.argv[1]
    hvd.init()
    hvd.init()  # safe to call again
    rank = hvd.rank()  # a mode may shut down itself
    t0 = time.monotonic()
    try:
        out = globals()["mode_" + mode]()
    except Exception:
        traceback.print_exc()
        failures.append("exception")
        out = None
    if failures:
        print("%s: %d failures (rank %d)" % (mode, len(failures), rank), flush=True)
        sys.stdout.flush()
        os._exit(1)
    extra = " (%d checks)" % out if isinstance(out, int) else ""
    print("%s: ok%s in %.1f s" % (mode, extra, time.monotonic() - t0), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
