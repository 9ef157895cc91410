"""A Horovod PyTorch training script (synthetic data) that runs on gradsync
with only its import changed:

    import horovod.torch as hvd   ->   import gradsync.torch as hvd

Run:  PYTHONPATH=python build/bin/gradsync-run -np 2 python3 examples/pytorch_synthetic.py
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import gradsync.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch synthetic training (Horovod style)")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches-per-epoch", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--batches-per-allreduce", type=int, default=1)
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed + hvd.rank())  # different init per rank: broadcast fixes it
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


# A fixed synthetic classification task: labels from a random linear map.
gen = torch.Generator().manual_seed(args.seed)
teacher = torch.randn(64, 10, generator=gen)


def synthetic_batch(epoch, batch):
    g = torch.Generator().manual_seed(hash((args.seed, hvd.rank(), epoch, batch)) % (2 ** 31))
    data = torch.randn(args.batch_size, 64, generator=g)
    return data, (data @ teacher).argmax(1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression,
                                     backward_passes_per_step=args.batches_per_allreduce,
                                     op=hvd.Average)


def metric_average(val, name):
    return hvd.allreduce(torch.tensor(val), name=name).item()


for epoch in range(args.epochs):
    t0 = time.time()
    total = 0.0
    for b in range(args.batches_per_epoch):
        optimizer.zero_grad()
        for k in range(args.batches_per_allreduce):
            data, target = synthetic_batch(epoch, b * args.batches_per_allreduce + k)
            loss = F.cross_entropy(model(data), target)
            loss.backward()
        optimizer.step()
        total += loss.item()
    avg = metric_average(total / args.batches_per_epoch, "avg_loss")
    if hvd.rank() == 0:
        print("epoch %d: loss %.4f (averaged over %d ranks), %.1f img/s per rank"
              % (epoch, avg, hvd.size(),
                 args.batches_per_epoch * args.batch_size * args.batches_per_allreduce /
                 (time.time() - t0)), flush=True)

# every rank ends with the same parameters
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
same = hvd.allgather(flat.unsqueeze(0), name="final_params")
assert all(torch.equal(same[0], same[r]) for r in range(hvd.size())), "ranks diverged"
if hvd.rank() == 0:
    print("done: parameters identical on all %d ranks" % hvd.size(), flush=True)
