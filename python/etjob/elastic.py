"""In-process recovery for PyTorch: survivors never restart (needs PyTorch).

`python3 train.py` in every worker of an ElasticJob (one rank per pod; with
several, `python3 -m etjob.launch train.py`: the pod's ranks are adjacent and
leave and join together), with the training loop written against this
module instead of torchrun:

    import etjob.elastic as elastic

    state = elastic.State(model=model, optimizer=opt, sampler=sampler, step=0)
    state.load_checkpoint(checkpoint_dir)      # a resume from disk, if any

    @elastic.run
    def train(state):
        while state.step < total:
            ...forward, backward...
            elastic.allreduce_gradients(model)  # bounded, abandoned on a failure
            opt.step()
            state.sampler.commit()
            state.step += 1
            state.commit()                      # the step is kept, in memory

    train(state)

This is Horovod's `hvd.elastic.run(train)(state)` with `state.commit()`, on
Debian's torch 1.13 with gloo. What happens (docs/worker-library.md):

* Every rank keeps the state of its last commit in memory (model, optimizer,
  sampler ledger and plain values such as the step).
* A **generation** is one process group of the job. Generations are agreed in
  etjob's rendezvous store (the launcher's `etjob.rdzv`, $ETJOB_RDZV_ENDPOINT),
  under the job's rendezvous id: every rank of generation G+1 builds a new
  gloo group over a store prefix of its own.
* A collective that fails (a dead peer's closed connections), one whose
  generation another rank ended (a peer's heartbeats stopped for
  $ETJOB_HEARTBEAT_TIMEOUT, 5 s: a frozen peer keeps its connections open),
  or one that waited for live peers longer than its deadline
  ($ETJOB_COLLECTIVE_TIMEOUT, 300 s, plus its bytes at
  $ETJOB_MIN_BANDWIDTH_MBPS, 50 MB/s) raises CollectiveError inside the
  collective. `run` then rolls back to the last
  commit, meets the others in generation G+1 and calls the function again:
  the failed step is done again, at most one step is lost. The old group is
  abandoned, never waited for (gloo on torch 1.13 has no abort, and its
  destructor may block on work in flight).
* At `state.commit()` the ranks agree, with one small all-reduce, on who
  leaves (a reclamation notice, a scale-in, a SIGTERM: etjob's node agent says
  so) and whether new workers wait to join. Leavers exit 75 (a preemption),
  the others go on in the next generation without a rollback. When too few
  would be left (below minReplicas), every rank stops at that step, rank 0
  checkpoints it to disk first.
* A joiner gets the state by broadcast from a member that holds the newest
  commit, not from disk, as tensors (etjob.stateio), never as a pickle. Disk
  checkpoints (`state.checkpoint_async(dir)` in the background, or
  `state.checkpoint(dir)`, rank 0) are for a stop below min and the loss of
  the whole job.
* Fencing: a rank whose generation is over (it was frozen and woke up) cannot
  go on in it: its collectives fail and it joins again as a newcomer, taking
  the state by broadcast; `state.checkpoint` refuses to rename a checkpoint
  into place once its generation is over.

Every rank prints `etjob.elastic: generation G rank R/W ...` to stderr on each
new generation; rank 0 prints `resume step=S world=W` like the examples, so
the end-to-end tests' step logs read the same.

By concern: etjob.generations (the store's protocol, heartbeats, bounded
collectives), etjob.state (State: commits, the sync to the ranks behind,
checkpoints), etjob.ddp (DistributedDataParallel, Optimizer and the buckets'
transport), etjob.storeclient (a store client that survives the store's
loss), etjob.stateio (the tensor format); this module is the public API and
the process's exit.
"""

import atexit
import os
import sys
import time

import torch
import torch.distributed as dist

from etjob import EXIT_CODE_PREEMPTED, contract
from etjob import supervisor as sup_module
from etjob.generations import (  # noqa: F401 - the module's names, as before the split
    PROTOCOL, _ABORTABLE, BelowMin, CollectiveError, Context, Group, MembershipChanged, _env_float, _fatal, _log, local_ranks)
from etjob.state import State, _writers
from etjob.storeclient import StoreLost


_ctx = None
_exit = {"code": 0}


def _end_without_teardown():
    """At exit the process ends without tearing gloo down: groups abandoned
    after a failure still have their transport threads, and the library's
    static destructors under them crash the process (SIGSEGV, std::terminate)
    after the training succeeded. The exit code is the one sys.exit was given,
    1 after an uncaught exception, else 0."""
    import logging

    logging.shutdown()
    for t in list(_writers):  # background checkpoints land before the exit
        t.join(_env_float(contract.ENV_CHECKPOINT_FLUSH_SECONDS, "600"))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(_exit["code"])


