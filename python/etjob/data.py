"""The data path of a DDP script for etjob.elastic: DataLoader and
DistributedSampler (public names in etjob.elastic).

A script shaped like PyTorch's DDP tutorial (an epoch loop, a `DataLoader`
over a `DistributedSampler`, `set_epoch`, one `optimizer.step()` a batch)
adopts in-process recovery by its imports and one line that wraps the
optimizer (docs/worker-library.md shows the diff of examples/ddp_tutorial):

    from etjob.elastic import DataLoader, DistributedSampler
    ...
    opt = etjob.elastic.Optimizer(opt, model)     # after DDP(model)
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:                       # the agreed step's batch
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

What it does:

* **One global batch a step, whatever the world.** The global batch is
  `batch_size` times the sampler's `num_replicas`: given, else $workers
  (the job's spec.replicas, which etjob gives every pod), else the world
  when the loader is made. It is part of the state (a joiner and a resume
  keep it). Each step, rank r of a world of W gets rows r, r+W, ... of
  that global batch (W may not divide it), and its gradients are weighted
  by its share (its rows over the global batch's) instead of DDP's 1/W:
  the averaged gradient is the global batch's mean whatever the world, so
  a resize costs time, not a different model. The loss must be the mean
  over the rank's batch (torch's default `reduction`).
* **The iterator meets the others.** Before it hands out a batch it does
  what `Optimizer.steps` does between two steps: puts back a skipped step,
  carries out an agreed leave or join, meets a new generation when one is
  needed. It then hands out this rank's share of the batch at the
  committed position. After a skipped step, a new world or a sync that
  brought a newer commit, torch's iterator starts again there: batches its
  workers fetched ahead for the old split are dropped, never trained.
* **The ledger.** The sampler records the committed ranges of each epoch's
  order (ElasticSampler's ledger): each sample once an epoch across
  resizes, joins, rollbacks and resumes. With `drop_last=False` the epoch's
  last global batch is the rest (shorter); with True the rest is dropped.
* **The epoch loop.** `set_epoch(e)` says which epoch the script's loop is
  in. An iterator hands out the batches of one epoch and stops when its
  last batch is committed. A rank that joined takes the others' position:
  while its loop is at an earlier epoch than the state, its iterators stop
  at once, so its loop reaches the others' epoch with the others' epoch
  number (its rank-0-only snapshot names the right epoch). An iterator made
  before `set_epoch` (the tutorial peeks a batch to print its size) hands
  out the state's epoch.

One batch, one `opt.step()`: an iterator asked for a second batch before
the step of the first is refused by name (gradient accumulation over
batches is not supported here). The dataset is map-style.
"""

import inspect
import os

import torch
import torch.utils.data as tud

from etjob import contract
from etjob.torch import ElasticSampler, shard


