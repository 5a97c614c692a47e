"""Horovod elastic training of a small CNN on scikit-learn's digits set.

Written the way seed 000's script (Alibaba's spot-instance example) is
written, and started the way seed 001 starts its job:

    horovodrun -np $((${workers}*${gpus})) --min-np $((${minWorkers}*${gpus})) \
      --max-np $((${maxWorkers}*${gpus})) \
      --host-discovery-script /etc/edl/discover_hosts.sh \
      python /examples/horovod/pytorch_digits_elastic.py

* ``hvd.elastic.run`` with a ``hvd.elastic.TorchState`` that holds the model,
  the optimizer, the sampler and the step; ``state.commit()`` after every
  step, so Horovod's own recovery (a reset on HostsUpdatedInterrupt, a
  restore on HorovodInternalError, the blacklist of a failed host) shrinks
  and grows the job in place and never does a committed step again;
* ``import etjob.supervisor as kubeai``, ``kubeai.init()`` after
  ``hvd.init()``, and ``kubeai.check_alive()`` before each batch. When it
  turns false on one rank (a reclamation notice on its node, a scale-in of
  its worker), etjob has already taken that worker out of discovery, so
  Horovod raises HostsUpdatedInterrupt at the next commit on every rank:
  the told rank saves a checkpoint and exits 75, etjob's reserved "told to
  stop" code (never 0: a rank exiting 0 ends a Horovod job), and the others
  reset without it from that commit. When it turns false on every rank (the
  job fell below its minimum), they all stop at one agreed step and rank 0
  checkpoints it;
* at start, every rank loads the latest checkpoint of $ETJOB_CHECKPOINT_DIR
  (the resume after the job was suspended below its minimum); rank 0 also
  writes one every --checkpoint-every steps, what a loss of the whole job
  falls back to;
* the step does not depend on the world size (etjob.torch.ElasticSampler:
  one global batch per step, augmented from the step alone, each rank takes
  its rows, the loss weighted by its share), so a resized run computes what
  an undisturbed run does, and the sampler's ledger proves that every sample
  counted once per epoch.

Every rank prints one line per step, ``step=S epoch=E rank=R world=W
loss=L``; horovodrun prefixes it with ``[R]<stdout>:``. Rank 0 prints
``resume step=S``, ``reset step=S world=W`` after each of Horovod's resets,
``checkpoint step=S``, and at the end ``ledger ok`` and ``final
accuracy=A``; a rank told to stop prints ``stop step=S ... why=W`` (W: job
for the agreed stop below the minimum, reset for a rank that stopped from
a reset that waited for hosts, removed, or the leave's own words).
The end-to-end tests assert on these lines.
"""

import argparse
import math
import os
import sys
import threading
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

import etjob.supervisor as kubeai  # the drop-in name of Alibaba's Job-Supervisor
import etjob.torch as etorch


# LEAVE_WAIT is how long a rank told to stop keeps training while it waits
# for Horovod to take it out at a commit (etjob drops it from discovery at
# once; Horovod reads discovery every second).
LEAVE_WAIT = 10

