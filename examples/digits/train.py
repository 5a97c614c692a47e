"""Elastic data-parallel training of a small CNN on scikit-learn's digits set.

Runs under torchrun (`python3 -m etjob.torchrun train.py`) on Debian's torch
(gloo on CPU), offline: the digits set ships with python3-sklearn. It does real
work (a CNN, augmentation, several epochs) and survives membership changes:

* the global batch order is a pure function of (seed, epoch, step), and each rank
  takes its slice of the global batch, so a sample is seen once per epoch
  whatever the world size was when its step ran;
* rank 0 checkpoints atomically (temp file, fsync, rename, then `latest`) every
  --checkpoint-every steps into $ETJOB_CHECKPOINT_DIR, and at the end;
* every (re)start loads the latest checkpoint before wrapping the model in DDP
  (torchrun restarts all workers on every membership change).

Every rank prints one line per step (`step=S epoch=E rank=R world=W loss=L`),
rank 0 prints `checkpoint step=S` and `resume step=S`, and at the end
`final accuracy=A`: the end-to-end tests assert on these lines.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", "6")))
    p.add_argument("--global-batch", type=int, default=64, help="samples per step across all ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=int(os.environ.get("CHECKPOINT_EVERY", "10")))
    p.add_argument("--width", type=int, default=int(os.environ.get("WIDTH", "32")), help="CNN channels (work per step)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=os.environ.get("ETJOB_CHECKPOINT_DIR", "/tmp/etjob-digits"))
    return p.parse_args(argv)


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c1 = nn.Conv2d(1, width, 3, padding=1)
        self.c2 = nn.Conv2d(width, width * 2, 3, padding=1)
        self.fc1 = nn.Linear(width * 2 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.max_pool2d(F.relu(self.c2(x)), 2)  # 8x8 -> 4x4
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def dataset(seed):
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    perm = np.random.RandomState(seed).permutation(len(y))
    n_test = len(y) // 5
    test, train = perm[:n_test], perm[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def augment(x, gen):
    # Random shifts of up to one pixel and Gaussian noise: real work, not sleep.
    dx, dy = (int(v) for v in torch.randint(-1, 2, (2,), generator=gen))
    x = torch.roll(x, shifts=(dy, dx), dims=(2, 3))
    return x + 0.05 * torch.randn(x.shape, generator=gen)


def save_checkpoint(directory, state):
    os.makedirs(directory, exist_ok=True)
    name = "ckpt-%08d.pt" % state["step"]
    tmp = os.path.join(directory, "." + name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, name))
    latest_tmp = os.path.join(directory, ".latest.tmp")
    with open(latest_tmp, "w") as f:
        json.dump({"file": name, "step": state["step"]}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, os.path.join(directory, "latest"))
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_checkpoint(directory):
    try:
        with open(os.path.join(directory, "latest")) as f:
            latest = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    return torch.load(os.path.join(directory, latest["file"]))


def evaluate(model, test):
    model.eval()
    with torch.no_grad():
        pred = model(test[0]).argmax(1)
    model.train()
    return (pred == test[1]).float().mean().item()


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    (xtr, ytr), test = dataset(args.seed)
    steps_per_epoch = len(ytr) // args.global_batch
    total = steps_per_epoch * args.epochs

    model = Net(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    ckpt = load_checkpoint(args.checkpoint_dir)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
    if rank == 0:
        print("resume step=%d world=%d restart=%s" % (step, world, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), flush=True)
    ddp = nn.parallel.DistributedDataParallel(model)

    while step < total:
        epoch, i = divmod(step, steps_per_epoch)
        order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        batch = order[i * args.global_batch:(i + 1) * args.global_batch][rank::world]
        gen = torch.Generator().manual_seed(step * 7919 + rank)
        x, y = augment(xtr[batch], gen), ytr[batch]
        # Each rank's loss is weighted by its share of the global batch, so the
        # all-reduced gradient is the global batch's mean whatever the split.
        loss_sum = F.cross_entropy(ddp(x), y, reduction="sum")
        opt.zero_grad()
        (loss_sum * world / args.global_batch).backward()
        opt.step()
        step += 1
        print("step=%d epoch=%d rank=%d world=%d loss=%.4f" % (step, epoch, rank, world, loss_sum.item() / max(len(batch), 1)), flush=True)
        if rank == 0 and (step % args.checkpoint_every == 0 or step == total):
            save_checkpoint(args.checkpoint_dir, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "time": time.time()})
            print("checkpoint step=%d" % step, flush=True)
    if rank == 0:
        print("final accuracy=%.4f steps=%d" % (evaluate(model, test), step), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