def _install_exit():
    exit_ = sys.exit
    hook = sys.excepthook

    def recording_exit(code=0):
        _exit["code"] = code if isinstance(code, int) else (0 if code is None else 1)
        if not isinstance(code, (int, type(None))):
            print(code, file=sys.stderr)
        exit_(code)

    def recording_hook(kind, value, tb):
        if issubclass(kind, SystemExit):
            code = value.code
            _exit["code"] = code if isinstance(code, int) else (0 if code is None else 1)
        else:
            _exit["code"] = 1
        hook(kind, value, tb)

    sys.exit = recording_exit
    sys.excepthook = recording_hook
    atexit.register(_end_without_teardown)


def _context():
    global _ctx
    if _ctx is None:
        _install_exit()
        sup = sup_module.Supervisor().start() if os.environ.get(contract.ENV_AGENT_ADDR) else sup_module.Supervisor(agent_addr="")
        _ctx = Context(sup=sup)
        if _ctx.local_size > 1 and torch.cuda.is_available():
            # one device a local rank (etjob.launch), as torchrun's scripts
            # choose it with torch.cuda.set_device(LOCAL_RANK)
            torch.cuda.set_device(_ctx.local_rank % torch.cuda.device_count())
    return _ctx


def run(fn):
    """run wraps a training function fn(state, ...): it meets the others in a
    generation, brings every rank to the newest commit, and calls fn; after a
    failed collective it rolls back to the last commit and does it again, after
    a membership change at a commit it goes on from there. fn's return value is
    returned."""

    def wrapper(state, *args, **kwargs):
        try:
            return _run(fn, state, *args, **kwargs)
        except StoreLost as e:
            _fatal(str(e))

    wrapper.__name__ = getattr(fn, "__name__", "train")
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _run(fn, state, *args, **kwargs):
    """run's loop (run)."""
    ctx = _context()
    object.__setattr__(state, "_ctx", ctx)
    survivor, changed = False, False
    while True:
        _meet(ctx, state, survivor, changed)
        survivor, changed = True, False
        try:
            out = fn(state, *args, **kwargs)
        except CollectiveError as e:
            _log("rolling back to step %d: %s" % (state._committed()["values"].get("step", 0), e))
            state.restore()
        except MembershipChanged:
            changed = True
        else:
            state._settle_saves()  # the last checkpoint's parts, its manifest
            ctx.finished()  # a newcomer still waiting to join leaves (exit 0)
            return out


def init():
    """init forms this rank's first generation now, before the model is
    built (Horovod's hvd.init(); init_process_group calls it): rank() and
    size() are right from here on, so rank-0-only setup (logging, downloads,
    trackers, a learning rate scaled by the world) works, and a checkpoint
    is read by rank 0 alone (load_checkpoint) and sent to the others at the
    first sync. The first sync itself comes with the first step (the state
    exists only then). A rank that joins a running job waits here until the
    members admit it, at one of their commits."""
    ctx = _context()
    if ctx.group is not None:
        return
    try:
        g = ctx.rendezvous(False, False, 0)
    except BelowMin:
        # the job stopped below its minimum while this rank arrived: it
        # holds nothing to save, and goes as the others do
        _log("the job stopped below its minimum while this rank joined; it holds no state and leaves")
        ctx.sup.exit_preempted()
    ctx.eager = g
    _log("generation %d rank %d/%d pid %d: formed at init, before the first step" % (g.gen, g.rank, g.size, os.getpid()))


def _meet(ctx, state, survivor, changed):
    """_meet meets the others in a new generation and brings this rank to
    the newest commit any member holds (State._sync), again until a sync
    succeeds; it returns the generation. survivor and changed are
    Context.rendezvous's. The generation init() formed is the first, unless
    it ended meanwhile (a peer lost while the model was built): then this
    rank, one of its members, meets the others in the next."""
    state._check_registered()  # a scheduler left out is refused by name, before any rank trains with it
    eager, ctx.eager = ctx.eager, None
    if eager is not None and (ctx.group is not eager or ctx.over(eager.gen)):
        survivor, eager = True, None
    while True:
        began = time.monotonic()
        try:
            g, eager = (eager, None) if eager is not None else (ctx.rendezvous(survivor, changed, state.step_of()), None)
        except BelowMin as stop:
            state._stop_below_min(ctx, stop)
        changed = False
        object.__setattr__(state, "_received", 0)
        synced = time.monotonic()
        try:
            src = state._sync()
        except CollectiveError as e:
            _log("sync failed: %s" % e)
            survivor = True
            continue
        took = time.monotonic() - synced
        if src is None:
            how = ""
        elif state._received:
            how = " (state from rank %d: %.1f MB in %.3f s)" % (src, state._received / 2**20, took)
        else:
            how = " (state from rank %d: not needed here, %.3f s)" % (src, took)
        _log("generation %d rank %d/%d pid %d step %d%s rendezvous %.3f s" % (
            g.gen, g.rank, g.size, os.getpid(), state.step_of(), how, time.monotonic() - began))
        state._new_generation(g)  # a checkpoint whose parts the last generation wrote is dropped
        if g.rank == 0:
            print("resume step=%d world=%d generation=%d t=%.3f" % (state.step_of(), g.size, g.gen, time.time()), flush=True)
        return g