# RESET_WAIT is how long a rank told to stop lets a reset after a host update
# wait for Horovod's driver before it stops from the reset itself
# (watch_reset): longer than the driver takes to tell a removed rank (a
# second or two), shorter than what a notice leaves after the stop time (the
# checkpoint time and the 15 s stop margin).
RESET_WAIT = 8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", "6")))
    p.add_argument("--global-batch", type=int, default=64, help="samples per step across all ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=int(os.environ.get("CHECKPOINT_EVERY", "10")))
    p.add_argument("--width", type=int, default=int(os.environ.get("WIDTH", "32")), help="CNN channels (work per step)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=os.environ.get("ETJOB_CHECKPOINT_DIR", ""),
                   help="shared checkpoint directory (default $ETJOB_CHECKPOINT_DIR; none: no checkpoints on disk)")
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


def log(msg):
    # One write per line, with the wall time, so that the ranks' lines can be
    # merged in order.
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
    # Initialize the Horovod distributed training environment by calling hvd.init().
    hvd.init()
    # Initialize the connection to etjob's node agent by calling kubeai.init(),
    # so that this rank hears its node's reclamation notice.
    sup = kubeai.init()
    (xtr, ytr), test = dataset(args.seed)
    sampler = etorch.ElasticSampler(len(ytr), args.global_batch, seed=args.seed)
    total = sampler.steps_per_epoch * args.epochs

    def lr_at(step):
        # Cosine decay to 0 over the run, a function of the step alone.
        return args.lr * 0.5 * (1 + math.cos(math.pi * step / total))

    model = Net(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    # Resume from the latest checkpoint: every rank reads it, and the state
    # sync at the start of hvd.elastic.run makes rank 0's copy everyone's.
    ckpt = etorch.load_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sampler.load_state_dict(ckpt["sampler"])
        step = ckpt["step"]
    if hvd.rank() == 0:
        log("resume step=%d world=%d" % (step, hvd.size()))
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, step=step)

    def on_reset():
        # After every reset (a host left or joined): the tests read the
        # pause and the steps done again from these lines and the steps'.
        resetting[0] = None
        if hvd.rank() == 0:
            log("reset step=%d world=%d" % (state.step, hvd.size()))

    state.register_reset_callbacks([on_reset])

    def save_checkpoint(why):
        # Ranks that stop together may all write the same step: the writes
        # are atomic and land under one name (etjob.torch).
        if not args.checkpoint_dir:
            return
        began = time.time()
        ckpt = {"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
                "sampler": state.sampler.state_dict(), "step": state.step, "time": time.time()}
        if why == "stop":
            # On the way out a failed write (a full disk) is said, and the
            # exit is still 75: the job resumes from the previous checkpoint.
            path = etorch.checkpoint_before_exit(args.checkpoint_dir, ckpt, log=log)
            if path is None:
                return
        else:
            path = etorch.save_checkpoint(args.checkpoint_dir, ckpt)
        log("checkpoint step=%d why=%s" % (state.step, why))
        sup.report_progress(state.step, state.step, os.path.relpath(path, args.checkpoint_dir), time.time() - began)

    def stop(why):
        # The state was just committed (or restored to the last commit):
        # the checkpoint holds the last step every rank did.
        save_checkpoint("stop")
        log("stop step=%d rank=%d reason=%s why=%s" % (state.step, hvd.rank(), sup.reason(), why))
        kubeai.exit_preempted()

    told_at = [None]
    # resetting: when this rank entered a reset after a host update (None
    # outside one); rank: its rank before it.
    resetting, rank_was = [None], [hvd.rank()]

    def watch_reset():
        # A reset waits in hvd.init() until Horovod's driver has --min-np
        # hosts. When a rank left at once (a notice with no lead time left)
        # or was lost (a hard loss), and the others were told to stop while
        # in the reset it caused, the job is below its minimum, discovery is
        # empty, and the reset never ends: no rank can reach the agreed
        # stop, and the pods' deletion would lose every step since the last
        # periodic checkpoint. The state is the last commit (the one at
        # which the host update was raised, or the one Horovod restored
        # after the failed collective), the same step on every rank, so a
        # told rank stops from there: the checkpoint (the ranks may all
        # write it: the same step, an atomic rename) and exit 75.
        while True:
            time.sleep(0.5)
            began = resetting[0]
            if began is None or time.time() - began < RESET_WAIT or kubeai.check_alive():
                continue
            save_checkpoint("stop")
            log("stop step=%d rank=%d reason=%s why=reset" % (state.step, rank_was[0], sup.reason()))
            kubeai.exit_preempted()

    threading.Thread(target=watch_reset, name="etjob-watch-reset", daemon=True).start()

    def all_stopping(alive):
        # One tiny all-reduce: were all ranks told to stop?
        n = hvd.allreduce(torch.tensor([0 if alive else 1]), op=hvd.Sum, name="etjob.stop")
        return int(n.item()) == hvd.size()

    def stop_together():
        # Rank 0 writes the checkpoint the next launcher resumes from; it
        # is on disk before anyone goes.
        if hvd.rank() == 0:
            save_checkpoint("stop")
        hvd.allreduce(torch.tensor([0]), name="etjob.stopped")
        log("stop step=%d rank=%d reason=%s why=job" % (state.step, hvd.rank(), sup.reason()))
        kubeai.exit_preempted()

    @hvd.elastic.run
    def train(state):
        try:
            steps(state)
        except HorovodInternalError:
            # A peer died in a collective (a hard loss): Horovod restores
            # the last commit and resets, which waits for --min-np hosts.
            # If etjob stops the job meanwhile (the loss left it below its
            # minimum), watch_reset stops this rank from that commit.
            resetting[0] = time.time()
            raise

    def steps(state):
        while state.step < total:
            # Before each batch: is this rank still wanted? One tiny
            # all-reduce tells every rank how many of them were told to stop.
            alive = kubeai.check_alive()
            if not alive and told_at[0] is None:
                told_at[0] = time.time()
            if all_stopping(alive):
                # The whole job stops (below its minimum, the launcher's
                # node reclaimed): all ranks at this same step.
                stop_together()
            if not alive and time.time() - told_at[0] > LEAVE_WAIT:
                # etjob takes a leaving rank out of discovery at once, and
                # Horovod then resets the others without it at a commit.
                # That did not happen in time: leave on our own (the others
                # restore the last commit when their collective fails).
                stop("no host update after %ds" % LEAVE_WAIT)
            rank, world = hvd.rank(), hvd.size()
            rank_was[0] = rank
            gen = torch.Generator().manual_seed(args.seed * 1000003 + state.step)
            whole = state.sampler.global_batch_indices()
            x, y = etorch.shard(augment(xtr[whole], gen), rank, world), etorch.shard(ytr[whole], rank, world)
            loss_sum = F.cross_entropy(state.model(x), y, reduction="sum")
            state.optimizer.zero_grad()
            for group in state.optimizer.param_groups:
                group["lr"] = lr_at(state.step)
            # hvd.DistributedOptimizer averages the gradients over the ranks;
            # weighting each rank's loss by world/global_batch makes that
            # average the global batch's mean gradient, whatever the split.
            (loss_sum * world / args.global_batch).backward()
            state.optimizer.step()
            state.step += 1
            state.sampler.commit()
            log("step=%d epoch=%d rank=%d world=%d loss=%.4f" % (
                state.step, state.sampler.epoch, rank, world, loss_sum.item() / max(len(y), 1)))
            if rank == 0 and (state.step % args.checkpoint_every == 0 or state.step == total):
                save_checkpoint("periodic")
            # Saves the state in memory, then raises HostsUpdatedInterrupt on
            # every rank at once when the discovered hosts changed. Every
            # rank, a leaving one too, goes through Horovod's reset (its
            # shutdown is collective: a rank that vanished here would make
            # the others wait out the gloo timeout); the reset removes the
            # leaving ranks, and the others go on from this very commit.
            try:
                state.commit()
            except HostsUpdatedInterrupt:
                # Every rank is here at once: if all of them were told to
                # stop, the discovery emptied for a stop below the minimum.
                if all_stopping(kubeai.check_alive()):
                    stop_together()
                resetting[0] = time.time()
                raise

    try:
        train(state)
    except RuntimeError as e:
        # Horovod's reset tells a rank whose host left discovery that it
        # "has been removed from elastic job": a leave, never exit 0.
        if "removed from elastic job" not in str(e):
            raise
        if not kubeai.check_alive():
            save_checkpoint("stop")
        log("stop step=%d reason=%s why=removed" % (state.step, sup.reason() or "removed"))
        kubeai.exit_preempted()
    if hvd.rank() == 0:
        problems = etorch.check_ledger(state.sampler.ledger, len(ytr), args.global_batch)
        log("ledger ok" if not problems else "ledger problems=%s" % "; ".join(problems))
        log("final accuracy=%.4f steps=%d" % (evaluate(state.model, test), state.step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
