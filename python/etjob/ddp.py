"""DDP and vote-then-step for etjob.elastic (public names in etjob.elastic).

A DDP script adopts in-process recovery with a few changed lines and no
re-indent (docs/worker-library.md shows the diff of examples/gpt):

    model = elastic.DistributedDataParallel(model)
    opt = elastic.Optimizer(torch.optim.AdamW(model.parameters()), model, sampler=sampler)
    opt.load_checkpoint(checkpoint_dir)
    for step in opt.steps(total):           # the agreed step; a failed one comes again
        rank, world = elastic.rank(), elastic.size()
        ...forward on this rank's share of the global batch...
        opt.zero_grad()
        loss.backward()                     # torch's DDP: buckets, overlap
        opt.step()                          # steps only once every rank agreed

How:

* `DistributedDataParallel` is torch's own DDP (its buckets, and their
  all-reduce overlapped with the backward pass), one per generation, with a
  communication hook that sends each bucket through the generation's data
  group (its gloo group, or an NCCL communicator of its own:
  init_process_group) and hands DDP a future this module completes: when the all-reduce is
  done, or at once when it failed, when another rank ended the generation or
  when it ran past its deadline (Context.timeout_for its bytes). A failed
  bucket is abandoned, never waited for; DDP gets zeros for it and the
  backward pass returns. DDP's own process group is a local group of one (the
  hook does every cross-rank reduction), so DDP never runs a collective of
  its own that could not be bounded: not at construction (the state is
  already the same on every rank after the generation's sync) and not when
  it rebuilds its buckets in its second iteration. Each rank's bucket layout
  (which parameters, in which order, in which bucket) goes into the vote, so
  ranks whose buckets differ are found, not averaged crosswise.
* `Optimizer.step()` is the vote: one small all-reduce (who leaves, who
  joins, whether a checkpoint is wanted, whether a rank's gradients failed,
  the bucket layout). It is launched by the hook of DDP's last bucket,
  beside that bucket's all-reduce, so it crosses the network while the
  backward pass ends and step() mostly finds it done (a second backward
  pass before step(), or none, gets a vote of its own in step()). Only
  when every rank took part and none failed, on any rank when it voted or
  on this rank since, does every rank step the wrapped optimizer and count
  the step. A failed step
  changed nothing: no copy of the model and optimizer is kept per step, and
  nothing is rolled back. A rank whose vote failed after another's succeeded
  is one step behind; the next generation's sync brings it to the newest.
* `Optimizer.steps(total)` yields the agreed step; between two steps it
  meets the others in a new generation when one is needed (a failure, a
  leave, a join), brings every rank to the newest commit (a joiner's state
  by broadcast, as tensors) and gives DDP the new group.

The step is the library's: a skipped step is yielded again, and leaves
nothing behind: its gradients are dropped, and the state's small objects
(LR schedulers, a GradScaler: `opt.register(...)`) are put back as they
were when the step began, whatever the loop did to them after `step()`
returned False. A scheduler or a scaler that steps with the optimizer but
is not registered is refused by name (a joiner would start it from
scratch). Modules registered with the state (an EMA model) are not copied
per step: update them only when `opt.step()` returns True.
"""

import collections
import os
import weakref
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from etjob import contract, elastic
from etjob import state as state_module

_MOD = 2**61 - 1  # the bucket layout's hash stays an int64
_DDP_ARGS = _TorchDDP.__init__.__code__.co_varnames


class _Item:
    __slots__ = ("work", "fut", "buf", "deadline", "done", "token")

    def __init__(self, work, fut, buf, deadline, token):
        self.work, self.fut, self.buf, self.deadline, self.done = work, fut, buf, deadline, False
        self.token = token  # the context's note that this rank waits for it (Context.begin_flight)


def _error_of(work):
    """_error_of is the first line of a completed work's error, or None. A
    failed NCCL work is completed too (is_completed() is true once it has an
    error), and its wait() does not raise with NCCL's async error handling
    off: its buffer holds a reduction cut short, which must never reach DDP
    as a bucket's mean (the replicas would step apart)."""
    try:
        e = work.exception()
    except (AttributeError, TypeError, NotImplementedError):  # torch 1.13 cannot hand it to Python
        return None
    return None if e is None else (str(e).splitlines() or ["?"])[0]


