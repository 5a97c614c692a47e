"""etjob.elastic's state: what survives a failure in memory, its commits,
its transfer to the ranks behind (as tensors, etjob.stateio) and its
checkpoints (one concern of etjob.elastic)."""

import copy
import gc
import os
import threading
import time
import types
import zlib

import torch
import torch.distributed as dist

from etjob import contract, sharded, stateio
from etjob import torch as etorch
from etjob.generations import CollectiveError, MembershipChanged, _env_float, _fatal, _log, pod_wide

_writers = set()  # background checkpoint threads (State.checkpoint_async); flushed at exit


def _clone(obj):
    """_clone is copy.deepcopy for a state: its tensors are copied by torch
    (clone, which lets go of the GIL while it copies, so the heartbeat thread
    beats through a multi-GB commit; a deepcopy holds it), containers are
    rebuilt, other values deep-copied."""
    return stateio.map_tensors(obj, lambda t: t.detach().clone(), copy.deepcopy)


def _too_big(nbytes):
    """_too_big says why a peer's state of nbytes is refused: larger than
    this machine's available memory (MemAvailable), so that a forged size
    does not make every rank allocate it; "" when it fits."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return ""
    if nbytes > avail:
        return "a state of %d MB, more than the %d MB of memory available" % (nbytes >> 20, avail >> 20)
    return ""


def _steppers(optimizers):
    """_steppers are the objects that step with one of optimizers: those
    that hold it as their `optimizer` and have a state (torch's LR
    schedulers, SWALR, ReduceLROnPlateau, a user's own). Found through the
    garbage collector's referrers, once a generation (tens of ms)."""
    found, seen = [], set()
    for o in optimizers:
        for ref in gc.get_referrers(o):
            # an instance's attributes: the instance itself (Python 3.11's
            # inline values) or its __dict__, whose owner refers to it
            owners = [ref] if not isinstance(ref, dict) else \
                [r for r in gc.get_referrers(ref) if getattr(r, "__dict__", None) is ref]
            for owner in owners:
                if id(owner) in seen or isinstance(owner, (type, types.ModuleType, torch.optim.Optimizer)) or \
                        getattr(owner, "optimizer", None) is not o or not hasattr(owner, "state_dict"):
                    continue
                seen.add(id(owner))
                found.append(owner)
    return found


#: The replica check's slots for the parts of a state (one each; the parts
#: past the last share it).
_SLOTS = 16


def _replica_part(obj):
    """_replica_part is what the replica check compares of a part of the
    state: a module's parameters (its buffers, BatchNorm's running
    statistics, are each rank's own: its forward passes see its share of the
    batch, and DDP's buffers are not broadcast here), any other object's
    state_dict, a plain value itself."""
    if isinstance(obj, torch.nn.Module):
        return {k: p.detach() for k, p in obj.named_parameters()}
    return obj.state_dict() if hasattr(obj, "state_dict") else obj


RNG = "_rng"  # the state's name of the process's random streams (RandomStreams)


class RandomStreams:
    """RandomStreams is the part of every State that is torch's random
    streams: the CPU generator's state and, once CUDA is in use, each
    device's. A step's dropout masks (and anything else drawn from torch's
    default generators) come from them, so they are committed with the
    rest: a rollback (the `run` API) and a skipped step (the DDP API) draw
    again what the step drew, a joiner continues the stream of the rank it
    takes the state from (the same stream on every rank when every rank
    seeded alike, as DDP scripts do) and a checkpoint resumes it. The
    replica check leaves it out: ranks may seed their streams apart."""

    def state_dict(self):
        out = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda"] = torch.cuda.get_rng_state_all()
        return out

    def load_state_dict(self, state):
        torch.set_rng_state(state["cpu"])
        cuda = state.get("cuda")
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _digest(obj):
    """_digest is a 31-bit checksum (CRC-32) of a state's layout and bytes:
    equal on two ranks when their states are equal (the replica check)."""
    header, tensors = stateio.flatten(obj)
    crc = zlib.crc32(stateio.dumps(header))
    for v in stateio.byte_views(tensors):
        if v.numel():
            crc = zlib.crc32(memoryview(v.cpu().numpy()), crc)
    return crc & 0x7FFFFFFF


class State:
    """State is what survives a failure in memory: objects with state_dict /
    load_state_dict (a model, an optimizer, an LR scheduler, a GradScaler,
    an ElasticSampler) and plain values (the step, an epoch), read and
    written as attributes. commit() keeps a copy; a rollback (after a
    failed collective) restores it. The library counts the commits itself
    (`commits`: it travels with the state to a joiner and into a
    checkpoint), so a state without a `step` (Horovod's `epoch`, `batch`)
    syncs a joiner too."""

    def __init__(self, **items):
        self._init(items, live=False)

    def _init(self, items, live):
        objects = {k: v for k, v in items.items() if hasattr(v, "state_dict") and hasattr(v, "load_state_dict")}
        objects.setdefault(RNG, RandomStreams())
        values = {k: v for k, v in items.items() if k not in objects}
        object.__setattr__(self, "_objects", objects)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_kept", None)
        object.__setattr__(self, "_ctx", None)
        object.__setattr__(self, "checkpoint_wanted", False)
        object.__setattr__(self, "commits", 0)
        object.__setattr__(self, "_dir", None)
        object.__setattr__(self, "_saving", None)
        object.__setattr__(self, "_request", None)  # rank 0's save, until a vote carries it
        object.__setattr__(self, "_pending", None)  # the sharded save whose parts are landing
        object.__setattr__(self, "_unshared", False)  # rank 0 saw another rank's part missing: whole saves
        object.__setattr__(self, "_received", 0)  # bytes of state the last sync brought this rank
        object.__setattr__(self, "_wrappers", ())  # an etjob Optimizer over the state's optimizer (_check_registered)
        # live: the objects themselves are the commit (etjob.elastic's
        # Optimizer changes them only once every rank agreed to step), so a
        # commit copies nothing and a rollback restores nothing
        object.__setattr__(self, "_live", live)
        self._keep()

    def register(self, **items):
        """register adds objects (an LR scheduler, a GradScaler, an EMA
        model) or plain values to the state after it was made: a scheduler
        wraps the optimizer, so it exists only after it. Before the first
        generation only: every rank's state has one layout."""
        if self._ctx is not None and self._ctx.group is not None:
            raise RuntimeError("etjob.elastic: register(%s) after training began: register before the first step, "
                               "on every rank" % ", ".join(sorted(items)))
        taken = sorted(k for k in items if k in self._objects or k in self._values or k in ("commits", "step"))
        if taken:
            raise TypeError("etjob.elastic: register: %s is a name of the state already" % ", ".join(taken))
        for k, v in items.items():
            if hasattr(v, "state_dict") and hasattr(v, "load_state_dict"):
                self._objects[k] = v
            else:
                self._values[k] = v
        self._keep()

    def _check_registered(self):
        """_check_registered refuses, by name, an object that steps with an
        optimizer of the state (or with the etjob Optimizer that wraps it)
        but is not part of the state: a joiner would start it
        from scratch and a rollback would leave it stepped, and the ranks'
        updates would differ with nothing to say so."""
        held = {id(o) for o in self._objects.values()}
        opts = [o for o in self._objects.values() if isinstance(o, torch.optim.Optimizer)] + list(self._wrappers)
        missing = [o for o in _steppers(opts) if id(o) not in held]
        if missing:
            names = ", ".join("%s (%s.%s)" % (type(o).__name__, type(o).__module__, type(o).__qualname__) for o in missing)
            raise TypeError("etjob.elastic: %s steps with the optimizer but is not part of the state: a joiner "
                            "would start it from scratch and the ranks would train apart. Register it: "
                            "opt.register(scheduler=...) (the DDP API) or State(..., scheduler=...)" % names)

    @classmethod
    def _live_state(cls, **items):
        """_live_state is a State whose live objects are the commit (no copy
        a commit, no rollback): the vote-then-step Optimizer's."""
        state = object.__new__(cls)
        state._init(items, live=True)
        return state

    def __getattr__(self, name):
        d = object.__getattribute__(self, "_objects")
        if name in d:
            return d[name]
        v = object.__getattribute__(self, "_values")
        if name in v:
            return v[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name in self._objects:
            raise AttributeError("%s is an object of the state; load into it instead" % name)
        if name in ("checkpoint_wanted", "commits"):
            object.__setattr__(self, name, value)
        else:
            self._values[name] = value

    @property
    def rank(self):
        return self._ctx.group.rank if self._ctx and self._ctx.group else 0

    @property
    def world(self):
        return self._ctx.group.size if self._ctx and self._ctx.group else 1

    @property
    def generation(self):
        return self._ctx.group.gen if self._ctx and self._ctx.group else 0

    def _snapshot(self):
        return {"objects": {k: _clone(o.state_dict()) for k, o in self._objects.items()},
                "values": _clone(self._values), "commits": self.commits}

    def _load(self, snap, copy=True):
        for k, o in self._objects.items():
            if k == RNG and k not in snap["objects"]:
                continue  # a checkpoint of etjob before the streams were state
            o.load_state_dict(_clone(snap["objects"][k]) if copy else snap["objects"][k])
        self._values.clear()
        self._values.update(_clone(snap["values"]))
        # a checkpoint of etjob before the library counted commits: its step
        object.__setattr__(self, "commits", int(snap.get("commits", snap["values"].get("step", 0))))

    def _keep(self):
        # the old commit goes before the new one is copied: two copies of
        # the state at once (the live one, the commit), not three
        object.__setattr__(self, "_kept", None)
        if not self._live:
            object.__setattr__(self, "_kept", self._snapshot())

    def _committed(self):
        """_committed is the last commit: the kept copy, or (live) the
        objects' own state dicts, not copied."""
        if self._live:
            return {"objects": {k: o.state_dict() for k, o in self._objects.items()}, "values": dict(self._values),
                    "commits": self.commits}
        return self._kept

    def restore(self):
        """restore rolls back to the last commit (nothing to do when live),
        torch's random streams too (RandomStreams: the step done again draws
        what it drew the first time, its dropout masks)."""
        if not self._live:
            self._load(self._kept)

    def step_of(self):
        """step_of is the state's step: its `step` value, else the number of
        commits (a state without a step: Horovod's epoch and batch)."""
        return _step_in(self._values, self.commits)

    def commit(self):
        """commit keeps this step in memory and agrees with the others on who
        leaves and who joins. It raises MembershipChanged when the membership
        changes here (run handles it); a leaver exits 75 inside it."""
        self.commits += 1
        self._keep()
        ctx = self._ctx
        if ctx is None or ctx.group is None:
            return
        g = ctx.group
        flags = self._flags(g, extra=2)
        x = self._extra_at(g)
        digest = self._periodic_digest()
        flags[x], flags[x + 1] = digest, -digest
        ctx.allreduce(flags, dist.ReduceOp.MAX, "commit")
        if int(flags[x]) != -int(flags[x + 1]):
            # a divergence: the generation ends, run rolls back to this
            # commit and the next generation's sync names what differs and
            # makes rank 0's everyone's ($ETJOB_REPLICA_MISMATCH=fail: the
            # job fails there)
            _log("replica check at step %d: the ranks' models differ (generation %d)" % (self.step_of(), g.gen))
            ctx.end(g.gen, "replica check: the ranks' models differ")
            raise CollectiveError("replica check at step %d: the ranks' models differ" % self.step_of())
        self._after_vote(flags, g)
        self._act(flags)

    def _periodic_digest(self):
        """_periodic_digest is the replica check's part of a commit's vote
        (the DDP API's vote carries the same): every
        $ETJOB_REPLICA_CHECK_STEPS commits (100; 0: never) a CRC-32 of the
        state's modules' parameters (buffers are each rank's own), else 0.
        Every rank of a generation is at the same commit, so all carry one
        or none."""
        every = getattr(self, "_check_every", None)
        if every is None:
            every = int(_env_float(contract.ENV_REPLICA_CHECK_STEPS, "100"))
            object.__setattr__(self, "_check_every", every)
        if not every or self.commits % every:
            return 0
        return _digest({k: _replica_part(o) for k, o in self._objects.items() if isinstance(o, torch.nn.Module)})

    def _flags(self, g, extra=0):
        """_flags is this rank's part of a commit's vote: whether it leaves,
        (rank 0) how many newcomers wait, whether a checkpoint is wanted, and
        extra slots after those for the caller (all 0). Its size does not
        grow with the ranks (issue #43): the vote says whether any rank
        leaves; who leaves is asked only then (_act)."""
        # read by rank 0's watcher: no store call per step. A generation at
        # the job's maximum, or whose next legal size (spec.worldSizes) the
        # newcomers do not reach, lets none in (the next one would close at
        # its size again, and end at every commit while one waits): they
        # wait as spares (Context.joining).
        ctx = self._ctx
        joins = ctx.joining(g.size // ctx.local_size, ctx._joins[1]) if g.rank == 0 and ctx._joins[0] == g.gen else 0
        flags = torch.zeros(self._extra_at(g) + extra, dtype=torch.int64)
        sup = ctx.sup
        leaves = not sup.check_alive()
        object.__setattr__(self, "_leaves", leaves)  # what this rank voted: _act's who-leaves asks it
        flags[_LEAVE] = 1 if leaves else 0
        sup.beat(self.step_of(), g.size, g.gen)  # the heartbeat the agent publishes (no store call, no I/O)
        flags[_JOINS] = joins
        flags[_CHECKPOINT] = 1 if sup.should_checkpoint() else 0
        self._save_flags(flags, g)
        return flags

    @staticmethod
    def _extra_at(g):
        """Where a vote's slots for its caller begin: after whether a rank
        leaves, the joins, the checkpoint wanted and the sharded saves'
        slots (the same for every world size)."""
        return _SAVE_AT + _SAVE_SLOTS

    def _who_leaves(self, g):
        """_who_leaves is, after a vote in which a rank leaves, the ranks
        that leave (one all-reduce of one number a rank, only then): every
        rank of a pod when one of them does (pod_wide: a notice reaches each
        rank's poll of the node agent at its own moment)."""
        ctx = self._ctx
        who = torch.zeros(g.size, dtype=torch.int64)
        who[g.rank] = 1 if getattr(self, "_leaves", False) else 0
        ctx.allreduce(who, dist.ReduceOp.MAX, "who leaves")
        return pod_wide(who, g.size, ctx.local_size)

    def _act(self, flags):
        """_act carries out a vote every rank took part in (flags, reduced
        with MAX): leavers exit 75, too few left stops the job at this step,
        a leave or a join ends the generation (MembershipChanged). A pod's
        ranks leave together (_who_leaves); minReplicas counts pods. A
        failed who-leaves all-reduce raises CollectiveError (this commit is
        made: the next generation goes on from it)."""
        ctx = self._ctx
        g, sup = ctx.group, ctx.sup
        object.__setattr__(self, "checkpoint_wanted", bool(flags[_CHECKPOINT]))
        if not flags[_LEAVE] and not flags[_JOINS]:
            return
        who = self._who_leaves(g) if flags[_LEAVE] else torch.zeros(g.size, dtype=torch.int64)
        leaving = int(who.sum())
        staying = [r for r in range(g.size) if not who[r]]
        if leaving and ctx.legal(len(staying) // ctx.local_size) < ctx.min:
            # Too few would be left: everyone stops at this step, agreed by
            # the all-reduce above; rank 0 writes it to disk (the job resumes
            # from it), however long that takes, then ends the generation.
            # The others go at once: a barrier behind the save timed out
            # when the save took longer than a collective may, the
            # generation ended, and the fence then refused the checkpoint.
            if g.rank == 0:
                # the others exit now: their heartbeats stop on purpose, and
                # must not end the generation (the fence would refuse the save)
                ctx.watching = False
                self._stop_checkpoint()
                # over: the job's next pods open a new generation at once
                ctx.end(g.gen, "stopped below min")
                _log("stop step=%d: %d of %d ranks leave, below min %d pods of %d" % (
                    self.step_of(), leaving, g.size, ctx.min, ctx.local_size))
                print("stop step=%d reason=%s t=%.3f" % (self.step_of(), sup.reason() or "peer", time.time()), flush=True)
            sup.exit_preempted()
        if who[g.rank]:
            _log("leaving at step %d (%s)" % (self.step_of(), sup.reason() or "a rank of its pod leaves"))
            sup.exit_preempted()
        if g.rank == staying[0]:
            # The leavers are counted before the generation ends, so that
            # the next one's closer expects the right number.
            if leaving:
                ctx._count("g%d/leave" % g.gen, leaving // ctx.local_size)  # pods, as the close count
            ctx.end(g.gen, "%d leave, %d join at step %d" % (leaving, int(flags[_JOINS]), self.step_of()))
        raise MembershipChanged()

    # -- disk -------------------------------------------------------------

    def _stop_below_min(self, ctx, stop):
        """After a hard loss below the minimum: the saver writes the newest
        commit, ends the generation (the job's next pods open a new one at
        once) and every rank exits 75."""
        sup = ctx.sup
        if stop.saver:
            self._stop_checkpoint()
            ctx.end(stop.gen, "stopped below min after a loss")
            print("stop step=%d reason=%s t=%.3f" % (self.step_of(), "below-min", time.time()), flush=True)
        _log("stop step=%d: %d left after a loss, below min %d" % (self.step_of(), stop.arrived, ctx.min))
        sup.exit_preempted()

    def _stop_checkpoint(self):
        d = self._dir or os.environ.get(contract.ENV_CHECKPOINT_DIR)
        if not d:
            _log("no checkpoint directory (ETJOB_CHECKPOINT_DIR, or one given to checkpoint_async/checkpoint): "
                 "the stop's commit of step %d is not saved" % self.step_of())
        if d:
            self.flush()  # a background save of an older commit lands first
            try:
                self.checkpoint(d)
            except Exception as e:  # noqa: BLE001 - the stop still exits 75
                _log("checkpoint before the stop failed, the job resumes from the previous one: %s" % e)

    def checkpoint_async(self, directory, done=None):
        """checkpoint_async saves a commit in the background (called on rank
        0; the others return False) and returns True at once: training never
        waits for the disk, only for a copy of what a rank writes (live
        state; the `run` API's commit is a snapshot already, not copied).
        In a generation of more than one rank the save is sharded
        (etjob.sharded; $ETJOB_SHARDED_CHECKPOINTS=0: never): the next vote
        carries the request (a small all-reduce after it rank 0's directory
        and the ranks' layouts), every rank writes its part of that vote's
        commit into rank 0's directory (a shared volume), and once a later
        vote says every part landed rank 0 writes the manifest, then
        `latest`. The step saved is that next vote's, not the one at the
        call. A vote that changes the membership, a world of one, or parts
        rank 0 cannot see (a directory that is not shared: then for the
        rest of the run) make it rank 0's whole file of the last commit. One
        save at a time: while one is in flight a new request returns False
        and nothing is queued. A save that fails, or that would move
        `latest` back, or whose generation ended while this rank did not go
        on (a rank that woke from a freeze), is logged and dropped, never
        raised; a part that fails, or a generation that ends before every
        part landed, drops its save. done(path, seconds), when given, is called from the writer
        once the checkpoint landed. Saves in flight are finished at the end
        of training and before the process exits (flush)."""
        ctx = self._ctx
        # every rank remembers the directory: any may save a stop below min
        object.__setattr__(self, "_dir", directory)
        if ctx is not None and ctx.group is not None and ctx.group.rank != 0:
            return False
        if self._busy():
            return False
        if ctx is None or ctx.group is None or ctx.group.size == 1 or self._unshared or not _sharding():
            return self._write_whole(directory, done)
        # every rank writes its part of the commit the next vote agrees
        object.__setattr__(self, "_request", (directory, done, time.monotonic()))
        return True

    def _busy(self):
        """Whether a save is in flight here (rank 0): a writer, a sharded
        save whose parts are landing, or a request the next vote carries."""
        saving = self._saving
        return (saving is not None and saving.is_alive()) or self._pending is not None or self._request is not None

    def _write_whole(self, directory, done, began=None):
        """_write_whole is rank 0's background save of the whole last
        commit (a world of one, sharding off, a vote that changes the
        membership, or ranks that do not agree on the directory)."""
        ctx = self._ctx
        # live, the objects change at the next step: the writer gets a copy
        # (the only one; training waits for that copy, never for the disk)
        kept, gen = (_clone(self._committed()) if self._live else self._kept), self.generation
        step = _step_in(kept["values"], kept["commits"])
        began = time.monotonic() if began is None else began
        return self._writer("checkpoint-%d" % step, step, directory, lambda: dict(kept, step=step, generation=gen),
                            self._fence(ctx, gen, directory, step), done, began, None)

    @staticmethod
    def _fence(ctx, gen, directory, step):
        def fence():
            if ctx is not None and ctx.group is not None and ctx.group.gen == gen and ctx.ended(gen):
                raise etorch.CheckpointError(0, "generation %d ended while this rank did not go on: fenced" % gen)
            latest = etorch.latest_step(directory)
            if latest is not None and latest > step:
                raise etorch.CheckpointError(0, "latest is at step %d already: never moved back" % latest)
        return fence

    def _writer(self, what, step, directory, make, fence, done, began, name):
        """_writer saves make() as a checkpoint in a thread of its own (the
        state's one save in flight)."""

        def write():
            try:
                path = etorch.save_checkpoint(directory, make(), name=name, before_commit=fence)
            except Exception as e:  # noqa: BLE001 - a background save is never fatal
                _log("checkpoint of step %d not written: %s" % (step, e))
                return
            if done is not None:
                try:
                    done(path, time.monotonic() - began)
                except Exception as e:  # noqa: BLE001
                    _log("checkpoint of step %d written; its callback failed: %s" % (step, e))

        t = threading.Thread(target=write, name="etjob-" + what, daemon=True)
        object.__setattr__(self, "_saving", t)
        _writers.add(t)
        t.start()
        return True

    # -- sharded saves (etjob.sharded) -----------------------------------

    def _save_flags(self, flags, g):
        """A vote's slots for sharded saves: whether rank 0 requests one, the
        commit whose part this rank landed (negated: the smallest), and
        whether this rank's part of it failed."""
        at = _SAVE_AT
        if g.rank == 0 and self._request is not None:
            flags[at] = 1
        pend = self._pending
        mine = pend is not None and pend["gen"] == g.gen
        flags[at + 1] = -pend["commits"] if mine and pend["landed"] else 1
        flags[at + 2] = 1 if mine and pend["failed"] else 0

    def _after_vote(self, flags, g):
        """_after_vote carries out a vote's sharded saves (every rank took
        part and its commit is made): rank 0 writes the manifest of a save
        whose every part landed, and a save with a part that failed is
        dropped everywhere (the next request starts afresh); a request
        starts every rank's part of this commit (or rank 0's whole save,
        when the vote changes the membership or a save is still landing)."""
        at = _SAVE_AT
        pend = self._pending
        if pend is not None and pend["gen"] == g.gen:
            if flags[at + 2]:
                object.__setattr__(self, "_pending", None)
                if g.rank == 0:
                    _log("checkpoint of step %d dropped: a rank's part was not written (its stderr says why)" % pend["step"])
            elif -int(flags[at + 1]) == pend["commits"]:
                object.__setattr__(self, "_pending", None)
                if g.rank == 0:
                    self._write_manifest(pend)
        if not flags[at]:
            return
        request = self._request if g.rank == 0 else None
        object.__setattr__(self, "_request", None)
        changing = int(flags[_LEAVE]) or int(flags[_JOINS])
        if changing or self._pending is not None:
            if request is not None:
                _log("checkpoint of step %d written by rank 0 alone (%s)" % (
                    self.step_of(), "the membership changes" if changing else "a save in flight"))
                self._write_whole(request[0], request[1], request[2])
            return
        snap = self._committed()
        # what a whole file holds: the commit, its step and generation
        snap = dict(snap, step=_step_in(snap["values"], snap["commits"]), generation=self.generation)
        header, tensors = stateio.flatten(snap)
        directory, why = self._agree_part(g, request, header)
        if directory is None:
            if request is not None:
                _log("checkpoint of step %d written by rank 0 alone (%s)" % (self.step_of(), why))
                self._write_whole(request[0], request[1], request[2])
            return
        self._write_part(g, directory, request, snap, header, tensors)

    def _agree_part(self, g, request, header):
        """One small all-reduce after a vote that carries rank 0's request
        (every rank knows it does): rank 0's directory (its bytes; the
        others may not know it: a script that calls checkpoint_async on
        rank 0 alone) and a checksum of each rank's state layout (as itself
        and negated), since every rank cuts the state by its own layout.
        Returns (the directory, None), or (None, why) when the layouts
        differ or the collective failed: no part is written."""
        path = os.fsencode(os.path.abspath(request[0])) if request is not None else b""
        t = torch.zeros(_DIR_BYTES + 3, dtype=torch.int64)
        if len(path) > _DIR_BYTES:
            t[_DIR_BYTES] = 1  # too long to carry: rank 0 writes it whole
        elif path:
            t[:len(path)] = torch.tensor(list(path), dtype=torch.int64)
        layout = zlib.crc32(stateio.dumps(header)) & 0x7FFFFFFF
        t[_DIR_BYTES + 1], t[_DIR_BYTES + 2] = layout, -layout
        try:
            self._ctx.allreduce(t, dist.ReduceOp.MAX, "the checkpoint's directory and layout")
        except CollectiveError as e:
            return None, "the ranks could not agree on it: %s" % e
        if t[_DIR_BYTES]:
            return None, "its directory's path is longer than %d bytes" % _DIR_BYTES
        if int(t[_DIR_BYTES + 1]) != -int(t[_DIR_BYTES + 2]):
            return None, "the ranks' states are laid out differently"
        got = bytes(int(b) for b in t[:_DIR_BYTES] if b)
        return os.fsdecode(got), None

    def _write_part(self, g, directory, request, snap, header, tensors):
        """_write_part writes this rank's part of the last commit (snap,
        flattened) in the background (live: a copy of the part first, the
        only wait)."""
        owner = sharded.owners(header, g.size)
        mine = sharded.part_of(tensors, owner, g.rank)
        if self._live:
            mine = [t.clone() for t in mine]
        step = snap["step"]
        pend = {"gen": g.gen, "commits": self.commits, "step": step, "landed": False, "failed": False,
                "header": header, "owner": owner, "world": g.size, "dir": directory, "request": request}
        object.__setattr__(self, "_pending", pend)
        name = sharded.part_name(step, g.rank, g.size)

        def write():
            try:
                etorch.save_part(directory, name, {"tensors": mine, "step": step})
            except Exception as e:  # noqa: BLE001 - the next vote drops the save everywhere
                _log("part %d of the checkpoint of step %d not written: %s" % (g.rank, step, e))
                pend["failed"] = True
                return
            pend["landed"] = True

        t = threading.Thread(target=write, name="etjob-part-%d" % step, daemon=True)
        pend["thread"] = t
        _writers.add(t)
        t.start()

    def _write_manifest(self, pend):
        """Rank 0: every part landed; the manifest, then `latest`. A part
        rank 0 cannot see (the ranks' directories are not one shared
        volume) turns sharding off for the run: this commit is written
        whole instead, and every later save."""
        directory, step, request = pend["dir"], pend["step"], pend["request"]
        done, began = (request[1], request[2]) if request is not None else (None, time.monotonic())
        missing = [n for n in (sharded.part_name(step, r, pend["world"]) for r in range(pend["world"]))
                   if not os.path.exists(os.path.join(directory, n))]
        if missing:
            object.__setattr__(self, "_unshared", True)
            _log("checkpoint of step %d: rank 0 does not see %s in %s (a directory each rank's own, not a shared "
                 "volume?): this step and every later one written whole by rank 0" % (step, ", ".join(missing), directory))
            self._write_whole(directory, done, began)
            return
        state = sharded.manifest(pend["header"], step, pend["world"], pend["owner"])
        self._writer("manifest-%d" % step, step, directory, lambda: state,
                     self._fence(self._ctx, pend["gen"], directory, step), done, began, "ckpt-%08d.etjob" % step)

    def _settle_saves(self):
        """At the end of training, on every rank at the same commit: a
        sharded save whose parts are landing is finished (its parts waited
        for, one small all-reduce says all landed, rank 0 writes the
        manifest), and a request no vote carried is written by rank 0
        whole. Bounded: a failure here drops the save, never the exit."""
        ctx = self._ctx
        g = ctx.group if ctx is not None else None
        pend = self._pending
        if g is not None and pend is not None and pend["gen"] == g.gen:
            pend["thread"].join(_env_float(contract.ENV_CHECKPOINT_FLUSH_SECONDS, "600"))
            t = torch.tensor([0 if pend["landed"] else 1], dtype=torch.int64)
            try:
                ctx.allreduce(t, dist.ReduceOp.MAX, "the last checkpoint's parts")
            except CollectiveError as e:
                _log("checkpoint of step %d dropped at the end: %s" % (pend["step"], e))
                t[0] = 1
            object.__setattr__(self, "_pending", None)
            if not int(t[0]) and g.rank == 0:
                self._write_manifest(pend)
        object.__setattr__(self, "_pending", None)
        request = self._request
        object.__setattr__(self, "_request", None)
        if request is not None:
            self.flush()
            self._write_whole(request[0], request[1], request[2])

    def _new_generation(self, g):
        """A save whose parts a generation was writing ends with it (its
        ranks are not the next one's): dropped, said by rank 0. A request no
        vote carried stays with a rank 0 that is rank 0 again, and goes
        otherwise (the new rank 0 decides its own saves)."""
        if g.rank != 0:
            object.__setattr__(self, "_request", None)
        pend = self._pending
        if pend is not None and pend["gen"] != g.gen:
            object.__setattr__(self, "_pending", None)
            if pend["request"] is not None:
                _log("checkpoint of step %d dropped: generation %d ended before every part landed" % (
                    pend["step"], pend["gen"]))

    def flush(self, timeout=None):
        """flush waits for the background save in flight, if any (True when
        none is left)."""
        t = self._saving
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    def checkpoint(self, directory):
        """checkpoint writes the last commit to disk (rank 0; others return
        None). It is fenced: once this rank's generation is over it does not
        rename the file into place, so a rank that wakes from a freeze cannot
        put an old state back under `latest`."""
        ctx = self._ctx
        object.__setattr__(self, "_dir", directory)  # every rank: any may save a stop below min
        if ctx is not None and ctx.group is not None and ctx.group.rank != 0:
            return None
        state = dict(self._committed())
        state["step"] = _step_in(state["values"], state["commits"])
        state["generation"] = self.generation

        def fence():
            if ctx is not None and ctx.group is not None and ctx.ended(ctx.group.gen):
                raise etorch.CheckpointError(0, "generation %d is over: this rank is fenced" % ctx.group.gen)

        return etorch.save_checkpoint(directory, state, before_commit=fence)

    def load_checkpoint(self, directory):
        """load_checkpoint loads the newest checkpoint of directory (written by
        checkpoint) and keeps it as the commit; False when there is none."""
        # every rank remembers the directory, a fresh run too: any may save a stop below min
        object.__setattr__(self, "_dir", directory)
        from etjob import elastic

        ctx = elastic._ctx
        if ctx is not None and ctx.eager is not None and ctx.eager is ctx.group and ctx.group.rank != 0:
            # the first generation formed at init: rank 0 reads the file and
            # the first sync sends it to the others, once
            found = etorch.latest_step(directory) is not None
            if found:
                _log("checkpoint in %s: read by rank 0, sent to this rank at the first sync" % directory)
            return found
        got = etorch.load_checkpoint(directory)
        if got is None:
            return False
        self._load(got)
        self._keep()
        return True

    # -- sync -------------------------------------------------------------

    @staticmethod
    def _refuse(ctx, g, src, why):
        """_refuse ends the generation over a state that rank src sent and
        this rank will not take, so that no one waits for it in the chunks
        that follow, and raises CollectiveError (run meets the others again)."""
        ctx.end(g.gen, "rank %d's state refused: %s" % (src, why))
        raise CollectiveError("sync: rank %d sent %s" % (src, why))

    def _sync(self):
        """After a rendezvous: every rank takes the newest commit any member
        holds, from the lowest rank holding it, as tensors (etjob.stateio: a
        JSON header, then the tensors' bytes in chunks of at most
        $ETJOB_SYNC_CHUNK_MB, 64), never as a pickle: reading a peer's state
        runs none of its code. Each chunk is its own bounded collective, so
        a multi-GB state is never taken for a frozen peer and the sender
        starts at once (it serialises nothing). Only the ranks behind (an
        older step, or another layout) receive the bytes, into new tensors
        that then become their commit: by broadcast when every other rank
        is behind, else in a group of the sender and them; the ranks
        already current wait in one small all-reduce whose deadline counts
        those bytes."""
        ctx, g = self._ctx, self._ctx.group
        # the library's commit count, not the script's step: a state
        # without a step (epoch, batch) syncs a joiner too
        steps = torch.full((g.size,), -1, dtype=torch.int64)
        steps[g.rank] = self.commits
        ctx.allreduce(steps, dist.ReduceOp.MAX, "sync")
        newest = int(steps.max())
        if int(steps.min()) == newest:
            src = self._compare_replicas(ctx, g, newest)
            if src is None:
                return None
            current = g.rank == src  # the others take src's state whole
        else:
            src = int((steps == newest).nonzero()[0])
            current = int(steps[g.rank]) == newest
        mine = None
        if g.rank == src or current:
            header, tensors = stateio.flatten(self._committed())
            mine = stateio.dumps(header)
        size = torch.zeros(1, dtype=torch.int64)
        if g.rank == src:
            size[0] = len(mine)
        ctx.broadcast(size, src, "sync header size")
        n = int(size[0])
        if not 0 < n <= stateio.MAX_HEADER:
            self._refuse(ctx, g, src, "a state header of %d bytes (at most %d)" % (n, stateio.MAX_HEADER))
        raw = torch.frombuffer(bytearray(mine), dtype=torch.uint8) if g.rank == src else torch.empty(n, dtype=torch.uint8)
        ctx.broadcast(raw, src, "sync header")
        if g.rank != src:
            try:
                got = stateio.loads(raw.numpy().tobytes())
            except stateio.FormatError as e:
                self._refuse(ctx, g, src, str(e))
            if current and stateio.dumps(got) != mine:
                current = False  # the same step, another layout: take it as new
            if not current:
                too_big = _too_big(got["nbytes"])
                if too_big:
                    self._refuse(ctx, g, src, too_big)
                tensors = stateio.allocate(got)
            header = got
        need = torch.zeros(g.size, dtype=torch.int64)
        need[g.rank] = 1 if g.rank != src and not current else 0
        ctx.allreduce(need, dist.ReduceOp.MAX, "sync who is behind")
        behind = [r for r in range(g.size) if need[r]]
        total = header["nbytes"]
        if len(behind) == g.size - 1:
            self._move(ctx, src, tensors, total)
        else:
            sub, main = None, ctx.group
            try:
                if g.rank == src or g.rank in behind:
                    # a group of the sender and the ranks behind: a
                    # broadcast's work completes on its own (gloo's send and
                    # recv complete only inside a blocking wait, which could
                    # not be abandoned)
                    ranks = sorted([src] + behind)
                    sub = ctx.subgroup(ranks, "sync")
                    ctx.group = sub
                    self._move(ctx, ranks.index(src), tensors, total)
                    ctx.group = main
                # the others wait here for the bytes they do not take (and
                # the sender's group for them to be read, before its retire)
                ctx.wait_all("sync to %d rank(s) behind" % len(behind), total * len(behind), ctx.setup_limit())
            finally:
                ctx.group = main
                if sub is not None:
                    ctx._retire(sub)
        if g.rank != src and not current:
            snap = stateio.unflatten(header, tensors)
            if self._live:
                self._load(snap, copy=False)  # the objects copy them in
            else:
                # the received tensors are the commit (this rank's older one
                # is let go first); the objects load copies of them
                object.__setattr__(self, "_kept", snap)
                self._load(snap)
            object.__setattr__(self, "_received", total)
        return src

    def _compare_replicas(self, ctx, g, commits):
        """_compare_replicas is the replica check of a sync where every rank
        holds the same number of commits: one small all-reduce of each part
        of the state's digest (etjob.state._digest, as itself and negated:
        the largest and the smallest). Equal everywhere: None. Otherwise the
        ranks differ: at commit 0 (ranks that built their models from
        different seeds; Horovod's broadcast from rank 0 at the start) rank
        0's state is everyone's, quietly; later it is a divergence, said
        loudly, naming the parts that differ, and rank 0's commit is
        everyone's again ($ETJOB_REPLICA_MISMATCH=fail: the job fails
        instead). Returns the rank whose state the others take."""
        snap = self._committed()
        parts = dict(self._objects, values=self._values) if self._live else None
        names = sorted(k for k in snap["objects"] if k != RNG) + ["values"]  # ranks may seed their streams apart
        # a fixed size whatever the state holds (ranks whose states differ
        # in layout must still meet in one all-reduce): slot 0 the parts'
        # names, then a slot a part, the parts past _SLOTS sharing the last
        digests = [0] * (_SLOTS + 1)
        digests[0] = zlib.crc32(",".join(names).encode()) & 0x7FFFFFFF
        for i, k in enumerate(names):
            last = k == "values" and i == len(names) - 1
            if parts is not None:  # live: the objects themselves (a module's parameters)
                d = _digest(_replica_part(parts["values"] if last else parts[k]))
            else:  # the kept commit: a module's buffers left out of it
                d = _digest(snap["values"] if last else self._without_buffers(k, snap["objects"][k]))
            j = 1 + min(i, _SLOTS - 1)
            digests[j] = (digests[j] * 1000003 + d) % (1 << 62)
        t = torch.tensor(digests, dtype=torch.int64)
        both = torch.cat([t, -t])
        ctx.allreduce(both, dist.ReduceOp.MAX, "replica check")
        n = _SLOTS + 1
        if int(both[0]) != -int(both[n]):
            differ = ["layout (the parts: %s here)" % ", ".join(names)]
        else:
            differ = [names[i] if i < _SLOTS - 1 else "the parts from %s on" % names[i]
                      for i in range(min(len(names), _SLOTS)) if int(both[1 + i]) != -int(both[n + 1 + i])]
        if not differ:
            return None
        if commits:
            msg = "replica check: after %d commits the ranks' %s differ (generation %d): a divergence; " % (
                commits, ", ".join(differ), g.gen)
            if os.environ.get(contract.ENV_REPLICA_MISMATCH, "") == "fail":
                _fatal(msg + "the job fails ($%s=fail)" % contract.ENV_REPLICA_MISMATCH)
            _log(msg + "every rank takes rank 0's commit")
        elif g.rank == 0:
            _log("the ranks start from different states (%s): rank 0's is everyone's" % ", ".join(differ))
        return 0

    def _without_buffers(self, name, sd):
        """_without_buffers is the kept state_dict sd of the part name with a
        module's buffers left out (_replica_part)."""
        o = self._objects.get(name)
        if not isinstance(o, torch.nn.Module):
            return sd
        params = {k for k, _ in o.named_parameters()}
        return {k: v for k, v in sd.items() if k in params}

    @staticmethod
    def _move(ctx, src, tensors, total):
        """_move broadcasts the state's bytes from src over ctx's group,
        chunk by chunk, each a bounded collective."""
        g = ctx.group
        views = stateio.byte_views(tensors)
        chunk = max(int(_env_float(contract.ENV_SYNC_CHUNK_MB, "64") * 2**20), 1)
        buf = None
        for start in range(0, total, chunk):
            end = min(start + chunk, total)
            what = "sync state %d-%d of %d MB" % (start >> 20, end >> 20, total >> 20)
            pieces = list(stateio.segments(views, start, end))
            if len(pieces) == 1:  # inside one tensor: its bytes move in place
                v, b, e, _ = pieces[0]
                ctx.broadcast(v[b:e], src, what)
                continue
            if buf is None:
                buf = torch.empty(min(chunk, total), dtype=torch.uint8)
            part = stateio.pack(views, start, end, buf) if g.rank == src else buf[:end - start]
            ctx.broadcast(part, src, what)
            if g.rank != src:
                stateio.unpack(views, start, end, part)


# A commit's vote (State._flags, reduced with MAX): whether a rank leaves,
# how many newcomers wait (rank 0's), whether a checkpoint is wanted, then
# _SAVE_SLOTS for sharded saves (State._save_flags), then the caller's.
_LEAVE, _JOINS, _CHECKPOINT, _SAVE_AT = 0, 1, 2, 3
_SAVE_SLOTS = 3
_DIR_BYTES = 4096  # the longest checkpoint directory path a sharded save carries (PATH_MAX)


def _sharding():
    """Whether a checkpoint is written by every rank ($ETJOB_SHARDED_CHECKPOINTS,
    1; 0: by rank 0 alone)."""
    return os.environ.get(contract.ENV_SHARDED_CHECKPOINTS, "1") != "0"


def _step_in(values, commits):
    """_step_in is a state's step: its `step` value, else its commits."""
    return int(values["step"]) if "step" in values else int(commits)
