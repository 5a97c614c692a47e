"""A harness of N etjob.elastic ranks in one process, against the real
rendezvous store (etjob.rdzv in a process of its own, behind the job
secret's authenticating front, reached through this process's tunnel): what
a generation change costs in store calls and time as N grows.

What is real: etjob.elastic's Context (the rendezvous, the heartbeats, the
group setup's store traffic), the store, the front, the tunnel. What is a
FAKE: the process group. FakeGloo stands in for dist.ProcessGroupGloo: it
does the store traffic of torch 2.x's gloo setup (each rank sets its address
under "0/<rank>" and waits for and reads every rank's: measured with a
logging store, see python/tests/test_scale_elastic.py) and then moves its
collectives' tensors between the ranks' threads in memory, no sockets. A
rank is killed by making every one of its store clients hang and its
collectives never arrive: its heartbeats stop, as a dead process's do.

Each rank's loop is the training loop's protocol without a model: a
gradient all-reduce, the commit's vote (N + 5 numbers, rank 0 carrying how
many newcomers wait), a membership change at a vote that carries a join, a
new generation after a failed collective.

Store calls are counted per rank and per kind of work: "rdzv" (from a
rank's entering the rendezvous to its return, the group's setup included),
"watch" (its heartbeat thread) and "train" (the rest)."""

import collections
import os
import sys
import threading
import time
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

from etjob import generations, storeauth, storeclient  # noqa: E402
from etjob.generations import CollectiveError, MembershipChanged  # noqa: E402

_tl = threading.local()