class _Buckets:
    """_Buckets is one generation's communication hook: each bucket's
    all-reduce is launched at once (DDP's overlap) and waited for by a
    thread of its own (a blocking wait, the GIL let go); a watchdog fails
    the buckets in flight when the generation ended or a deadline passed.
    Once failed, every bucket completes at once with zeros."""

    def __init__(self, ctx, group, pg, transport, index):
        self.ctx, self.group = ctx, group
        self.voter = None  # makes this rank's vote (Optimizer._ballot); launched at the last bucket
        self.vote = None   # (work, flags) of the vote launched with the last bucket, until step() takes it
        self.hooks = 0     # buckets hooked since the last vote was launched
        self.index = index  # id(parameter) -> its place in the module
        self.pg, self.transport = pg, transport  # the data group the buckets cross (the generation's gloo group, or its own)
        self.failed = None
        self.layout = 0
        # a bucket's weight: DDP's 1/W (None), or this rank's share of the
        # step's global batch (etjob.data: shares that differ between ranks)
        self.scale = None
        self._cv = threading.Condition()
        self._queue = collections.deque()  # launched, not yet waited for
        self._pending = []                 # not yet completed
        self._closed = False
        for target, name in ((self._waiter, "etjob-ddp-wait"), (self._watchdog, "etjob-ddp-watch")):
            threading.Thread(target=target, name="%s-%d" % (name, group.gen), daemon=True).start()

    def hook(self, _state, bucket):
        buf = bucket.buffer()
        layout = (self.layout * 1000003 + buf.numel() + 1) % _MOD
        for p in bucket.parameters():  # which parameters, in which order: a rank's own bucket order
            layout = (layout * 1000003 + self.index.get(id(p), -1) + 2) % _MOD
        self.layout = layout
        self.hooks += 1
        fut = torch.futures.Future()
        if self.failed is not None:
            fut.set_result(torch.zeros_like(buf))
            return fut
        g = self.group
        if self.scale is None:
            buf.div_(g.size)  # DDP's mean over the ranks
        else:
            buf.mul_(self.scale)  # each rank's rows over the global batch's: the global batch's mean
        try:
            work = self.pg.allreduce([buf])
        except RuntimeError as e:
            self._fail("bucket all-reduce failed: %s" % (str(e).splitlines() or ["?"])[0], end=True)
            fut.set_result(torch.zeros_like(buf))
            return fut
        nbytes = buf.numel() * buf.element_size()
        item = _Item(work, fut, buf, time.monotonic() + self.ctx.timeout_for(nbytes), self.ctx.begin_flight())
        with self._cv:
            self._queue.append(item)
            self._pending.append(item)
            self._cv.notify_all()
        if self.voter is not None and self.vote is None and bucket.is_last():
            self._launch_vote()
        return fut

    def _launch_vote(self):
        """_launch_vote starts this step's vote beside the last bucket's
        all-reduce (on the generation's own gloo group, never waited for
        here: step() waits for it, bounded)."""
        try:
            flags = self.voter(self)
        except Exception as e:  # noqa: BLE001 - never out of DDP's hook: step() votes instead
            elastic._log("vote not launched with the last bucket: %s" % e)
            return
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        try:
            work = self.group.pg.allreduce([flags], opts)
        except RuntimeError as e:
            self._fail("vote failed: %s" % (str(e).splitlines() or ["?"])[0], end=True)
            return
        self.vote, self.hooks = (work, flags), 0

    def take_vote(self):
        """take_vote hands step() the vote launched with the last bucket
        (work, flags), or None."""
        vote, self.vote = self.vote, None
        return vote

    def _waiter(self):
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                item = self._queue.popleft()
            err = None
            try:
                if self.transport.polled:
                    # NCCL: wait() and the work's future return at enqueue,
                    # is_completed() says when the reduction is done
                    nap = 0.0002
                    while not item.work.is_completed() and not item.done:
                        time.sleep(nap)
                        nap = min(nap * 1.5, 0.002)
                    if item.done:
                        continue
                    err = _error_of(item.work)
                if err is None:
                    item.work.wait()  # lets go of the GIL; ends at once on torch 2.x once the group is aborted
            except RuntimeError as e:
                err = (str(e).splitlines() or ["?"])[0]
            if err is not None:
                self._fail("bucket all-reduce failed: %s" % err, end=True)
                continue
            with self._cv:
                if item.done:
                    continue
                item.done = True
                self._pending.remove(item)
            self.ctx.progressed(self.group)  # every member's gradients are in it: all alive a moment ago
            self.ctx.end_flight(item.token)
            item.fut.set_result(item.buf)

    def _watchdog(self):
        while True:
            with self._cv:
                if self._closed:
                    return
                self._cv.wait(0.05 if self._pending else None)
                pending = list(self._pending)
            if not pending:
                continue
            gen = self.group.gen
            if self.ctx.over(gen):
                self._fail("another rank ended generation %d" % gen)
            elif time.monotonic() > min(i.deadline for i in pending):
                self._fail("a bucket's all-reduce ran past its deadline", end=True)

    def _fail(self, why, end=False):
        """_fail completes every bucket in flight with zeros (DDP's backward
        pass returns; the vote then skips the step) and, when this rank found
        the failure, ends the generation."""
        with self._cv:
            first = self.failed is None
            if first:
                self.failed = why
            items, self._pending = self._pending, []
            for i in items:
                i.done = True
            if items and self.pg is self.group.pg:
                self.group.work = items[0].work  # in flight: _retire parks its group
        for i in items:
            self.ctx.end_flight(i.token)
            i.fut.set_result(torch.zeros_like(i.buf))
        if first and end:
            try:
                self.ctx.end(self.group.gen, why)
            except Exception as e:  # noqa: BLE001 - the vote fails on this rank anyway
                elastic._log("ending generation %d: %s" % (self.group.gen, e))

    def reset(self):
        """reset starts a step's layout over (after its vote)."""
        self.layout, self.hooks = 0, 0

    def close(self):
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            vote, self.vote = self.vote, None
            for i in self._pending:
                self.ctx.end_flight(i.token)
        if vote is not None and not vote[0].is_completed() and self.group.work is None:
            self.group.work = vote[0]  # in flight: _retire parks its group


