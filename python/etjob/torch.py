"""Torch helpers for elastic training with etjob (needs PyTorch).

* agree(flag): one tiny all-reduce per step so that every rank takes the same
  decision at the same step (Determined's should_preempt pattern);
* save_checkpoint / load_checkpoint: atomic (a temp file of its own, fsync,
  rename, fsync of the directory, then a `latest` pointer the same way), in
  etjob.stateio's format (tensors and a JSON header: loading runs no code,
  unlike torch.load of a pickle), old checkpoints pruned, a torn or dangling
  `latest` falls back to the newest checkpoint that loads, and checkpoints of
  which none loads are an error, never a silent start at step 0;
  checkpoint_before_exit for the stop path never raises;
* ElasticSampler: the global sample order of an epoch is a pure function of
  (seed, epoch), each step consumes one global batch split over the ranks of the
  moment, and its committed ledger (saved in every checkpoint) proves that each
  sample counts exactly once per epoch whatever the membership did.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from etjob import stateio


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


class CheckpointError(OSError):
    """CheckpointError: a checkpoint could not be written (ENOSPC, a read-only
    or vanished directory, ...). The message names the file and the cause; no
    temp file is left behind and `latest` still names the previous one."""

    def __str__(self):
        # errno 0: not the system's error but etjob's (a fence, a file that
        # is not a checkpoint): the message alone
        return self.strerror if not self.errno and self.strerror else super().__str__()


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory, state, name=None, keep=3, before_commit=None):
    """save_checkpoint writes state atomically and points `latest` at it:
    a temp file of its own (ranks that stop together may write the same
    checkpoint at once), fsync, rename, fsync of the directory, then the same
    for `latest`. The file is etjob.stateio's format (a JSON header and the