def _nominal_world(num_replicas):
    """The world the global batch is made for: num_replicas, else $workers
    (spec.replicas), else the world now (init_process_group formed it)."""
    if num_replicas is not None:
        return int(num_replicas)
    env = os.environ.get(contract.ENV_ARENA_WORKERS, "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    from etjob import elastic

    if elastic.rank() == 0:
        elastic._log("DataLoader: a global batch for the %d ranks there are now ($%s is not set): a rank that "
                     "joins later makes its own until its first sync; num_replicas= fixes it" % (
                         elastic.size(), contract.ENV_ARENA_WORKERS))
    return elastic.size()


class DistributedSampler(tud.Sampler, ElasticSampler):
    """DistributedSampler is torch's DistributedSampler's constructor over
    etjob's elastic ledger: the global batch (the DataLoader's batch_size
    times num_replicas) stays the same across resizes, each rank takes its
    share of it (module docstring). rank is the generation's (the argument
    is accepted and not used); num_replicas fixes the global batch (default:
    $workers, else the world when the DataLoader is made); shuffle, seed and
    drop_last are torch's. Its state (state_dict) is the epoch, the samples
    of it committed, the ledger and the global batch."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):  # noqa: ARG002 - rank is the generation's
        if isinstance(dataset, tud.IterableDataset):
            raise TypeError("etjob.elastic.DistributedSampler: an IterableDataset has no index to shard; a map-style "
                            "dataset (with __len__ and __getitem__) is needed")
        if num_replicas is not None and int(num_replicas) < 1:
            raise ValueError("etjob.elastic.DistributedSampler: num_replicas=%r, want at least 1" % (num_replicas,))
        ElasticSampler.__init__(self, len(dataset), 0, seed=seed)
        self.global_batch = None  # fixed by the DataLoader (batch_size x num_replicas)
        self.num_replicas, self.shuffle, self.drop_last = num_replicas, bool(shuffle), bool(drop_last)
        self.requested = None  # the script's epoch (set_epoch)
        self.ended = set()     # the script's epochs whose iterator ended here (_Iterator)

    def set_epoch(self, epoch):
        """set_epoch says which epoch the script's loop is in (module
        docstring): torch's call, read by the next iterator."""
        self.requested = int(epoch)

    def order(self, epoch):
        """order is the epoch's order of the samples: torch's
        DistributedSampler's (a permutation seeded with seed + epoch, or
        the dataset's order), so that at the world the global batch was
        made for, with whole batches, each rank trains the batches torch's
        would have given it. Computed once an epoch."""
        key = epoch if self.shuffle else -1
        if self._order[0] != key:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + epoch)
                self._order = (key, torch.randperm(self.size, generator=g))
            else:
                self._order = (key, torch.arange(self.size))
        return self._order[1]

    @property
    def epoch_end(self):
        """The samples an epoch trains: all, or whole global batches
        (drop_last)."""
        return (self.size // self.global_batch) * self.global_batch if self.drop_last else self.size

    @property
    def steps_per_epoch(self):
        return -(-self.epoch_end // self.global_batch)

    def step_size(self, consumed=None):
        """The global batch at consumed (the committed position): the
        global batch, or the epoch's shorter rest."""
        at = self.consumed if consumed is None else consumed
        return min(self.global_batch, self.epoch_end - at)

    def global_batch_indices(self):
        return self.order(self.epoch)[self.consumed:self.consumed + self.step_size()].clone()

    def commit(self):
        """commit records the step over the current global batch."""
        start, end = self.consumed, self.consumed + self.step_size()
        last = self.ledger[-1] if self.ledger else None
        if last is not None and last[0] == self.epoch and last[2] == start:
            last[2] = end
        else:
            self.ledger.append([self.epoch, start, end])
        self.consumed = end
        if self.consumed >= self.epoch_end:
            self.epoch, self.consumed = self.epoch + 1, 0

    def problems(self):
        """problems lists what is wrong with the ledger: every complete
        epoch covers [0, epoch_end) once, in order (check_ledger)."""
        from etjob.torch import check_ledger

        return check_ledger(self.ledger, self.size, self.global_batch, full=self.epoch_end)

    def state_dict(self):
        return dict(ElasticSampler.state_dict(self), global_batch=self.global_batch)

    def load_state_dict(self, state):
        ElasticSampler.load_state_dict(self, state)
        if state.get("global_batch"):
            self.global_batch = int(state["global_batch"])

    # torch's Sampler: this rank's indices for the rest of the epoch, at
    # the world now (etjob.elastic.DataLoader does not use these)
    def __iter__(self):
        from etjob import elastic

        rank, world, pos = elastic.rank(), elastic.size(), self.consumed
        order = self.order(self.epoch)
        while pos < self.epoch_end:
            n = self.step_size(pos)
            yield from shard(order[pos:pos + n], rank, world).tolist()
            pos += n

    def __len__(self):
        from etjob import elastic

        return -(-self.epoch_end // max(elastic.size(), 1))


class _Shards:
    """_Shards is the batch sampler of the torch DataLoader under
    etjob.elastic's: from start (epoch, consumed, rank, world), this rank's
    share of each global batch to the epoch's end. Mutable: an iterator
    started again (iter()) reads the new start, so persistent workers stay."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.start = None

    def __iter__(self):
        s = self.sampler
        epoch, pos, rank, world = self.start
        order = s.order(epoch)
        while pos < s.epoch_end:
            n = s.step_size(pos)
            yield shard(order[pos:pos + n], rank, world).tolist()
            pos += n

    def __len__(self):
        return self.sampler.steps_per_epoch


_LOADER_ARGS = set(inspect.signature(tud.DataLoader.__init__).parameters)


class DataLoader:
    """DataLoader is torch's DataLoader for the training loop of
    etjob.elastic's DDP API (module docstring): the same constructor, over
    an etjob.elastic.DistributedSampler (made for you when sampler is None,
    with shuffle and drop_last), whose iterator hands out the agreed step's
    share of one global batch and meets the others between two steps.
    optimizer is the etjob.elastic.Optimizer it trains (default: the only
    one there is). Workers (num_workers), pin_memory, collate_fn,
    persistent_workers and the rest are torch's."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", optimizer=None):
        if batch_sampler is not None:
            raise TypeError("etjob.elastic.DataLoader: batch_sampler is etjob's (each step's share of one global "
                            "batch); give batch_size and sampler")
        if batch_size is None or int(batch_size) < 1:
            raise ValueError("etjob.elastic.DataLoader: batch_size=%r, want at least 1 (this rank's batch at the "
                             "sampler's num_replicas)" % (batch_size,))
        if sampler is None:
            sampler = DistributedSampler(dataset, shuffle=bool(shuffle), drop_last=drop_last)
        elif shuffle:
            raise ValueError("etjob.elastic.DataLoader: sampler option is mutually exclusive with shuffle "
                             "(DistributedSampler(dataset, shuffle=True) shuffles)")
        if not isinstance(sampler, DistributedSampler):
            raise TypeError("etjob.elastic.DataLoader: sampler must be an etjob.elastic.DistributedSampler, not %s "
                            "(torch's shards by a fixed world: a resize would train other samples)" % type(sampler).__name__)
        sampler.drop_last = sampler.drop_last or bool(drop_last)
        if sampler.global_batch is None:
            sampler.global_batch = int(batch_size) * _nominal_world(sampler.num_replicas)
        self.dataset, self.sampler, self.batch_size = dataset, sampler, int(batch_size)
        self.num_workers, self.drop_last = num_workers, sampler.drop_last
        self.optimizer = optimizer
        self._shards = _Shards(sampler)
        self._own_generator = generator is None
        self._generator = torch.Generator() if generator is None else generator
        kw = dict(num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, timeout=timeout,
                  worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                  generator=self._generator, persistent_workers=persistent_workers)
        if prefetch_factor is not None:
            kw["prefetch_factor"] = prefetch_factor
        if pin_memory_device and "pin_memory_device" in _LOADER_ARGS:
            kw["pin_memory_device"] = pin_memory_device
        self._torch = tud.DataLoader(dataset, batch_sampler=self._shards, **kw)

    def _start(self, start):
        """_start starts torch's iterator at start (epoch, consumed, rank,
        world). torch draws its workers' base seed from the loader's
        generator: etjob's own (unless one was given), seeded by the
        position, so that a start again after a rollback or a resize takes
        nothing from the process's random stream (a dropout mask of the
        next step would differ from the undisturbed run's) and the workers'
        seeds depend on where the epoch is, not on how often it started."""
        self._shards.start = start
        if self._own_generator:
            epoch, consumed = start[0], start[1]
            self._generator.manual_seed((self.sampler.seed * 1000003 + epoch) * 1000003 + consumed)
        return iter(self._torch)

    def __len__(self):
        """The steps of an epoch (the same for every world)."""
        return self.sampler.steps_per_epoch

    def __iter__(self):
        return _Iterator(self)

    def _bind(self):
        """_bind finds the Optimizer and makes the sampler part of its
        state (before the first step)."""
        from etjob import ddp

        opt = self.optimizer
        if opt is None:
            live = ddp.live_optimizers()
            if len(live) != 1:
                raise RuntimeError("etjob.elastic.DataLoader: %s etjob.elastic.Optimizer: wrap the optimizer "
                                   "(opt = etjob.elastic.Optimizer(opt, model)) before the first batch%s" % (
                                       "no" if not live else "more than one",
                                       "" if not live else ", and give the loader its own: DataLoader(..., optimizer=opt)"))
            opt = self.optimizer = live[0]
        st = opt._state
        if not any(o is self.sampler for o in st._objects.values()):
            name = "sampler" if "sampler" not in st._objects and "sampler" not in st._values else "data_sampler"
            opt.register(**{name: self.sampler})
        return opt


class _Iterator:
    """_Iterator is one pass over the loader: the batches of one epoch
    (module docstring)."""

    def __init__(self, loader):
        self.loader = loader
        self.epoch = None     # the epoch it hands out, chosen at its first batch
        self.inner = None     # torch's iterator, and where it starts
        self.at = None        # (generation, epoch, consumed, rank, world) of the batch torch's iterator hands out next
        self.handed = None    # the optimizer's step calls when the last batch was handed out

    def __iter__(self):
        return self

    def __next__(self):
        ld = self.loader
        s = ld.sampler
        opt = ld._bind()
        if self.handed is not None and opt._step_calls == self.handed:
            raise RuntimeError("etjob.elastic.DataLoader: a second batch before opt.step() was called for the first: "
                               "each batch is one step (gradient accumulation over batches is not supported)")
        opt._between()  # a skipped step put back, a leave or join carried out, a new generation met
        if self.epoch is None:
            self.epoch = self._choose(s)
        if s.epoch != self.epoch:
            if s.requested == self.epoch:
                s.ended.add(self.epoch)
            raise StopIteration
        g = opt._ctx.group
        n = s.step_size()
        if n < g.size:
            raise RuntimeError("etjob.elastic.DataLoader: the last global batch of epoch %d has %d samples, fewer "
                               "than the %d ranks: drop_last=True, or a dataset size whose rest is 0 or at least "
                               "the largest world" % (s.epoch, n, g.size))
        here = (g.gen, s.epoch, s.consumed, g.rank, g.size)
        if self.at != here:
            self.inner = ld._start(here[1:])  # batches fetched ahead for another position or split are dropped
        batch = next(self.inner)
        self.at = (g.gen, s.epoch, s.consumed + n, g.rank, g.size)
        self.handed = opt._step_calls
        mine = len(range(g.rank, n, g.size))
        # the share's weight: its rows over the global batch's (DDP's 1/W when every rank has as many)
        opt.model._buckets.scale = None if mine * g.size == n else mine / n
        opt._keep_start()
        return batch

    @staticmethod
    def _choose(s):
        """The epoch an iterator hands out (module docstring)."""
        want = s.requested
        if want is None or want in s.ended:
            return s.epoch  # before set_epoch: the state's epoch
        if want > s.epoch:
            # the script skips ahead (its own resume from a snapshot of a
            # later epoch): every rank runs the same loop, so all do
            s.epoch, s.consumed = want, 0
            return want
        return want  # the state's epoch, or an earlier one: a joiner's loop catching up (stops at once)