class _GlooTransport:
    """The buckets cross the generation's own gloo group (CPU tensors, or
    CUDA tensors through gloo)."""

    name = "gloo"
    polled = False  # a work's wait() returns once it is done

    def group(self, ctx, g):
        return g.pg

    def release(self, pg, gen):
        pass  # the generation's group: Context retires it


class _NCCLTransport:
    """The buckets cross an NCCL communicator of their own, a new one each
    generation (the old one aborted: its GPU memory freed, its kernels in
    flight ended). NCCL completes a work's wait() and future when the work
    is enqueued, so completion is polled (is_completed). Its own error
    handling must not end the process: TORCH_NCCL_ASYNC_ERROR_HANDLING is
    0 unless set (the watchdog here ends a generation on a failure or a
    deadline, and the communicator is aborted). Not run on a GPU by the
    tests: docs/status.md."""

    name = "nccl"
    polled = True

    def group(self, ctx, g):
        store = dist.PrefixStore(ctx._k("g%d/data/" % g.gen), ctx._client())
        opts = dist.ProcessGroupNCCL.Options()
        if hasattr(opts, "config"):
            opts.config.blocking = False  # abort() never waits for a hung communicator
        if hasattr(opts, "_timeout"):
            # NCCL's own bound (the library's deadline, by the bytes, is shorter)
            opts._timeout = timedelta(seconds=ctx.collective_timeout + 600)
        return dist.ProcessGroupNCCL(store, g.rank, g.size, opts)

    def release(self, pg, gen):
        try:
            pg.abort()
        except (RuntimeError, AttributeError) as e:
            elastic._log("abort of generation %d's data group: %s" % (gen, (str(e).splitlines() or ["?"])[0]))


# The data group's transport, by init_process_group's backend name (the
# tests add a fake one).
TRANSPORTS = {"gloo": _GlooTransport, "nccl": _NCCLTransport}
_transport = {"now": _GlooTransport()}


def use(backend):
    """use makes backend (a name of TRANSPORTS) the data group's transport."""
    if backend not in TRANSPORTS:
        raise ValueError("etjob.elastic.init_process_group: backend %r is not supported (%s are)" % (
            backend, ", ".join(sorted(TRANSPORTS))))
    if backend == "nccl":
        if not dist.is_nccl_available() or not hasattr(dist.ProcessGroupNCCL, "abort"):
            raise ValueError("etjob.elastic.init_process_group: backend 'nccl' needs a torch with NCCL whose "
                             "ProcessGroupNCCL can abort (torch %s has not)" % torch.__version__)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    _transport["now"] = TRANSPORTS[backend]()


