"""Elastic data-parallel training of a small CNN on scikit-learn's digits set.

Runs under torchrun (`python3 -m etjob.torchrun train.py`) on Debian's torch
(gloo on CPU), offline: the digits set ships with python3-sklearn. It does real
work (a CNN, augmentation, several epochs) and survives membership changes:

* etjob.torch.ElasticSampler: the global batch order is a pure function of
  (seed, epoch), each rank takes its slice of the global batch, and the committed
  ledger in every checkpoint proves each sample counts once per epoch;
* the step's gradient does not depend on the world size: the global batch is
  augmented from a generator of the step alone and each rank's loss is weighted
  by its share, so a run that was resized computes what an undisturbed run does
  (up to float rounding), and the learning rate decays with the step alone;
* etjob.supervisor: every step, one tiny all-reduce (etjob.torch.agree) decides
  on all ranks at once whether to stop (a reclamation notice, a scale-in, a
  SIGTERM) or to checkpoint (an early warning); on a stop rank 0 checkpoints the
  agreed step and every rank exits 75, so no committed step is lost;
* rank 0 also checkpoints atomically every --checkpoint-every steps into
  $ETJOB_CHECKPOINT_DIR (what a hard, un-noticed loss falls back to);
* every (re)start loads the latest checkpoint before wrapping the model in DDP
  (torchrun restarts all workers on every membership change).

Every rank prints one line per step (`step=S epoch=E rank=R world=W loss=L`),
rank 0 prints `resume step=S`, `checkpoint step=S`, `stop step=S reason=R`
and at the end `ledger ok` and `final accuracy=A`: the end-to-end tests assert
on these lines.
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import etjob.supervisor as kubeai  # the drop-in name of Alibaba's Job-Supervisor
import etjob.torch as etorch


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


def lr_schedule(lr, total):
    """Cosine decay to 0 over the run, a function of the step alone: the final
    model settles instead of jittering at a constant rate, so the final
    accuracy of two runs (disturbed or not) can be compared."""
    return lambda step: lr * 0.5 * (1 + math.cos(math.pi * step / total))


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


def log(msg):
    # One write per line (ranks share the pod's stdout, and print() writes the
    # line and its newline separately, which interleaves), with the wall time so
    # that logs of different pods can be merged in order.
    sys.stdout.write("%s t=%.3f\n" % (msg, time.time()))
    sys.stdout.flush()


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
    sup = kubeai.init()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    (xtr, ytr), test = dataset(args.seed)
    sampler = etorch.ElasticSampler(len(ytr), args.global_batch, seed=args.seed)
    total = sampler.steps_per_epoch * args.epochs

    lr_at = lr_schedule(args.lr, total)
    model = Net(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    ckpt = etorch.load_checkpoint(args.checkpoint_dir)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sampler.load_state_dict(ckpt["sampler"])
        step = ckpt["step"]
    if rank == 0:
        log("resume step=%d world=%d restart=%s" % (step, world, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    ddp = nn.parallel.DistributedDataParallel(model)

    # The job's throughput since the last checkpoint, reported with it and
    # the world size it was measured at (rank 0 alone, so it is the whole
    # job's): the controller's growth rule
    # (spec.growth.minSamplesPerSecondPerWorker) compares it across sizes.
    pace = {"since": time.time(), "steps": 0}

    def checkpoint(stopping=False):
        if rank == 0:
            began = time.time()
            ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "sampler": sampler.state_dict(), "step": step, "time": time.time()}
            if stopping:
                # On the way out a failed write (a full disk) is said, and
                # the exit is still 75: the job resumes from the previous one.
                path = etorch.checkpoint_before_exit(args.checkpoint_dir, ckpt, log=log)
                if path is None:
                    return
            else:
                path = etorch.save_checkpoint(args.checkpoint_dir, ckpt)
            log("checkpoint step=%d" % step)
            # The controller shows it in status.lastCheckpoint, and warns when
            # writing it takes longer than the node's cloud gives notice.
            took = time.time() - pace["since"]
            sps = pace["steps"] * args.global_batch / took if took > 0 else 0.0
            sup.report_progress(step, step, os.path.relpath(path, args.checkpoint_dir), time.time() - began, sps, world)
            pace.update(since=time.time(), steps=0)

    while step < total:
        stop, early = etorch.agree(not sup.check_alive(), sup.should_checkpoint())
        if stop:
            checkpoint(stopping=True)
            dist.barrier()  # the checkpoint is on disk before anyone leaves
            if rank == 0:
                log("stop step=%d reason=%s" % (step, sup.reason() or "peer"))
            sup.exit_preempted()
        if early and step % args.checkpoint_every != 0:
            checkpoint()
        # The whole global batch is augmented alike on every rank, from a
        # generator of the step alone, and each rank takes its share: a
        # sample's augmentation, like its place in the order, does not depend
        # on how many ranks there are, so a resized run computes what an
        # undisturbed one does (up to float rounding).
        gen = torch.Generator().manual_seed(args.seed * 1000003 + step)
        whole = sampler.global_batch_indices()
        x, y = etorch.shard(augment(xtr[whole], gen), rank, world), etorch.shard(ytr[whole], rank, world)
        loss_sum = F.cross_entropy(ddp(x), y, reduction="sum")
        opt.zero_grad()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        # Each rank's loss is weighted by its share of the global batch, so the
        # all-reduced gradient is the global batch's mean whatever the split.
        (loss_sum * world / args.global_batch).backward()
        opt.step()
        step += 1
        pace["steps"] += 1
        sampler.commit()
        log("step=%d epoch=%d rank=%d world=%d loss=%.4f" % (step, sampler.epoch, rank, world, loss_sum.item() / max(len(y), 1)))
        if step % args.checkpoint_every == 0 or step == total:
            checkpoint()
    if rank == 0:
        problems = etorch.check_ledger(sampler.ledger, len(ytr), args.global_batch)
        log("ledger ok" if not problems else "ledger problems=%s" % "; ".join(problems))
        log("final accuracy=%.4f steps=%d" % (evaluate(model, test), step))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
