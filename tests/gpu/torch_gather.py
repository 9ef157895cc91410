"""gradsync.torch's gathering ops on CUDA tensors: allgather, grouped_allgather,
alltoall (with and without splits), reducescatter (Sum, Average with a
postscale), grouped_reducescatter, a CUDA sparse gradient and allgather's
gradient. Every result must be on the input's device with the values of a
CPU reference. Each round runs once on the default stream and once on a side
stream, behind a long kernel queued first, so an op or a result copy not
ordered after the caller's stream would read garbage.

Run by tests/gpu/run.sh on a machine with a GPU, under
`gradsync-run -np 1` with GRADSYNC_BACKEND=nccl (one GPU hosts one NCCL
rank); /usr/bin/python3 needs a CUDA build of torch. Prints "torch-gather:
ok (N checks)" and exits 0; prints "FAIL: ..." and exits 1 on a wrong
result; exits 77 (skipped) without a usable CUDA device."""

import contextlib
import sys

import torch

if not torch.cuda.is_available():
    print("SKIPPED: torch sees no CUDA device (torch %s, CUDA %s)"
          % (torch.__version__, torch.version.cuda))
    sys.exit(77)

import gradsync.torch as hvd  # noqa: E402  (after the skip)

checks = 0


def same(got, want, what):
    global checks
    ok = (got.device == want.device and got.dtype == want.dtype
          and list(got.shape) == list(want.shape) and torch.equal(got.cpu(), want.cpu()))
    if not ok:
        print("FAIL: %s: got %s %s on %s %s, want %s %s on %s %s"
              % (what, got.dtype, list(got.shape), got.device, got.flatten()[:8].tolist(),
                 want.dtype, list(want.shape), want.device, want.flatten()[:8].tolist()),
              flush=True)
        sys.exit(1)
    checks += 1


def delay():
    """A kernel of ~50 ms on the current stream, when torch has one."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(50 * 1000 * 1000)


def main():
    hvd.init()
    if hvd.size() != 1:
        print("FAIL: run with gradsync-run -np 1 (one GPU hosts one NCCL rank)")
        sys.exit(1)
    dev = torch.device("cuda", hvd.local_rank())
    torch.cuda.set_device(dev)
    side = torch.cuda.Stream(dev)
    reduce_dt = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)
    for dt in reduce_dt + (torch.uint8, torch.int8):
        for sname, stream in (("default", None), ("side", side)):
            tag = "%s.%s" % (str(dt).split(".")[1], sname)
            ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
            with ctx:
                ref = (torch.arange(30) % 13 + 1).to(dt).view(6, 5)
                x = ref.to(dev)
                delay()
                x = x.clone()  # a kernel behind the delay on this stream
                ag = hvd.allgather(x, name="ag." + tag)
                gag = hvd.grouped_allgather([x, x[:, :2].contiguous()], name="gag." + tag)
                a2a = hvd.alltoall(x, name="a2a." + tag)
                a2as, recv = hvd.alltoall(x, splits=torch.tensor([6]), name="a2as." + tag)
                if dt in reduce_dt:
                    rs_sum = hvd.reducescatter(x, name="rs." + tag, op=hvd.Sum)
                    rs_avg = hvd.reducescatter(x, name="rsa." + tag, op=hvd.Average,
                                               postscale_factor=2.0)
                    grs = hvd.grouped_reducescatter([x], name="grs." + tag, op=hvd.Sum)
            torch.cuda.current_stream(dev).synchronize()
            side.synchronize()
            want = ref.to(dev)
            same(ag, want, "allgather " + tag)
            same(gag[0], want, "grouped_allgather[0] " + tag)
            same(gag[1], want[:, :2], "grouped_allgather[1] " + tag)
            same(a2a, want, "alltoall " + tag)
            same(a2as, want, "alltoall with splits " + tag)
            same(recv, torch.tensor([6]), "alltoall received splits " + tag)
            if dt in reduce_dt:
                same(rs_sum, want, "reducescatter Sum " + tag)
                same(rs_avg, (ref * 2).to(dt).to(dev), "reducescatter Average x2 " + tag)
                same(grs[0], want, "grouped_reducescatter " + tag)
    # a CUDA sparse gradient (two allgathers on the device), Average over 1
    i = torch.tensor([[0, 2, 2]])
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    t = torch.sparse_coo_tensor(i, v, (4, 2)).to(dev)
    res = hvd.sparse_allreduce_async(t, name="sp", op=hvd.Average)()
    same(res.coalesce().to_dense(), t.coalesce().to_dense(), "sparse_allreduce_async CUDA")
    # allgather's gradient stays on the device
    w = torch.ones(3, 2, device=dev, requires_grad=True)
    hvd.allgather(w, name="grad").sum().backward()
    same(w.grad, torch.ones(3, 2, device=dev), "allgather gradient")
    hvd.shutdown()
    print("torch-gather: ok (%d checks)" % checks, flush=True)


if __name__ == "__main__":
    main()