_local = {}
_optimizers = weakref.WeakSet()


def live_optimizers():
    """The etjob Optimizers of this process (etjob.data finds its own)."""
    return list(_optimizers)


def _local_group():
    """_local_group is a process group of one, on this process alone: DDP's
    own group (its construction and bucket rebuild run no cross-rank
    collective on it). One for the process's life."""
    if "pg" not in _local:
        store = dist.HashStore()
        backend = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=60))
        if isinstance(backend, dist.ProcessGroup):
            _local["pg"] = backend  # torch 1.13: a gloo group is a ProcessGroup
        else:
            # torch 2.x: a gloo group is a backend of a ProcessGroup
            pg = dist.ProcessGroup(store, 0, 1)
            pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
            # gloo takes CUDA tensors too: DDP checks a GPU model's shapes on it
            for device in ("cpu", "cuda"):
                pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO, backend)
            _local["pg"] = pg
    return _local["pg"]


class DistributedDataParallel(nn.Module):
    """DistributedDataParallel wraps module in torch's DDP, rebuilt for each
    generation, its buckets' all-reduces bounded and abandoned on a failure
    (module docstring). Its state_dict is DDP's (`module.` before each
    key). Keyword arguments go to torch's DDP (bucket_cap_mb, ...), except
    process_group and device_mesh (DDP's own group is a local one),
    broadcast_buffers / forward_sync_buffers (always False: buffers are part
    of the state every rank already holds) and gradient_as_bucket_view
    (False: an abandoned all-reduce may still write into its bucket), which
    are refused, and find_unused_parameters, static_graph and
    skip_all_reduce_unused_params, refused when true: DDP finds unused
    parameters over its own group, here this rank alone, so a parameter
    unused on one rank would miss the others' average there. Every rank
    uses every parameter at every step."""

    def __init__(self, module, **ddp_kwargs):
        super().__init__()
        for bad in ("process_group", "broadcast_buffers", "forward_sync_buffers", "gradient_as_bucket_view", "device_mesh"):
            if bad in ddp_kwargs:
                raise TypeError("etjob.elastic.DistributedDataParallel: %s is etjob's to set" % bad)
        for bad in ("find_unused_parameters", "static_graph", "skip_all_reduce_unused_params"):
            if ddp_kwargs.get(bad):
                raise TypeError("etjob.elastic.DistributedDataParallel: %s=True is not supported (DDP would find "
                                "unused parameters on this rank alone, and ranks would step apart): every rank "
                                "must use every parameter" % bad)
        self.module = module
        object.__setattr__(self, "_kwargs", ddp_kwargs)
        object.__setattr__(self, "_ddp", None)
        object.__setattr__(self, "_buckets", None)

    def _unbind(self):
        """_unbind lets go of the last generation's DDP and buckets: their
        threads end and a data group of their own (NCCL) is aborted, before
        the next rendezvous and when the loop ends."""
        old = self._buckets
        object.__setattr__(self, "_ddp", None)
        object.__setattr__(self, "_buckets", None)
        if old is not None:
            old.close()
            if old.pg is not old.group.pg:
                old.transport.release(old.pg, old.group.gen)

    def _bind(self, ctx, group):
        """_bind builds torch's DDP for generation group."""
        self._unbind()
        transport = _transport["now"]
        index = {id(p): i for i, p in enumerate(self.module.parameters())}
        buckets = _Buckets(ctx, group, transport.group(ctx, group), transport, index)
        kwargs = dict(self._kwargs, process_group=_local_group())
        # buffers are not synced per forward (torch 2.x renamed the switch)
        kwargs["forward_sync_buffers" if "forward_sync_buffers" in _DDP_ARGS else "broadcast_buffers"] = False
        ddp = _TorchDDP(self.module, **kwargs)
        ddp.register_comm_hook(None, buckets.hook)
        object.__setattr__(self, "_ddp", ddp)
        object.__setattr__(self, "_buckets", buckets)

    def forward(self, *args, **kwargs):
        ddp = self._ddp
        ctx = elastic._ctx
        if ddp is None or not torch.is_grad_enabled() or ctx is None or ctx.group is None \
                or self._buckets is None or self._buckets.group is not ctx.group:
            return self.module(*args, **kwargs)
        return ddp(*args, **kwargs)