class Counts:
    """Store calls by (rank, kind)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by = collections.Counter()

    def add(self, rank, kind, n=1):
        with self.lock:
            self.by[(rank, kind)] += n

    def total(self, kind=None, ranks=None):
        with self.lock:
            return sum(v for (r, k), v in self.by.items() if (kind is None or k == kind) and (ranks is None or r in ranks))

    def snapshot(self):
        with self.lock:
            return collections.Counter(self.by)


class CountingStore(dist.Store):
    """A c10d store (a Python one: torch's PrefixStore and gloo take it)
    that counts its owner rank's calls to the real client under it, and
    hangs for ever once that rank is killed."""

    def __init__(self, inner, harness, rank):
        super().__init__()
        self._inner, self._h, self._rank = inner, harness, rank
        self.host, self.port = inner.host, inner.port

    def _count(self):
        while self._rank in self._h.killed:
            if self._h.stop:
                # the harness is over: its ranks' calls fail from now on (a
                # later test's store client in this process may call every
                # client's add after a reconnect: storeclient._after_loss)
                raise ConnectionAbortedError("scale_harness: this rank's harness is closed")  # not a RuntimeError: no reconnect
            time.sleep(0.05)
        name = threading.current_thread().name
        kind = "watch" if name == "etjob-heartbeat" else ("rdzv" if name == "etjob-group-setup" else
                                                          self._h.phase.get(self._rank, "train"))
        self._h.counts.add(self._rank, kind)

    def set(self, key, value):
        self._count()
        return self._inner.set(key, value)

    def get(self, key):
        self._count()
        return self._inner.get(key)

    def add(self, key, value):
        self._count()
        return self._inner.add(key, value)

    def compare_set(self, key, expected, desired):
        self._count()
        return self._inner.compare_set(key, expected, desired)

    def check(self, keys):
        self._count()
        return self._inner.check(keys)

    def wait(self, keys, timeout=None):
        self._count()
        return self._inner.wait(keys) if timeout is None else self._inner.wait(keys, timeout)

    def multi_get(self, keys):
        self._count()
        return self._inner.multi_get(keys)

    def delete_key(self, key):
        self._count()
        return self._inner.delete_key(key)

    def num_keys(self):
        self._count()
        return self._inner.num_keys()

    def set_timeout(self, timeout):
        pass


class _Owner:
    """What CountingStore._count needs of its store: the harness and the rank."""

    def __init__(self, harness, rank):
        self._h, self._rank = harness, rank


class _Work:
    def __init__(self, shared):
        self._shared, self.done = shared, False

    def is_completed(self):
        return self.done or self._shared.aborted

    def wait(self, timeout=None):
        if self._shared.aborted and not self.done:
            raise RuntimeError("FakeGloo: the group was aborted")
        return True


class _Shared:
    """The in-memory meeting point of one fake group's ranks."""

    def __init__(self, size):
        self.size, self.lock, self.slots, self.aborted = size, threading.Lock(), {}, False

    def submit(self, seq, rank, tensor, reduce_op, root):
        w = _Work(self)
        with self.lock:
            slot = self.slots.setdefault(seq, {})
            slot[rank] = (tensor, w)
            if len(slot) < self.size:
                return w
            del self.slots[seq]
            ts = [slot[r][0] for r in range(self.size)]
            if root is not None:
                out = ts[root].clone()
            elif reduce_op == "max":
                out = torch.stack(ts).max(0).values
            else:
                out = torch.stack(ts).sum(0)
            for t, wk in slot.values():
                t.copy_(out)
                wk.done = True
        return w


class FakeGloo:
    """FAKE process group (see the module docstring)."""

    groups = {}
    lock = threading.Lock()

    def __init__(self, store, rank, size, timeout):
        store.set("0/%d" % rank, ("%s:%d" % (uuid.uuid4().hex, rank)).encode())
        addrs = []
        for i in range(size):
            store.wait(["0/%d" % i], timeout)
            addrs.append(store.get("0/%d" % i))
        key = tuple(addrs)
        with FakeGloo.lock:
            self._shared = FakeGloo.groups.setdefault(key, _Shared(size))
        self.rank, self.size, self._seq = rank, size, 0
        self._rank_owner = getattr(_tl, "rank", None)

    def _submit(self, tensor, op, root):
        seq, self._seq = self._seq, self._seq + 1
        return self._shared.submit(seq, self.rank, tensor, op, root)

    def allreduce(self, tensors, opts):
        return self._submit(tensors[0], "max" if opts.reduceOp == dist.ReduceOp.MAX else "sum", None)

    def broadcast(self, tensors, opts):
        return self._submit(tensors[0], None, opts.rootRank)

    def abort(self):
        self._shared.aborted = True

    def set_timeout(self, timeout):
        pass


class Harness:
    """N ranks (threads) of one job against an etjob.rdzv store process:
    the one $ETJOB_RDZV_ENDPOINT names, with $ETJOB_STORE_SECRET_FILE's
    secret (each rank's Context reads them, as a worker's does)."""

    def __init__(self, min_size, max_size, step_sleep=0.05, prefix=None):
        self.min, self.max = min_size, max_size
        self.step_sleep = step_sleep
        self.prefix = prefix or "etjob/elastic/scale-%s/" % uuid.uuid4().hex[:8]
        self.counts = Counts()
        self.killed = set()
        self.phase = {}
        self.steps = collections.defaultdict(list)  # rank id -> [(gen, size, t)]
        self.errors = []
        self.entered = []  # when a rank entered a rendezvous
        self.threads = {}
        self.stop = False
        self._next = 0

    def install(self, peer_check=False):
        """install puts the fake group and the counting clients in place of
        the real ones in etjob.generations (undo with uninstall). Without
        peer_check the tunnel takes every connection as this process's
        without looking (storeauth.peer_is_ours): the look reads the network
        namespace's TCP tables, which with N ranks' ~3N sockets in one
        namespace took ~20 ms a connection at N = 128 and serialized the
        ranks' group setups (3 s of a 3.1 s change); a pod's namespace holds
        one rank's few."""
        self._saved = (generations.new_client, generations.dist.ProcessGroupGloo, storeauth.peer_is_ours)
        real_new_client = generations.new_client
        if not peer_check:
            storeauth.peer_is_ours = lambda sock: True
        # torch 1.13: compare_set goes over a connection of its own
        # (storeclient.WireCompareSet), counted here as one call too
        self._saved_wire = storeclient.WireCompareSet.__call__
        wire, harness = self._saved_wire, self

        def counting_wire(w, key, expected, desired):
            CountingStore._count(_Owner(harness, getattr(_tl, "rank", -1)))
            return wire(w, key, expected, desired)

        storeclient.WireCompareSet.__call__ = counting_wire

        def counting_client(host, port, timeout):
            return CountingStore(real_new_client(host, port, timeout), self, getattr(_tl, "rank", -1))

        generations.new_client = counting_client
        generations.dist.ProcessGroupGloo = FakeGloo

    def uninstall(self):
        generations.new_client, generations.dist.ProcessGroupGloo, storeauth.peer_is_ours = self._saved
        storeclient.WireCompareSet.__call__ = self._saved_wire

    def start(self, n=1):
        names = []
        for _ in range(n):
            r = self._next
            self._next += 1
            t = threading.Thread(target=self._rank, args=(r,), name="rank-%d" % r, daemon=True)
            self.threads[r] = t
            t.start()
            names.append(r)
        return names

    def kill(self, r):
        self.killed.add(r)

    def _rank(self, r):
        _tl.rank = r
        try:
            self._train(r)
        except SystemExit as e:
            if r not in self.killed and not self.stop:
                self.errors.append("rank %d exited: %s" % (r, e))
        except BaseException as e:  # noqa: BLE001 - reported by the harness
            if r not in self.killed and not self.stop:
                self.errors.append("rank %d: %r" % (r, e))

    def _rdzv(self, ctx, r, survivor, changed=False):
        self.phase[r] = "rdzv"
        self.entered.append(time.time())
        try:
            return ctx.rendezvous(survivor, changed=changed)
        finally:
            self.phase[r] = "train"

    def _train(self, r):
        ctx = generations.Context(prefix=self.prefix, ident="rank-%d" % r, min_size=self.min, max_size=self.max)
        self.phase[r] = "train"
        g = self._rdzv(ctx, r, False)
        while not self.stop and r not in self.killed:
            try:
                grad = torch.ones(4)
                ctx.allreduce(grad, what="gradients")
                flags = torch.zeros(g.size + 5, dtype=torch.int64)
                if g.rank == 0 and ctx._joins[0] == g.gen and g.size < ctx.max:
                    flags[g.size] = ctx._joins[1]
                ctx.allreduce(flags, dist.ReduceOp.MAX, "commit")
                if r in self.killed:
                    return
                self.steps[r].append((g.gen, g.size, time.time()))
                if flags[g.size]:
                    if g.rank == 0:
                        ctx.end(g.gen, "%d join" % int(flags[g.size]))
                    raise MembershipChanged()
                time.sleep(self.step_sleep)
            except MembershipChanged:
                g = self._rdzv(ctx, r, True, changed=True)
            except CollectiveError:
                if r in self.killed:
                    return
                g = self._rdzv(ctx, r, True)

    # -- what the harness reads -------------------------------------------

    def world(self, r):
        s = self.steps.get(r)
        return (s[-1][0], s[-1][1]) if s else (None, None)

    def wait_all_at(self, ranks, size, timeout, since=0.0):
        """wait_all_at waits until every rank in ranks trained a step in a
        generation of size after time since; returns the latest first such
        step's time."""
        end = time.time() + timeout
        while time.time() < end:
            if self.errors:
                raise AssertionError("; ".join(self.errors))
            firsts = []
            for r in ranks:
                f = [t for (_, n, t) in list(self.steps.get(r, [])) if n == size and t > since]
                if not f:
                    break
                firsts.append(f[0])
            else:
                return max(firsts)
            time.sleep(0.05)
        raise AssertionError("not every rank of %s trained at world %d in %.0f s (worlds: %s)" % (
            sorted(ranks)[:8], size, timeout, {r: self.world(r) for r in sorted(ranks)[:8]}))

    def close(self):
        """close stops every rank: each one's store calls hang from now on."""
        self.stop = True
        self.killed.update(self.threads)


def start_store(port, secret_file, log):
    """start_store runs etjob.rdzv on port behind the job secret's front and
    waits until it listens."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), ETJOB_STORE_SECRET_FILE=secret_file)
    p = subprocess.Popen([sys.executable, "-m", "etjob.rdzv", "--host", "127.0.0.1", "--port", str(port)],
                         env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    if "listening" not in line:
        p.kill()
        raise RuntimeError("the store did not listen: %r" % line)
    return p


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def change(h, survivors, size, victim=None, joiners=0, timeout=120, steady=0.0):
    """change kills victim (or none) and starts joiners, and measures the
    generation change that follows: store calls of the rendezvous (all
    ranks), every store call in the window and those beyond the steady
    traffic (steady: calls a rank and second), and the seconds from the
    fault to every rank training at the new size."""
    before = h.counts.snapshot()
    t0 = time.time()
    if victim is not None:
        h.kill(victim)
    new = h.start(joiners) if joiners else []
    ranks = list(survivors) + new
    back = h.wait_all_at(ranks, size, timeout, since=t0)
    began = min([t for t in h.entered if t >= t0] or [t0])
    after = h.counts.snapshot()
    diff = after - before
    el = time.time() - t0
    rdzv = sum(v for (r, k), v in diff.items() if k == "rdzv")
    # every call in the window beyond the steady traffic of that long
    extra = sum(diff.values()) - steady * el * len(ranks)
    return {"rdzv_calls": rdzv, "calls": sum(diff.values()), "extra_calls": extra, "fault_to_training_s": back - t0,
            "change_s": back - began,
            "ranks": len(ranks), "new": new}
