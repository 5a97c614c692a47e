"""Torch helpers for elastic training with etjob (needs PyTorch).

* agree(flag): one tiny all-reduce per step so that every rank takes the same
  decision at the same step (Determined's should_preempt pattern);
* save_checkpoint / load_checkpoint: atomic (temp file, fsync, rename, then a
  `latest` pointer, then fsync of the directory);
* ElasticSampler: the global sample order of an epoch is a pure function of
  (seed, epoch), each step consumes one global batch split over the ranks of the
  moment, and its committed ledger (saved in every checkpoint) proves that each
  sample counts exactly once per epoch whatever the membership did.
"""

import json
import os

import torch
import torch.distributed as dist


def agree(*flags):
    """agree returns, on every rank, for each flag whether any rank set it:
    one tiny all-reduce for all of them. One flag gives a bool, several a tuple."""
    if dist.is_available() and dist.is_initialized():
        t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out = tuple(bool(v) for v in t.tolist())
    else:
        out = tuple(bool(f) for f in flags)
    return out[0] if len(out) == 1 else out


def save_checkpoint(directory, state, name=None):
    """save_checkpoint writes state atomically and points `latest` at it."""
    os.makedirs(directory, exist_ok=True)
    name = name or "ckpt-%08d.pt" % state.get("step", 0)
    # Temp names of their own: ranks that stop together (Horovod's below-min
    # stop) may write the same checkpoint at once, and a shared temp file
    # would mix their bytes.
    unique = "%d.%s" % (os.getpid(), os.urandom(4).hex())
    tmp = os.path.join(directory, ".%s.%s.tmp" % (name, unique))
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, name))
    latest_tmp = os.path.join(directory, ".latest.%s.tmp" % unique)
    with open(latest_tmp, "w") as f:
        json.dump({"file": name, "step": state.get("step", 0)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, os.path.join(directory, "latest"))
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return os.path.join(directory, name)


def load_checkpoint(directory):
    """load_checkpoint returns the latest checkpoint's state, or None."""
    try:
        with open(os.path.join(directory, "latest")) as f:
            latest = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    return torch.load(os.path.join(directory, latest["file"]))


def shard(t, rank, world):
    """shard returns rank's share of a global batch (rows rank, rank+world, ...):
    what ElasticSampler.batch gives that rank, for any tensor of the batch."""
    return t[rank::world]


class ElasticSampler:
    """ElasticSampler hands each rank its share of one global batch per step.

    Its state (``state_dict``) is the epoch, the number of samples of that
    epoch already committed, and the ledger of committed ranges; restore it
    from the checkpoint of the step you resume from.
    """

    def __init__(self, size, global_batch, seed=0):
        self.size, self.global_batch, self.seed = size, global_batch, seed
        self.epoch, self.consumed = 0, 0
        self.ledger = []  # [epoch, start, end) ranges of the epoch's order, committed

    @property
    def steps_per_epoch(self):
        return self.size // self.global_batch

    def order(self, epoch):
        g = torch.Generator().manual_seed(self.seed * 1000003 + epoch)
        return torch.randperm(self.size, generator=g)

    def global_batch_indices(self):
        """global_batch_indices returns the indices of the next global batch, the
        same on every rank and for every world size."""
        start = self.consumed
        return self.order(self.epoch)[start:start + self.global_batch]

    def batch(self, rank, world):
        """batch returns this rank's indices of the next global batch."""
        return shard(self.global_batch_indices(), rank, world)

    def commit(self):
        """commit records that the step over the current global batch is done."""
        start, end = self.consumed, self.consumed + self.global_batch
        self.ledger.append([self.epoch, start, end])
        self.consumed = end
        if self.consumed + self.global_batch > self.size:
            self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self):
        return {"epoch": self.epoch, "consumed": self.consumed, "ledger": [list(r) for r in self.ledger]}

    def load_state_dict(self, state):
        self.epoch, self.consumed = state["epoch"], state["consumed"]
        self.ledger = [list(r) for r in state.get("ledger", [])]


def check_ledger(ledger, size, global_batch):
    """check_ledger returns a list of problems: every complete epoch of the
    ledger must cover [0, steps*global_batch) exactly once, in order."""
    problems = []
    by_epoch = {}
    for epoch, start, end in ledger:
        by_epoch.setdefault(epoch, []).append((start, end))
    full = (size // global_batch) * global_batch
    for epoch, ranges in sorted(by_epoch.items()):
        pos = 0
        for start, end in ranges:
            if start != pos:
                problems.append("epoch %d: range [%d,%d) after %d (%s)" % (epoch, start, end, pos, "repeat" if start < pos else "gap"))
            pos = end
        if epoch < max(by_epoch) and pos != full:
            problems.append("epoch %d ended at %d, not %d" % (epoch, pos, full))
    return problems