class Optimizer(torch.optim.Optimizer):
    """Optimizer wraps a torch optimizer: step() steps it only once every
    rank agreed (the vote; module docstring) and returns whether it did.
    model is the etjob.elastic.DistributedDataParallel it trains; the
    keyword arguments are more of the state a joiner gets and a checkpoint
    holds: objects with state_dict/load_state_dict (an ElasticSampler,
    committed at each agreed step) or plain values. The step is the
    library's (`steps`)."""

    def __init__(self, optimizer, model, **state):  # noqa: super().__init__ not called: a wrapper
        if isinstance(optimizer, Optimizer):
            raise TypeError("etjob.elastic.Optimizer: the optimizer is wrapped already")
        if not isinstance(model, DistributedDataParallel):
            raise TypeError("etjob.elastic.Optimizer: model must be an etjob.elastic.DistributedDataParallel (whose "
                            "buckets average the gradients), not %s" % type(model).__name__)
        for name in ("model", "optimizer", "step"):
            if name in state:
                raise TypeError("etjob.elastic.Optimizer: %r is a name of etjob's state" % name)
        self.optimizer = optimizer
        self.model = model
        self._state = elastic.State._live_state(model=model.module, optimizer=optimizer, step=0, **state)
        object.__setattr__(self._state, "_wrappers", (self,))  # a scheduler over this wrapper is the state's too
        self._undo = None     # the small objects' state when this step began (put back if it is skipped)
        self._skipped = False
        self._check_every = int(elastic._env_float(contract.ENV_REPLICA_CHECK_STEPS, "100"))
        self._digested = (-1, 0)  # (step, the model's digest at it)
        self._ctx = None
        self._meet = True     # a new generation is needed before the next step
        self._survivor = False
        self._changed = False
        self._acting = None   # the last vote's leave or join, carried out before the next step
        self._late_votes = 0  # votes step() made itself (none went with the last bucket, or buckets came after it)
        self._step_calls = 0  # step() calls (etjob.data: one a batch)
        _optimizers.add(self)

    # torch.optim.Optimizer's attributes are the wrapped one's (schedulers read them)
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def defaults(self):
        return self.optimizer.defaults

    @property
    def state(self):
        return self.optimizer.state

    def __repr__(self):
        return "etjob.elastic.Optimizer(%r)" % (self.optimizer,)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        self.optimizer.add_param_group(param_group)

    def register(self, **state):
        """register adds to the state what exists only once this Optimizer
        does: an LR scheduler over it (or over the optimizer it wraps), a
        GradScaler, an EMA model, plain values. A joiner gets them, a
        checkpoint holds them, a skipped step puts the small ones back.
        Before the first step, on every rank."""
        for name in ("model", "optimizer", "step"):
            if name in state:
                raise TypeError("etjob.elastic.Optimizer.register: %r is a name of etjob's state" % name)
        self._state.register(**state)

    # -- the steps --------------------------------------------------------

    def _small_objects(self):
        """The state's objects a step's rollback copies: neither the model
        nor an optimizer (unchanged by a skipped step), nor a module (an EMA
        model: too large to copy per step), nor one that commits itself (an
        ElasticSampler)."""
        st = self._state
        return {k: o for k, o in st._objects.items()
                if o is not st._objects["model"] and not isinstance(o, (torch.optim.Optimizer, nn.Module))
                and not callable(getattr(o, "commit", None))}

    def _undo_skipped(self):
        """A skipped step is undone: its gradients dropped (a script that
        zeroes them after step() would add them to the retried step's), the
        small objects put back as the step found them (a scaler's update, a
        scheduler stepped whatever step() returned), torch's random streams
        too (state.RandomStreams: the retried step's dropout is its own)."""
        self.optimizer.zero_grad(set_to_none=True)
        for k, o in self._small_objects().items():
            if self._undo is not None and k in self._undo:
                o.load_state_dict(self._undo[k])
        self._skipped = False

    def _keep_start(self):
        """The small objects' state as this step begins (_undo_skipped)."""
        self._undo = {k: state_module._clone(o.state_dict()) for k, o in self._small_objects().items()}

    @property
    def step_count(self):
        """step_count is the number of agreed steps (the state's step)."""
        return self._state.step_of()

    @property
    def checkpoint_wanted(self):
        """Whether a rank's node asked for a checkpoint (its agent's early
        warning), agreed at the last vote."""
        return self._state.checkpoint_wanted

    def steps(self, total):
        """steps yields the agreed step until total: each step once it is
        this rank's turn to do it, again when it was skipped (a failure, and
        then undone: _undo_skipped). Between two steps it meets the others in
        a new generation when one is needed."""
        while True:
            self._between()
            step = self._state.step_of()
            if step >= total:
                self.finish()
                return
            self._keep_start()
            yield step

    def _between(self):
        """_between is what comes between two steps: a skipped step put
        back, an agreed leave or join carried out, a new generation met
        when one is needed (steps, and etjob.data's DataLoader)."""
        if self._skipped:
            self._undo_skipped()  # before the generation's sync, which may bring a newer commit
        if self._acting is not None:
            flags, self._acting = self._acting, None
            try:
                self._state._act(flags)  # a leaver exits 75 here, a stop below min too
            except elastic.MembershipChanged:
                self._meet, self._changed = True, True
            except elastic.CollectiveError as e:
                # who leaves was not agreed: the step is made, the next
                # generation goes on from it and the leaver leaves at its
                # first commit
                elastic._log("after step %d: %s" % (self._state.step_of(), e))
                self._meet = True
        if self._meet:
            self._generation()

    def finish(self):
        """finish ends training here: a checkpoint whose parts are landing
        lands (State._settle_saves), the generation's data group goes, and
        a newcomer still waiting to join leaves (exit 0). steps calls it at
        its end; destroy_process_group for a loop over a DataLoader."""
        if self._ctx is not None and self._ctx.group is not None:
            self._state._settle_saves()  # the last checkpoint's parts, its manifest
        self.model._unbind()
        if self._ctx is not None:
            self._ctx.finished()

    def _ballot(self, buckets, g):
        """_ballot is this rank's vote: State's flags (leave, joins,
        checkpoint), then whether its buckets failed and their layout (as
        itself and negated: one MAX all-reduce finds the largest and the
        smallest)."""
        flags = self._state._flags(g, extra=5)
        x = self._state._extra_at(g)
        layout = buckets.layout if buckets is not None else 0
        flags[x] = 1 if buckets is not None and buckets.failed is not None else 0
        flags[x + 1], flags[x + 2] = layout, -layout
        digest = self._replica_digest()
        flags[x + 3], flags[x + 4] = digest, -digest
        return flags

    def _replica_digest(self):
        """_replica_digest is the replica check's part of a vote: every
        $ETJOB_REPLICA_CHECK_STEPS steps (100; 0: never) a CRC-32 of the
        model's parameters (before this step's update: the same on every
        rank that is in step; buffers are each rank's own,
        state._replica_part), else 0. Every rank is at the same step in a
        generation, so all carry one or none."""
        step = self._state.step_of()
        if not self._check_every or step % self._check_every:
            return 0
        if self._digested[0] != step:  # once a step: a second vote of the step reuses it
            self._digested = (step, state_module._digest(state_module._replica_part(self.model.module)))
        return self._digested[1]

    def _generation(self):
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = elastic._context()
            object.__setattr__(self._state, "_ctx", ctx)
        self.model._unbind()  # the old generation's data group goes before the rendezvous
        self._digested = (-1, 0)  # the sync may bring another model
        g = elastic._meet(ctx, self._state, self._survivor, self._changed)
        self._survivor, self._changed, self._meet = True, False, False
        self.model._bind(ctx, g)
        self.model._buckets.voter = lambda b: self._ballot(b, b.group)

    def step(self, closure=None):
        """step votes, then steps the wrapped optimizer when every rank took
        part and none failed; it returns whether it stepped. A leave or a
        join it agreed on is carried out before the next step (a leaver
        exits 75 there: its last step's loop body runs to its end)."""
        if closure is not None:
            raise TypeError("etjob.elastic.Optimizer.step: a closure is not supported (the vote is one per step)")
        self._step_calls += 1
        self._check_caller()
        state, ctx = self._state, self._ctx
        if ctx is None or ctx.group is None or self._meet:
            raise RuntimeError("etjob.elastic.Optimizer.step outside `for step in opt.steps(total)` and a batch of "
                               "etjob.elastic.DataLoader")
        g = ctx.group
        buckets = self.model._buckets
        x = state._extra_at(g)
        early = buckets.take_vote() if buckets is not None else None
        votes = []
        try:
            if early is not None:
                ctx.wait(early[0], "vote")
                ctx.progressed(g)
                votes.append(early[1])
            if early is None or buckets.hooks:
                # no vote went with the last bucket (no backward pass, or a
                # failed one), or buckets were hooked after it: one more, in
                # the same order on every rank
                flags = self._ballot(buckets, g)
                self._late_votes += 1
                ctx.allreduce(flags, dist.ReduceOp.MAX, "vote")
                votes.append(flags)
        except elastic.CollectiveError as e:
            elastic._log("step %d skipped: %s" % (state.step_of(), e))
            self._meet, self._skipped = True, True
            return False
        finally:
            if buckets is not None:
                buckets.reset()
        flags = torch.stack(votes).max(dim=0).values if len(votes) > 1 else votes[0]
        failed = buckets is not None and buckets.failed is not None
        if flags[x] or failed:
            # a rank's buckets failed before it voted, or this rank's since
            # (the others may step: this rank is then one step behind, and
            # the next generation's sync brings it to the newest commit)
            if failed:
                elastic._log("step %d skipped: %s" % (state.step_of(), buckets.failed))
            self._meet, self._skipped = True, True
            return False
        if any(int(v[x + 1]) != -int(v[x + 2]) for v in votes):
            ctx.end(g.gen, "the ranks' DDP buckets differ")
            raise RuntimeError("etjob.elastic: the ranks' DDP buckets differ (parameters, their order or "
                               "bucket_cap_mb differ between ranks): their gradients cannot be averaged")
        if any(int(v[x + 3]) != -int(v[x + 4]) for v in votes):
            # a divergence: this step is not taken; the next generation's
            # sync names what differs and makes rank 0's commit everyone's
            # ($ETJOB_REPLICA_MISMATCH=fail: the job fails there)
            elastic._log("replica check at step %d: the ranks' models differ (generation %d)" % (state.step_of(), g.gen))
            ctx.end(g.gen, "replica check: the ranks' models differ")
            self._meet, self._skipped = True, True
            return False
        self.optimizer.step()
        for o in state._objects.values():
            if o is not self.optimizer and o is not state._objects["model"] and callable(getattr(o, "commit", None)):
                o.commit()
        state._values["step"] = state.step_of() + 1
        state.commits += 1
        object.__setattr__(state, "checkpoint_wanted", bool(flags[state_module._CHECKPOINT]))
        state._after_vote(flags, g)  # a checkpoint's parts, its manifest
        if flags[state_module._LEAVE] or flags[state_module._JOINS]:
            # a leave or a join: carried out between this step and the
            # next (steps), once the loop's body has finished this one
            self._acting = flags[:x]
        return True

    def _check_caller(self):
        """_check_caller refuses a GradScaler (torch.amp's, or any object
        with scale/unscale_/update and a state) that steps this optimizer
        but is not registered: its scale and growth tracker would start from
        scratch on a joiner. One frame read a step."""
        # GradScaler.step -> _maybe_opt_step -> (a scheduler's step counter) -> here
        f, caller = sys._getframe(2), None
        for _ in range(3):
            if f is None:
                return
            c = f.f_locals.get("self")
            if c is not None and c is not self and all(hasattr(c, a) for a in ("unscale_", "update", "state_dict")):
                caller = c
                break
            f = f.f_back
        if caller is None:
            return
        if not any(o is caller for o in self._state._objects.values()):
            raise TypeError("etjob.elastic.Optimizer: the %s that steps it is not part of the state: a joiner would "
                            "start its scale from scratch. Register it: opt.register(scaler=scaler)" % type(caller).__name__)

    # -- disk -------------------------------------------------------------

    def load_checkpoint(self, directory):
        """load_checkpoint loads the newest checkpoint of directory (before
        the first step); False when there is none."""
        return self._state.load_checkpoint(directory)

    def checkpoint_async(self, directory, done=None):
        """checkpoint_async: State.checkpoint_async of the last agreed step
        (rank 0; a copy of the state is taken here, the disk is written in
        the background)."""
        return self._state.checkpoint_async(directory, done)

    def checkpoint(self, directory):
        """checkpoint: State.checkpoint of the last agreed step (rank 0)."""
        return self._state.checkpoint(directory)

    def flush(self, timeout=None):
        return self._state.flush(timeout)