def allreduce_(tensor, op=dist.ReduceOp.SUM):
    """allreduce_ reduces tensor in place over this generation (bounded)."""
    return _context().allreduce(tensor, op)


def broadcast_(tensor, src=0):
    """broadcast_ broadcasts tensor in place from rank src (bounded)."""
    return _context().broadcast(tensor, src)


def allreduce_gradients(model, op=dist.ReduceOp.SUM):
    """allreduce_gradients sums the gradients of model's parameters over this
    generation in one bounded all-reduce (what DDP does, without its hooks,
    which cannot be abandoned). Weight each rank's loss by its share of the
    global batch and the sum is the global batch's gradient."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    _context().allreduce(flat, op, "gradients")
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def rank():
    c = _ctx
    return c.group.rank if c and c.group else 0


def size():
    c = _ctx
    return c.group.size if c and c.group else 1


def local_rank():
    """local_rank is this rank's place among its pod's ranks (LOCAL_RANK,
    etjob.launch; 0 with one rank a pod), from its environment: no store
    call, before init as after."""
    return local_ranks()[0]


def local_size():
    """local_size is the number of ranks in this rank's pod
    (LOCAL_WORLD_SIZE, etjob.launch; 1 with one rank a pod)."""
    return local_ranks()[1]


def get_rank():
    """get_rank is torch.distributed's name for rank()."""
    return rank()


def get_world_size():
    """get_world_size is torch.distributed's name for size()."""
    return size()


def init_process_group(backend="gloo", **kwargs):
    """init_process_group is torch.distributed's call, kept so that a DDP
    script adopts etjob.elastic by its import line: it forms the first
    generation (init: rank() and size() are right from here on; the ranks
    meet again in Optimizer.steps after every membership change) and
    chooses the transport of DistributedDataParallel's buckets: gloo (the
    generation's own group; CPU or CUDA tensors) or nccl (a communicator of
    their own each generation; the votes, the state's sync and the
    heartbeats stay on gloo and the store). Others are refused by name."""
    from etjob import ddp

    ddp.use(str(backend))
    unknown = set(kwargs) - {"init_method", "timeout", "world_size", "rank", "store", "group_name", "pg_options", "device_id"}
    if unknown:
        raise TypeError("etjob.elastic.init_process_group: unexpected %s" % ", ".join(sorted(unknown)))
    init()


def destroy_process_group(group=None):
    """destroy_process_group is torch.distributed's call at the end of
    training: the last generation's data group goes, and a rank still
    waiting to join leaves (exit 0). The generation itself ends with the
    process (gloo is never torn down: _end_without_teardown)."""
    if group is not None:
        raise TypeError("etjob.elastic.destroy_process_group: a group of its own is not supported")
    from etjob import ddp

    for opt in ddp.live_optimizers():
        opt.finish()
    if _ctx is not None and not ddp.live_optimizers():
        _ctx.finished()


def supervisor():
    """supervisor is this pod's etjob.supervisor.Supervisor (notices, progress)."""
    return _context().sup


# DDP, the vote-then-step optimizer and the data path, under this module's
# name: etjob.ddp and etjob.data import this module, so they are looked up
# when first asked for (PEP 562), and either module may be imported first.
def __getattr__(name):
    if name in ("DistributedDataParallel", "Optimizer"):
        from etjob import ddp

        return getattr(ddp, name)
    if name in ("DataLoader", "DistributedSampler"):
        from etjob import data

        return getattr(data, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


__all__ = ["State", "run", "init", "allreduce_", "broadcast_", "allreduce_gradients", "rank", "size", "local_rank", "local_size", "supervisor",
           "get_rank", "get_world_size", "init_process_group", "destroy_process_group",
           "DistributedDataParallel", "Optimizer", "DataLoader", "DistributedSampler", "CollectiveError", "MembershipChanged", "EXIT_CODE_PREEMPTED"]