tensors' bytes, no pickle: ckpt-<step>.etjob). It keeps the `keep` newest
checkpoint files (0: all) and
    raises CheckpointError when the checkpoint cannot be written.
    before_commit, when given, is called before each rename (the
    checkpoint's, then `latest`'s); raising CheckpointError there
    (a fence: etjob.elastic's rank whose generation is over) leaves
    `latest` as it was."""
    name = name or "ckpt-%08d.etjob" % state.get("step", 0)
    unique = "%d.%s" % (os.getpid(), os.urandom(4).hex())
    tmps = [os.path.join(directory, ".%s.%s.tmp" % (name, unique)), os.path.join(directory, ".latest.%s.tmp" % unique)]
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmps[0], "wb") as f:
            stateio.write(f, state)
            f.flush()
            os.fsync(f.fileno())
        if before_commit is not None:
            before_commit()
        os.replace(tmps[0], os.path.join(directory, name))
        _fsync_dir(directory)  # the checkpoint's name is durable before latest points at it
        with open(tmps[1], "w") as f:
            json.dump({"file": name, "step": state.get("step", 0)}, f)
            f.flush()
            os.fsync(f.fileno())
        if before_commit is not None:
            before_commit()
        os.replace(tmps[1], os.path.join(directory, "latest"))
        _fsync_dir(directory)
    except OSError as e:
        for t in tmps:
            try:
                os.remove(t)
            except OSError:
                pass
        raise CheckpointError(e.errno, "checkpoint %s in %s: %s" % (name, directory, e.strerror or e)) from e
    if keep > 0:
        _prune(directory, keep, name)
    return os.path.join(directory, name)


def _step_of(name):
    try:
        return int(name[len("ckpt-"):].split(".")[0])
    except ValueError:
        return -1


def _checkpoints(directory):
    """The checkpoint files of directory (ckpt-<step>.etjob, and the
    ckpt-<step>.pt pickles of etjob before 2026-12, which are refused when
    read), newest (highest step, as a number) first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted((n for n in names if n.startswith("ckpt-") and n.endswith((".etjob", ".pt"))),
                  key=lambda n: (_step_of(n), n.endswith(".etjob")), reverse=True)


def read_checkpoint(path):
    """read_checkpoint reads one checkpoint file (etjob.stateio's format):
    nothing in it runs code. A sharded checkpoint's manifest is read with
    its parts (etjob.sharded). A torch.save pickle is refused with a
    CheckpointError that says so: a shared volume is written by every worker
    of the job, and unpickling runs whatever a rooted one put there."""
    from etjob import sharded

    state = _read_file(path)
    if sharded.is_manifest(state):
        try:
            state = sharded.read(os.path.dirname(path), state, _read_file)
        except stateio.FormatError as e:
            raise CheckpointError(0, "%s: %s" % (path, e)) from None
    return state


def _read_file(path):
    """_read_file reads one file of etjob.stateio's format."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(len(stateio.MAGIC))
        f.seek(0)
        if head != stateio.MAGIC:
            raise CheckpointError(0, "%s is not an etjob state file%s: etjob does not unpickle checkpoints "
                                     "(their code would run); resume from an etjob checkpoint or convert it" % (
                                         path, " (a torch.save pickle)" if head[:1] in (b"\x80", b"PK") else ""))
        try:
            return stateio.read(f, size)
        except stateio.FormatError as e:
            raise CheckpointError(0, "%s: %s" % (path, e)) from None


def _prune(directory, keep, current):
    from etjob import sharded

    names = _checkpoints(directory)
    for n in names[keep:]:
        if n != current:
            try:
                os.remove(os.path.join(directory, n))
            except OSError:
                pass
    # the parts of sharded checkpoints no longer kept, and of those that
    # never landed (older than the newest kept); a newer one's are in flight
    kept = {_step_of(n) for n in names[:keep]} | {_step_of(current)}
    try:
        others = os.listdir(directory)
    except OSError:
        return
    for n in others:
        step = sharded.part_step(n)
        if step is not None and step not in kept and step < max(kept):
            try:
                os.remove(os.path.join(directory, n))
            except OSError:
                pass


def save_part(directory, name, state):
    """save_part writes one part of a sharded checkpoint (etjob.sharded):
    a temp file, fsync, rename. Nothing points at it until rank 0 writes
    the manifest. Raises CheckpointError."""
    unique = "%d.%s" % (os.getpid(), os.urandom(4).hex())
    tmp = os.path.join(directory, ".%s.%s.tmp" % (name, unique))
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "wb") as f:
            stateio.write(f, state)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, name))
        _fsync_dir(directory)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise CheckpointError(e.errno, "part %s in %s: %s" % (name, directory, e.strerror or e)) from e
    return os.path.join(directory, name)


def checkpoint_before_exit(directory, state, log=None):
    """checkpoint_before_exit is save_checkpoint for the stop path (a notice,
    a leave): it never raises. When the checkpoint cannot be written it says
    why and returns None, so that the process still exits 75 (a preemption,
    resumed from the previous checkpoint) rather than 1 (a failure)."""
    try:
        return save_checkpoint(directory, state)
    except CheckpointError as e:
        (log or _warn)("checkpoint before exit failed, the job resumes from the previous one: %s" % e)
        return None


def _warn(msg):
    sys.stderr.write("etjob: %s\n" % msg)
    sys.stderr.flush()


def latest_step(directory):
    """latest_step is the step `latest` points at, or None when there is no
    readable `latest`."""
    try:
        with open(os.path.join(directory, "latest")) as f:
            return int(json.load(f)["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_checkpoint(directory, map_location=None):
    """load_checkpoint returns the latest checkpoint's state, or None when the
    directory holds none. When `latest` is torn, or names a file that is gone
    or does not load, it warns and takes the newest checkpoint that loads,
    never silently starting over at step 0: when checkpoints exist and none
    loads it raises CheckpointError naming each file and why.
    map_location (a device, or a function of a tensor) moves the tensors,
    which are read onto the CPU."""
    path = os.path.join(directory, "latest")
    named = None
    tried = []
    try:
        with open(path) as f:
            named = json.load(f)["file"]
        if not isinstance(named, str) or named not in _checkpoints(directory):
            # only a checkpoint file of this directory: never a path that
            # leads out of it ("../..", an absolute path), which a forged
            # `latest` could name
            raise ValueError("it names %r, not a checkpoint file of the directory" % (named,))
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError, OSError, RecursionError) as e:
        named = None
        _warn("%s is unreadable (%s): taking the newest checkpoint file" % (path, e))
    state = None
    if named is not None:
        try:
            state = read_checkpoint(os.path.join(directory, named))
        except (OSError, CheckpointError) as e:
            tried.append("%s: %s" % (named, e))
            _warn("%s names %s, which does not load (%s): taking the newest checkpoint file" % (path, named, e))
    if state is None:
        for n in _checkpoints(directory):
            if n == named:
                continue
            try:
                state = read_checkpoint(os.path.join(directory, n))
            except (OSError, CheckpointError) as e:
                tried.append("%s: %s" % (n, e))
                _warn("%s does not load (%s)" % (n, e))
                continue
            if named is not None or os.path.exists(path):
                _warn("resuming from %s" % n)
            break
    if state is None:
        if tried:
            raise CheckpointError(0, "no checkpoint in %s loads (not starting over at step 0): %s"
                                  % (directory, "; ".join(tried)))
        return None
    if map_location is not None:
        state = stateio.map_tensors(state, map_location if callable(map_location) else lambda t: t.to(map_location))
    return state


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
        self.ledger = []  # [epoch, start, end) ranges of the epoch's order, committed; contiguous ones merged
        self._order = (None, None)  # (epoch, its order): one permutation an epoch, not one a step

    @property
    def steps_per_epoch(self):
        return self.size // self.global_batch

    def order(self, epoch):
        """order is epoch's permutation of the samples, a pure function of
        (seed, epoch), computed once an epoch (1.1 s at 10M samples here;
        a step then costs its batch only: docs/benchmarks.md)."""
        if self._order[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1000003 + epoch)
            self._order = (epoch, torch.randperm(self.size, generator=g))
        return self._order[1]

    def global_batch_indices(self):
        """global_batch_indices returns the indices of the next global batch, the
        same on every rank and for every world size."""
        start = self.consumed
        return self.order(self.epoch)[start:start + self.global_batch].clone()  # never a view of the cached order

    def batch(self, rank, world):
        """batch returns this rank's indices of the next global batch."""
        return shard(self.global_batch_indices(), rank, world)

    def commit(self):
        """commit records that the step over the current global batch is done."""
        start, end = self.consumed, self.consumed + self.global_batch
        last = self.ledger[-1] if self.ledger else None
        if last is not None and last[0] == self.epoch and last[2] == start:
            # contiguous: one range grows, so the ledger holds a range or two
            # an epoch however long the run (it is copied at every commit and
            # sent with every join and checkpoint)
            last[2] = end
        else:
            self.ledger.append([self.epoch, start, end])
        self.consumed = end
        if self.consumed + self.global_batch > self.size:
            self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self):
        return {"epoch": self.epoch, "consumed": self.consumed, "ledger": [list(r) for r in self.ledger]}

    def load_state_dict(self, state):
        self.epoch, self.consumed = state["epoch"], state["consumed"]
        self.ledger = [list(r) for r in state.get("ledger", [])]


def check_ledger(ledger, size, global_batch, full=None):
    """check_ledger returns a list of problems: every complete epoch of the
    ledger must cover [0, full) exactly once, in order (full: the epoch's
    whole global batches, steps*global_batch, unless given: an epoch whose
    shorter last batch is trained covers all size samples)."""
    problems = []
    by_epoch = {}
    for epoch, start, end in ledger:
        by_epoch.setdefault(epoch, []).append((start, end))
    if full is None:
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
