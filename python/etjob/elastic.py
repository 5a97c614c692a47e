"""In-process recovery for PyTorch: survivors never restart (needs PyTorch).

`python3 train.py` in every worker of an ElasticJob (one rank per pod), with
the training loop written against this module instead of torchrun:

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
"""

import atexit
import copy
import ctypes
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from etjob import EXIT_CODE_PREEMPTED
from etjob import stateio
from etjob.storeclient import StoreClient, StoreLost, new_client
from etjob import supervisor as sup_module
from etjob import torch as etorch


class CollectiveError(RuntimeError):
    """A collective of this generation failed, timed out or was abandoned:
    `run` rolls back to the last commit and meets the others again."""


class MembershipChanged(Exception):
    """Raised by State.commit when members leave or join at this commit: the
    step is committed, `run` meets the others in the next generation."""


class BelowMin(Exception):
    """Raised by Context.rendezvous when the survivors of a hard loss stayed
    below the minimum for $ETJOB_BELOW_MIN_SECONDS: every rank that arrived
    stops (exit 75); the one holding the newest commit (the lowest such rank)
    saves it first (saver)."""

    def __init__(self, gen, saver, arrived):
        super().__init__("generation %d: %d arrived, below the minimum" % (gen, arrived))
        self.gen, self.saver, self.arrived = gen, saver, arrived


# The store protocol's version (the keys of Context's docstring): ranks of
# one job that speak another, or run another torch, refuse to go on.
PROTOCOL = 2
# Added to a generation's close count when its closer stops it below min.
_STOP = 1 << 40
# A rank's arrival code (g<G>/m<i>): 1 + (its old rank, or _MEMBER_LATE for a
# former member that comes back as a newcomer, or _NEWCOMER) + its committed
# step (at most _STEP_MAX) times 2^33.
_NEWCOMER, _STEP_SHIFT = 1 << 32, 33
_MEMBER_LATE = _NEWCOMER - 1
_MEMBER_MASK = (1 << _STEP_SHIFT) - 1
_STEP_MAX = (1 << 30) - 1


def _env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        sys.exit("etjob.elastic: %s=%r is not a number of seconds" % (name, os.environ.get(name)))


def _log(msg):
    sys.stderr.write("etjob.elastic: %s t=%.3f\n" % (msg, time.time()))
    sys.stderr.flush()


def _raise_fd_limit():
    """On a torch whose gloo groups cannot be aborted (1.13) every generation
    left behind keeps its sockets (+6 fds and +4 threads a generation,
    measured): the soft limit on open files goes up to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _fatal(msg):
    """_fatal ends this rank with msg (exit 1): a mistake no retry mends."""
    sys.exit("etjob.elastic: " + msg)


def _torch_minor():
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _keep_forever(obj):
    """_keep_forever leaks obj on purpose: a gloo group is never destroyed,
    not when abandoned and not at exit. torch 1.13's gloo has no abort, its
    destructor waits for work in flight, and a peer's closed connection in a
    group being torn down ends the process (std::terminate)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class Group:
    """Group is one generation: its number, this rank, its size, its gloo
    group (and, where groups can be aborted, the store client of its setup)."""

    def __init__(self, gen, rank, size, pg, ids, client=None):
        self.gen, self.rank, self.size, self.pg, self.ids = gen, rank, size, pg, ids
        self.client = client
        self.work = None  # the work in flight, while this rank waits for it (or after it gave up on it)


# torch 2.x's gloo groups have abort(), which ends their work in flight and
# their connections: a generation left behind is aborted and let go. torch
# 1.13's have none, and are leaked instead (_keep_forever).
_ABORTABLE = hasattr(dist.ProcessGroupGloo, "abort")
_SET_TIMEOUT = hasattr(dist.ProcessGroupGloo, "set_timeout")


class Context:
    """Context talks to the rendezvous store and runs this rank's collectives.

    Store keys, under etjob/elastic/<rendezvous id>/, all counters (store.add):
      gen            the newest generation (a counter; 0: none yet)
      g<G>/n         arrivals in generation G; g<G>/m<i> who came i-th (1 +
                     the old rank, + 2^32 for a newcomer)
      g<G>/close     added once by the first arrival: how many are in G
                     (+ 2^40 when it stopped G below min)
      g<G>/cb        the closer's heartbeats while it waits to close G: the
                     others end G when they stop (no single closer stalls it)
      g<G>/pg/       the gloo group's own keys
      g<G>/end       >0 once G is over (a failure, a leave, a join, a timeout)
      g<G>/leave     how many members of G leave at its last commit
      g<G>/joins     how many newcomers wait for G+1
      g<G>/hb<r>     rank r's heartbeats in G (its watcher adds one a beat)
      kinds, kind<i> the protocol and torch versions seen in the job;
      proto/<kind>   how many ranks registered that kind (protocol 2 on)
      lineage        in a store that replaced one: "members" once a member
                     re-seeded it, "newcomers" once newcomers gave up
                     waiting for that and opened generation 1 (set once)
    and, outside the job's prefix:
      etjob/store/id           a token naming this store (set once)
      etjob/store/replacement  >0: the store replaces one (etjob.rdzv)

    `gen` is a hint: the newest generation is the first from it whose `end`
    is 0, so ending a generation is the one store call `g<G>/end`, and a rank
    that dies between that call and the hint's bump stalls no one.

    The store may be lost and replaced (spec.recovery InProcess): the ranks
    train on in their generation (its gloo group needs no store), their
    store clients connect again (etjob.storeclient) and each re-seeds the
    new store with what it knows (_reseed): its generation, closed with its
    size, before the `gen` hint, so that a newcomer joins the members
    instead of opening a generation beside them. A newcomer in a replaced
    store waits up to $ETJOB_RESEED_SECONDS (15 s) for that before it opens
    generation 1 (the members are gone, or all frozen: those then exit 75).

    Liveness is the heartbeats, not the collectives' pace: each rank's
    watcher thread (a store client of its own, off the training's path)
    beats every heartbeat_timeout/5 seconds, watches the next rank's beats
    and ends the generation when they stop for heartbeat_timeout
    ($ETJOB_HEARTBEAT_TIMEOUT, 5 s): a dead or frozen rank is found in about
    that long, whatever its collectives move. A collective waits for live
    peers up to collective_timeout ($ETJOB_COLLECTIVE_TIMEOUT, 300 s) plus
    its bytes at $ETJOB_MIN_BANDWIDTH_MBPS: a peer that is slow (loading a
    multi-GB state, a long step) is a straggler, not a failure.
    """

    def __init__(self, store=None, prefix=None, ident=None, min_size=None, max_size=None, sup=None):
        endpoint = os.environ.get("ETJOB_RDZV_ENDPOINT") or os.environ.get("PET_RDZV_ENDPOINT", "")
        self.collective_timeout = _env_float("ETJOB_COLLECTIVE_TIMEOUT", "300")
        self.heartbeat_timeout = _env_float("ETJOB_HEARTBEAT_TIMEOUT", "5")
        # A collective's deadline grows with the bytes it moves, at this
        # slowest rate a healthy group is expected to keep (bytes/s): a 4 GB
        # state broadcast or gradient all-reduce is not taken for a frozen
        # peer. The default, 50 MB/s, is a slow network; gloo on loopback
        # moved ~1 GB/s on this project's 2-core machines.
        self.min_bandwidth = _env_float("ETJOB_MIN_BANDWIDTH_MBPS", "50") * 1e6
        self.settle = _env_float("ETJOB_SETTLE_SECONDS", "0.5")
        self.join_timeout = _env_float("ETJOB_JOIN_TIMEOUT", "600")
        # survivors of a hard loss below minReplicas wait this long for
        # replacements, then the newest commit is saved and every rank exits 75
        self.below_min_wait = _env_float("ETJOB_BELOW_MIN_SECONDS", "60")
        # a newcomer ends a generation whose rank 0 sent no heartbeat for
        # this long: its members are gone (the whole job lost at once)
        self.stale = _env_float("ETJOB_STALE_SECONDS", str(3 * self.heartbeat_timeout))
        self.poll = 0.01
        if store is None:
            if not endpoint:
                sys.exit("etjob.elastic: ETJOB_RDZV_ENDPOINT is not set (host:port of the job's rendezvous store)")
            host, _, port = endpoint.rpartition(":")
            try:
                store = new_client(host, int(port), timedelta(seconds=30))
            except RuntimeError as e:
                sys.exit("etjob.elastic: no rendezvous store at %s (ETJOB_RDZV_ENDPOINT): %s; a torch %s client "
                         "cannot talk to a store of another torch major version: run the launcher and the workers "
                         "on one torch" % (endpoint, (str(e).splitlines() or ["?"])[0], torch.__version__))
        # how long a lost store is waited for; how long a newcomer in a
        # replaced store waits for the members to re-seed it
        self.store_loss = _env_float("ETJOB_STORE_LOSS_SECONDS", "600")
        self.reseed_wait = _env_float("ETJOB_RESEED_SECONDS", str(self.stale))
        self.host, self.port = store.host, store.port
        self._reseed_lock = threading.RLock()
        self._store_since = time.monotonic()  # when this rank connected to the store it uses now
        self._store_id = None    # the token of that store (etjob/store/id)
        self._member_of = None   # the token of the store this rank last became a member in
        self._orphaned = False   # the job went on without this rank while its store was replaced
        self.store = StoreClient(store, self.host, self.port, limit=self.store_loss, on_connect=self._reseed)
        rid = os.environ.get("PET_RDZV_ID") or os.environ.get("ETJOB_RDZV_ID") or "default"
        self.prefix = prefix if prefix is not None else "etjob/elastic/%s/" % rid
        self.id = ident or os.environ.get("ETJOB_POD_NAME") or "%s-%d" % (os.uname().nodename, os.getpid())
        lo, _, hi = os.environ.get("PET_NNODES", "1:1000000").partition(":")
        self.min = min_size if min_size is not None else int(lo or 1)
        self.max = max_size if max_size is not None else int(hi or lo or 1000000)
        self.sup = sup
        self.group = None
        self._over = -1         # the newest generation the watcher saw ended
        self._joins = (0, 0)    # (generation, newcomers waiting for it), rank 0's watcher
        self._watcher = None
        self.watching = True    # False while rank 0 saves a stop: the others are gone on purpose
        self._seen = 0          # the newest generation this rank has seen (current() walks on from it)
        self._parked = []       # aborted groups whose work is still in flight (_retire)
        self._kinds_seen = 0    # how many kinds check_kinds last saw
        self._was_member = False  # this rank has been a member of a generation: it holds a commit
        if not _ABORTABLE:
            _raise_fd_limit()
        self.kind = "p%d-torch%s" % (PROTOCOL, _torch_minor())
        self._handshake(_env_float("ETJOB_STORE_PROBE_SECONDS", "15"))

    # -- store helpers ----------------------------------------------------

    def _k(self, key):
        return self.prefix + key

    def _count(self, key, delta=0):
        return int(self.store.add(self._k(key), delta))

    def current(self):
        """current is the newest generation: the first one not over, walking
        on from the `gen` hint (and from what this rank saw before)."""
        g = max(self._count("gen"), self._seen)
        while self.ended(g):
            g += 1
        self._seen = g
        return g

    def _handshake(self, limit):
        """_handshake registers this rank's kind (the store protocol and torch
        versions) and refuses to go on when the job has ranks of another
        kind. Its first store call is bounded: a torch 1.13 client waits for
        ever on a torch 2.x store's reply."""
        got = []

        def probe():
            try:
                got.append(self._count("proto/" + self.kind, 1))
            except Exception as e:  # noqa: BLE001 - said below
                got.append(e)

        t = threading.Thread(target=probe, name="etjob-store-probe", daemon=True)
        t.start()
        t.join(limit)
        if not got:
            _fatal("the rendezvous store at %s:%s did not answer in %.0f s. A torch 1.13 client (this worker runs "
                   "torch %s) gets no reply from a store served by torch 2.x: run the launcher and the workers on "
                   "one torch" % (self.host, self.port, limit, torch.__version__))
        if isinstance(got[0], Exception):
            _fatal("the rendezvous store at %s:%s: %s" % (self.host, self.port, (str(got[0]).splitlines() or ["?"])[0]))
        if got[0] == 1:
            i = self._count("kinds", 1)
            self.store.set(self._k("kind%d" % i), self.kind)
        self._store_id = self._name_store(self.store)
        self.check_kinds()

    @staticmethod
    def _name_store(client):
        """The token naming the store client talks to: the first client to
        ask sets it (any store: the launcher's etjob.rdzv or a test's)."""
        mine = "%d-%d-%d" % (os.getpid(), time.time_ns(), id(client))
        return client.compare_set("etjob/store/id", "", mine).decode()

    def _reseed(self, client):
        """_reseed runs on every new connection of a store client (this
        rank's or its watcher's): when the store is a new one, the job's
        keys are gone, and this rank puts back what it knows. All of it is
        idempotent, so it is done on every reconnect, to an old store too:
        its kind; its running generation, closed with its size (a newcomer
        then asks to join it instead of closing it alone); the `gen` hint,
        raised to the newest generation it has seen. In a store that
        replaced one it first claims the store's lineage for the members: a
        rank that finds it claimed by newcomers (none of the members came
        back within their wait) was left behind and exits 75 at its next
        rendezvous."""
        with self._reseed_lock:
            self._store_since = time.monotonic()
            ident = self._name_store(client)
            self._store_id = ident
            k = self._k
            if int(client.add(k("proto/" + self.kind), 0)) == 0 and int(client.add(k("proto/" + self.kind), 1)) == 1:
                i = int(client.add(k("kinds"), 1))
                client.set(k("kind%d" % i), self.kind)
            if not self._was_member:
                return
            if self._member_of != ident and int(client.add("etjob/store/replacement", 0)) > 0:
                lineage = client.compare_set(k("lineage"), "", "members").decode()
                if lineage != "members":
                    _log("the rendezvous store was replaced and the job went on without this rank (its newcomers "
                         "opened generation 1 after %.0f s without a member): this rank leaves" % self.reseed_wait)
                    self._orphaned = True
                    g = self.group
                    if g is not None:
                        self._over = max(self._over, g.gen)  # its collectives end: run meets the others, and leaves
                    return
            g = self.group
            mine = self._seen
            if g is not None and self.over(g.gen):
                mine = max(mine, g.gen + 1)  # over: a newcomer must not walk into it and close it alone
            elif g is not None:
                # a read of the count before this (add 0) stores "0", which
                # compare_set from "" would not replace
                key = k("g%d/close" % g.gen)
                if int(client.add(key, 0)) == 0:
                    client.compare_set(key, "0", str(g.size))
                mine = max(mine, g.gen)
            cur = int(client.add(k("gen"), 0))
            while cur < mine:
                cur = int(client.compare_set(k("gen"), str(cur), str(mine)))
            _log("store re-seeded: generation %s, hint %d" % (g.gen if g is not None else "none", mine))

    def _awaiting_members(self):
        """Whether a newcomer that finds no generation must wait before it
        opens the first: the store replaced one, and the members may still
        come to re-seed it (up to reseed_wait after this rank connected).
        Once it gave up waiting, it claims the store's lineage for the
        newcomers; a member that claimed it first makes it wait for the
        `gen` hint instead."""
        if int(self.store.add("etjob/store/replacement", 0)) <= 0:
            return False
        if time.monotonic() - self._store_since < self.reseed_wait:
            return True
        lineage = self.store.compare_set(self._k("lineage"), "", "newcomers").decode()
        if lineage == "members":
            return True
        _log("no member re-seeded the replaced rendezvous store in %.0f s: opening generation 1" % self.reseed_wait)
        return False

    def check_kinds(self):
        """check_kinds exits, naming both, when this rank's kind (protocol
        and torch versions) is not the job's: the first kind registered. A
        rank of another kind that comes later is refused at its own check;
        the members it would have joined go on (said once)."""
        n = self._count("kinds")
        if n <= 1 or n == self._kinds_seen:
            return
        self._kinds_seen = n
        # (no Store.check on torch 1.13: an empty value is a missing one)
        job = self.store.compare_set(self._k("kind1"), "", "").decode()
        if not job:
            return  # its registrant is still writing it (or died doing so): the next check reads it
        if job != self.kind and not self._was_member:
            _fatal("ranks of one job must run one etjob.elastic protocol and one torch: this job's ranks are %s, "
                   "this rank is %s (torch %s)" % (job, self.kind, torch.__version__))
        _log("a rank of another kind (protocol or torch) tried to join this %s job: it is refused" % job)

    def ended(self, gen):
        return self._count("g%d/end" % gen) > 0

    def end(self, gen, why):
        """end marks generation gen over; the first to end it opens gen+1."""
        self._over = max(self._over, gen)
        if self._count("g%d/end" % gen, 1) == 1:
            self._count("gen", 1)
            _log("generation %d ended (%s)" % (gen, why))

    # -- rendezvous -------------------------------------------------------

    def rendezvous(self, survivor, changed=False, step=0):
        """rendezvous meets the others in a new generation and returns it.
        A survivor (a member of the generation that just ended) joins the
        next one at once; a newcomer waits for one that is open. After a
        membership change at a commit (changed) the lowest staying rank ends
        the generation; the others wait for that, up to the collective
        timeout. step is this rank's committed step. Raises BelowMin when
        survivors stayed below the minimum (State and run handle it)."""
        prev = self.group
        self.group = None
        self._retire(prev)
        self.check_kinds()
        began = time.monotonic()
        deadline = began + self.join_timeout
        want = prev.gen + 1 if (prev is not None and survivor) else None
        scanned = prev.gen + 1 if prev is not None else None
        while time.monotonic() < deadline:
            if self._orphaned:
                _log("leaving: the job went on without this rank while its rendezvous store was replaced")
                sys.exit(EXIT_CODE_PREEMPTED)
            gen = self.current()
            if scanned is not None:
                # a generation this rank missed may have been stopped below
                # min (it was frozen, or slow): then it stops too
                for g in range(scanned, gen):
                    self._late_for_stop(g, self._closed(g) or 0, step)
                scanned = max(scanned, gen)
            if want is not None and gen < want:
                # the generation we were in may not be marked over yet (our
                # own failure): end it, which opens the next.
                if changed and time.monotonic() < began + self.heartbeat_timeout:
                    time.sleep(self.poll)
                    continue
                self.end(want - 1, "a collective failed" if not changed else "its membership changed")
                continue
            if gen == 0:
                if self._awaiting_members():
                    time.sleep(self.poll * 5)
                    continue
                self.end(gen, "opened by a newcomer")  # none yet: open the first
                continue
            got = self._join(gen, prev if survivor else None, deadline, step)
            if got is not None:
                self.group = got
                return got
            # late (or fenced: our generation went on without us): join the
            # next generation as a newcomer, which takes the state by broadcast
            want, survivor = None, False
        sys.exit("etjob.elastic: no generation with %d members formed in %.0f s" % (self.min, self.join_timeout))

    def _client(self):
        """_client is a new store client (a data group's setup)."""
        client = new_client(self.host, self.port, timedelta(seconds=self.setup_limit()))
        if not _ABORTABLE:
            _keep_forever(client)
        return client

    def _make_pg(self, key, rank, n):
        """_make_pg makes a gloo group of n ranks over the store prefix key,
        with a store client of its own (returned too)."""
        setup = timedelta(seconds=self.setup_limit() - 5)
        ops = timedelta(seconds=self.collective_timeout + 600)
        client = new_client(self.host, self.port, setup)
        # torch 2.x's gloo waits for its peers' addresses up to the group's
        # timeout (1.13's, the store's): setup gets the short one, the
        # operations the long one after it.
        got = []

        def make():
            try:
                pg = dist.ProcessGroupGloo(dist.PrefixStore(self._k(key), client), rank, n,
                                           setup if _SET_TIMEOUT else ops)
                if not _ABORTABLE:
                    _keep_forever(pg)  # even when it came too late: its destructor must never run
                got.append(pg)
            except Exception as e:  # noqa: BLE001 - raised below
                got.append(e)

        # In a thread, waited for up to setup: gloo's own wait for a dead
        # peer's address is not always bounded by it (a torch 1.13 rank
        # waited past 60 s once, in a clean run), and a rank must never be.
        t = threading.Thread(target=make, name="etjob-group-setup", daemon=True)
        t.start()
        t.join(setup.total_seconds() + 5)
        if not got:
            _keep_forever(client)  # the setup may still use it
            raise RuntimeError("no group of %d after %.0f s (a member gone)" % (n, setup.total_seconds() + 5))
        if isinstance(got[0], Exception):
            raise got[0]
        pg = got[0]
        if _SET_TIMEOUT:
            pg.set_timeout(ops)
        if not _ABORTABLE:
            _keep_forever(client)
        return pg, client

    def subgroup(self, ranks, tag):
        """subgroup makes a group of this generation's ranks (sorted; this
        rank among them) under tag: a sync to the ranks behind broadcasts in
        it. Retire it after use."""
        g = self._live()
        try:
            pg, client = self._make_pg("g%d/sub-%s/" % (g.gen, tag), ranks.index(g.rank), len(ranks))
        except RuntimeError as e:
            self.end(g.gen, "group setup for %s failed: %s" % (tag, (str(e).splitlines() or ["?"])[0]))
            raise CollectiveError("%s in generation %d: group setup failed" % (tag, g.gen)) from None
        return Group(g.gen, ranks.index(g.rank), len(ranks), pg, ranks, client)

    def _retire(self, group):
        """_retire aborts a generation's gloo group that this rank left
        (torch 2.x) and lets it go once no work of it is in flight: its
        threads, sockets and memory are freed. A group whose work waits for
        a frozen peer is parked until that work ends (its destructor would
        block until then); each retire lets go of the parked ones that
        ended. On torch 1.13 groups are leaked (docs/worker-library.md
        measures it)."""
        if group is not None and _ABORTABLE and group.pg is not None:
            try:
                group.pg.abort()
            except RuntimeError as e:
                _log("abort of generation %d's group: %s" % (group.gen, (str(e).splitlines() or ["?"])[0]))
            self._parked.append((group.pg, group.client, group.work))
            group.pg, group.client, group.work = None, None, None
        self._parked = [p for p in self._parked if p[2] is not None and not p[2].is_completed()]

    def _join(self, gen, prev, deadline, step=0):
        """_join arrives in generation gen; None when it closed without us."""
        k = "g%d/" % gen
        closed = self._closed(gen)
        if closed is not None:
            self._late_for_stop(gen, closed, step)
            return self._wait_next(gen, deadline)
        i = self._count(k + "n", 1)
        # Counters only: a blocking get of a key a dead rank never wrote, or a
        # wait that times out, leaves a torch 1.13 store client out of step.
        # A rank that was ever a member holds a commit: it says so even when
        # it comes back as a newcomer (late, fenced), for the stop below min.
        # The step is clamped to the code's 30 bits (it orders savers only).
        member = prev.rank if prev is not None else (_MEMBER_LATE if self._was_member else _NEWCOMER)
        code = 1 + member + (min(max(int(step), 0), _STEP_MAX) << _STEP_SHIFT)
        self._count(k + "m%d" % i, code)
        if i == 1:
            n = self._close(gen, prev, deadline)
        else:
            n = self._await_close(gen, deadline)
        if n is not None and i > n % _STOP:
            self._late_for_stop(gen, n, step)
        stop = n is not None and n >= _STOP
        if stop:
            n -= _STOP
        if n is None or i > n:
            return self._wait_next(gen, deadline)
        members = []
        until = time.monotonic() + self.heartbeat_timeout
        for j in range(1, n + 1):
            code = self._count(k + "m%d" % j)
            while code == 0 and time.monotonic() < until:
                time.sleep(self.poll)
                code = self._count(k + "m%d" % j)
            if code == 0:
                self.end(gen, "arrival %d never said who it is" % j)
                return self._wait_next(gen, deadline)
            # newcomers after survivors, survivors by their old rank
            members.append(((code - 1) & _MEMBER_MASK, j, (code - 1) >> _STEP_SHIFT))
        if stop:
            # below min: the member with the newest commit (the lowest such
            # rank) saves it; everyone stops
            saver = min((m for m in members if m[0] != _NEWCOMER), key=lambda m: (-m[2], m[0]))
            raise BelowMin(gen, saver[1] == i, n)
        members.sort()
        rank = [m[1] for m in members].index(i)
        try:
            # _make_pg gives the group a store client of its own (gloo's
            # setup waits on keys of peers that may be dead, and a timeout
            # there must not hurt ours) and bounds the setup; the group's own
            # timeout per operation is beyond any of ours, which decide first.
            pg, client = self._make_pg(k + "pg/", rank, n)
        except RuntimeError as e:
            self.end(gen, "group setup failed: %s" % e)
            return self._wait_next(gen, deadline)
        group = Group(gen, rank, n, pg, [m[1] for m in members], client)
        self._was_member = True
        self._member_of = self._store_id
        self._watch(group)
        return group

    def _closed(self, gen):
        """The close count of generation gen once its closer closed it (+
        _STOP when stopped below min), else None."""
        n = self._count("g%d/close" % gen)
        return n if n > 0 else None

    def _close(self, gen, prev, deadline):
        """The first arrival closes the generation: once everyone expected
        arrived, or `settle` seconds after the last arrival (a member lost
        without notice never comes). While it waits it beats (g<G>/cb), so
        that the others end the generation if it dies or freezes. A closer
        whose arrivals include a survivor and stayed below the minimum for
        below_min_wait stops the generation (close + _STOP)."""
        k = "g%d/" % gen
        expected = None
        before = gen - 1
        if before > 0:
            size = self._count("g%d/close" % before) % _STOP
            if size > 0:
                expected = size - self._count("g%d/leave" % before) + self._count("g%d/joins" % before)
        expected = min(expected, self.max) if expected else None
        began = time.monotonic()
        seen, since, beat = 0, began, 0.0
        interval = max(self.heartbeat_timeout / 5.0, 0.05)
        store = self.store.reconnects
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now - beat >= interval:
                beat = now
                self._count(k + "cb", 1)
                if self.ended(gen):  # the others took us for dead
                    return None
            if self._store_changed(store, gen):
                return None
            n = self._count(k + "n")
            if n != seen:
                seen, since = n, now
            # never below the minimum: `expected` after a stop below min
            # is the stopped generation's few
            if n >= self.min and (n >= self.max or (expected is not None and n >= expected) or
                                  now - since >= self.settle):
                n = min(n, self.max)
                self._count(k + "close", n)
                return n
            if n < self.min and now - began >= self.below_min_wait and self._has_survivor(gen, n):
                self._count(k + "close", n + _STOP)
                _log("generation %d: %d arrived in %.0f s, below the minimum %d: stopping" % (gen, n, now - began, self.min))
                return n + _STOP
            time.sleep(self.poll)
        return None

    def _has_survivor(self, gen, n):
        """Whether one of generation gen's first n arrivals said it holds a
        commit of the job's state (a survivor, or a former member that came
        back late)."""
        return any(self._arrival_steps(gen, n))

    def _arrival_steps(self, gen, n):
        """The committed steps of generation gen's first n arrivals that hold
        a commit (not newcomers)."""
        out = []
        for j in range(1, n + 1):
            code = self._count("g%d/m%d" % (gen, j))
            if code and (code - 1) & _MEMBER_MASK != _NEWCOMER:
                out.append((code - 1) >> _STEP_SHIFT)
        return out

    def _late_for_stop(self, gen, closed, step):
        """A former member that comes to a generation stopped below min
        after it closed stops too (exit 75, BelowMin): it saves its commit
        only when it is newer than every arrival's (the saver's)."""
        if closed < _STOP or not self._was_member:
            return
        n = closed % _STOP
        newest = max(self._arrival_steps(gen, n), default=-1)
        raise BelowMin(gen, min(int(step), _STEP_MAX) > newest, n)

    def _store_changed(self, since, gen):
        """While generation gen forms: when this rank's store client
        connected again since `since` (its reconnects then), the store may
        be a new one that lost the arrivals: gen is ended, and the ranks
        meet again in the next."""
        if self.store.reconnects == since:
            return False
        self.end(gen, "the rendezvous store was lost while it formed")
        return True

    def _await_close(self, gen, deadline):
        """_await_close waits for the closer; a closer that sends no
        heartbeat for heartbeat_timeout is gone, and the generation ends."""
        k = "g%d/" % gen
        beats, since = -1, time.monotonic()
        store = self.store.reconnects
        while time.monotonic() < deadline:
            n = self._closed(gen)
            if n is not None:
                return n
            if self.ended(gen) or self._store_changed(store, gen):
                return None
            b = self._count(k + "cb")
            now = time.monotonic()
            if b != beats:
                beats, since = b, now
            elif now - since > self.heartbeat_timeout:
                self.end(gen, "its closer sent no heartbeat for %.1f s" % (now - since))
                return None
            time.sleep(self.poll)
        return None

    def _wait_next(self, gen, deadline):
        """A newcomer to a closed generation asks to join and waits until it
        ends: the members let it in at their next commit. A generation whose
        rank 0 stops beating (its members are gone) is ended after `stale`
        seconds ($ETJOB_STALE_SECONDS, 3 heartbeat timeouts)."""
        k = "g%d/" % gen
        self._count(k + "joins", 1)
        beat, since = self._count(k + "hb0"), time.monotonic()
        store = self.store.reconnects
        while time.monotonic() < deadline:
            if self.current() > gen:
                return None
            if self.store.reconnects != store:
                # a new store: the request to join was in the old one
                store = self.store.reconnects
                self._count(k + "joins", 1)
            b = self._count(k + "hb0")
            if b != beat:
                beat, since = b, time.monotonic()
            elif time.monotonic() - since > self.stale:
                self.end(gen, "no heartbeat of its rank 0 for %.0f s" % (time.monotonic() - since))
                return None
            time.sleep(self.poll * 5)
        return None

    # -- heartbeats -------------------------------------------------------

    def _watch(self, group):
        """_watch makes group the one the watcher beats for and watches,
        starting the watcher thread on first use."""
        self._watched = group
        if self._watcher is None:
            raw = new_client(self.host, self.port, timedelta(seconds=30))
            client = StoreClient(raw, self.host, self.port, limit=self.store_loss, on_connect=self._reseed)
            self._watcher = threading.Thread(target=self._watch_loop, args=(client,), name="etjob-heartbeat", daemon=True)
            self._watcher.start()

    def _watch_loop(self, client):
        """The watcher: every beat it adds one to this rank's heartbeat, reads
        whether the generation ended and how many newcomers wait, and ends the
        generation when the next rank's heartbeats stopped for
        heartbeat_timeout (each dead rank has a live predecessor that sees
        it, as long as one rank lives). Its store client is its own: a
        training thread's store call never waits behind it."""
        interval = max(self.heartbeat_timeout / 5.0, 0.05)
        tick = min(interval, 0.1)  # how soon a rank waiting in a collective hears that another ended it
        seen_for, last, since, beat = None, None, 0.0, 0.0
        said = None  # the store error last logged: said once, not every tick
        while True:
            time.sleep(tick)
            g = self._watched
            try:
                k = self.prefix + "g%d/" % g.gen
                if int(client.add(k + "end", 0)) > 0:
                    self._over = max(self._over, g.gen)
                if time.monotonic() - beat < interval:
                    continue
                beat = time.monotonic()
                client.add(k + "hb%d" % g.rank, 1)
                if g.rank == 0:
                    self._joins = (g.gen, int(client.add(k + "joins", 0)))
                if g.size > 1 and self._over < g.gen and self.watching:
                    nxt = (g.rank + 1) % g.size
                    beats = int(client.add(k + "hb%d" % nxt, 0))
                    now = time.monotonic()
                    if seen_for is not g or beats != last:
                        seen_for, last, since = g, beats, now
                    elif now - since > self.heartbeat_timeout:
                        if int(client.add(k + "end", 1)) == 1:
                            client.add(self.prefix + "gen", 1)
                            _log("generation %d ended (rank %d sent no heartbeat for %.1f s)" % (g.gen, nxt, now - since))
                        self._over = max(self._over, g.gen)
                said = None
            except Exception as e:  # noqa: BLE001 - the store unreachable (the training's own calls say so), or worse: said, never fatal to the watcher
                first = (str(e).splitlines() or ["?"])[0]
                if first != said:
                    _log("heartbeat: %s" % first)
                    said = first

    def over(self, gen):
        """over: whether generation gen ended, as the watcher last saw it
        (no store call)."""
        return self._over >= gen

    # -- collectives ------------------------------------------------------

    def timeout_for(self, nbytes):
        """timeout_for is the deadline of a collective that moves nbytes: the
        collective timeout plus the time those bytes take at min_bandwidth."""
        return self.collective_timeout + nbytes / self.min_bandwidth

    def wait(self, work, what, nbytes=0, extra=0.0):
        """wait returns once work is done; it raises CollectiveError when the
        work failed, when the generation was ended by someone else, or after
        timeout_for(nbytes) + extra seconds (the work is then abandoned,
        never waited for)."""
        g = self.group
        g.work = work  # a rank that gives up on it leaves it to _retire
        limit = self.timeout_for(nbytes) + extra
        start = time.monotonic()
        # Completion is polled, never a callback on the work's future: a
        # Python callback run by gloo's thread crashed a rank that woke from
        # a freeze (SIGSEGV in Event.set, torch 1.13, a CI run), and NCCL
        # completes a work's future when it is enqueued, not when it is done.
        nap = 0.0002
        while not work.is_completed():
            time.sleep(nap)
            nap = min(nap * 1.5, 0.02)
            if self.over(g.gen):
                raise CollectiveError("%s in generation %d: another rank ended it" % (what, g.gen))
            if time.monotonic() - start > limit:
                self.end(g.gen, "%s took more than %.1f s" % (what, limit))
                raise CollectiveError("%s in generation %d: no answer in %.1f s" % (what, g.gen, limit))
        g.work = None
        try:
            work.wait()  # done: returns at once, or raises the work's error
        except RuntimeError as err:
            first = (str(err).splitlines() or ["?"])[0]
            self.end(g.gen, "%s failed: %s" % (what, first))
            raise CollectiveError("%s in generation %d failed: %s" % (what, g.gen, first)) from None

    def allreduce(self, tensor, op=dist.ReduceOp.SUM, what="all-reduce"):
        g = self._live()
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        self.wait(g.pg.allreduce([tensor], opts), what, _nbytes(tensor))
        return tensor

    def broadcast(self, tensor, src, what="broadcast"):
        g = self._live()
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        self.wait(g.pg.broadcast([tensor], opts), what, _nbytes(tensor))
        return tensor

    def wait_all(self, what, nbytes, extra=0.0):
        """wait_all is a barrier of this generation (a one-element
        all-reduce) whose deadline counts nbytes moved by others first, and
        extra seconds (their group's setup)."""
        g = self._live()
        opts = dist.AllreduceOptions()
        self.wait(g.pg.allreduce([torch.zeros(1)], opts), what, nbytes, extra)

    def setup_limit(self):
        """How long a group's setup may take (_make_pg)."""
        return max(2 * self.heartbeat_timeout, 10) + 5

    def _live(self):
        if self.group is None:
            raise CollectiveError("no generation: call this inside the function etjob.elastic.run wraps")
        return self.group


def _nbytes(tensor):
    return tensor.numel() * tensor.element_size()


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


_ctx = None
_exit = {"code": 0}
_writers = set()  # background checkpoint threads (State.checkpoint_async)


def _end_without_teardown():
    """At exit the process ends without tearing gloo down: groups abandoned
    after a failure still have their transport threads, and the library's
    static destructors under them crash the process (SIGSEGV, std::terminate)
    after the training succeeded. The exit code is the one sys.exit was given,
    1 after an uncaught exception, else 0."""
    import logging

    logging.shutdown()
    for t in list(_writers):  # background checkpoints land before the exit
        t.join(_env_float("ETJOB_CHECKPOINT_FLUSH_SECONDS", "600"))
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
        sup = sup_module.Supervisor().start() if os.environ.get("ETJOB_AGENT_ADDR") else sup_module.Supervisor(agent_addr="")
        _ctx = Context(sup=sup)
    return _ctx


class State:
    """State is what survives a failure in memory: objects with state_dict /
    load_state_dict (a model, an optimizer, an ElasticSampler) and plain
    values (the step), read and written as attributes. commit() keeps a copy;
    a rollback (after a failed collective) restores it."""

    def __init__(self, **items):
        self._init(items, live=False)

    def _init(self, items, live):
        objects = {k: v for k, v in items.items() if hasattr(v, "state_dict") and hasattr(v, "load_state_dict")}
        values = {k: v for k, v in items.items() if k not in objects}
        object.__setattr__(self, "_objects", objects)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_kept", None)
        object.__setattr__(self, "_ctx", None)
        object.__setattr__(self, "checkpoint_wanted", False)
        object.__setattr__(self, "commits", 0)
        object.__setattr__(self, "_dir", None)
        object.__setattr__(self, "_saving", None)
        object.__setattr__(self, "_received", 0)  # bytes of state the last sync brought this rank
        # live: the objects themselves are the commit (etjob.elastic's
        # Optimizer changes them only once every rank agreed to step), so a
        # commit copies nothing and a rollback restores nothing
        object.__setattr__(self, "_live", live)
        self._keep()

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
                "values": _clone(self._values)}

    def _load(self, snap, copy=True):
        for k, o in self._objects.items():
            o.load_state_dict(_clone(snap["objects"][k]) if copy else snap["objects"][k])
        self._values.clear()
        self._values.update(_clone(snap["values"]))

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
            return {"objects": {k: o.state_dict() for k, o in self._objects.items()}, "values": dict(self._values)}
        return self._kept

    def restore(self):
        """restore rolls back to the last commit (nothing to do when live)."""
        if not self._live:
            self._load(self._kept)

    def step_of(self):
        return int(self._values.get("step", 0))

    def commit(self):
        """commit keeps this step in memory and agrees with the others on who
        leaves and who joins. It raises MembershipChanged when the membership
        changes here (run handles it); a leaver exits 75 inside it."""
        self._keep()
        self.commits += 1
        ctx = self._ctx
        if ctx is None or ctx.group is None:
            return
        flags = self._flags(ctx.group)
        ctx.allreduce(flags, dist.ReduceOp.MAX, "commit")
        self._act(flags)

    def _flags(self, g, extra=0):
        """_flags is this rank's part of a commit's vote: whether it leaves,
        (rank 0) how many newcomers wait, whether a checkpoint is wanted, and
        extra slots after those for the caller (all 0)."""
        # read by rank 0's watcher: no store call per step
        ctx = self._ctx
        joins = ctx._joins[1] if g.rank == 0 and ctx._joins[0] == g.gen else 0
        flags = torch.zeros(g.size + 2 + extra, dtype=torch.int64)
        sup = ctx.sup
        flags[g.rank] = 0 if sup.check_alive() else 1
        flags[g.size] = joins
        flags[g.size + 1] = 1 if sup.should_checkpoint() else 0
        return flags

    def _act(self, flags):
        """_act carries out a vote every rank took part in (flags, reduced
        with MAX): leavers exit 75, too few left stops the job at this step,
        a leave or a join ends the generation (MembershipChanged)."""
        ctx = self._ctx
        g, sup = ctx.group, ctx.sup
        leaving = int(flags[:g.size].sum())
        object.__setattr__(self, "checkpoint_wanted", bool(flags[g.size + 1]))
        if not leaving and not flags[g.size]:
            return
        staying = [r for r in range(g.size) if not flags[r]]
        if leaving and len(staying) < ctx.min:
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
                _log("stop step=%d: %d of %d leave, below min %d" % (self.step_of(), leaving, g.size, ctx.min))
                print("stop step=%d reason=%s t=%.3f" % (self.step_of(), sup.reason() or "peer", time.time()), flush=True)
            sup.exit_preempted()
        if flags[g.rank]:
            _log("leaving at step %d (%s)" % (self.step_of(), sup.reason()))
            sup.exit_preempted()
        if g.rank == staying[0]:
            # The leavers are counted before the generation ends, so that
            # the next one's closer expects the right number.
            if leaving:
                ctx._count("g%d/leave" % g.gen, leaving)
            ctx.end(g.gen, "%d leave, %d join at step %d" % (leaving, int(flags[g.size]), self.step_of()))
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
        d = self._dir or os.environ.get("ETJOB_CHECKPOINT_DIR")
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
        """checkpoint_async hands the last commit to a background writer (rank
        0; the others return False) and returns True at once: training never
        waits for the disk. The commit is not copied: a commit replaces the
        kept snapshot instead of changing it, so the writer holds the one it
        was given (one extra copy of the state in memory at most, once a newer
        commit exists). One save at a time: while one is being written a new
        request returns False and nothing is queued. A save that fails, or
        that would move `latest` back, or whose generation ended while this
        rank did not go on (a rank that woke from a freeze), is logged and
        dropped, never raised. done(path, seconds), when given, is called
        from the writer once the checkpoint landed. Saves in flight are
        finished before the process exits (flush)."""
        ctx = self._ctx
        # every rank remembers the directory: any may save a stop below min
        object.__setattr__(self, "_dir", directory)
        if ctx is not None and ctx.group is not None and ctx.group.rank != 0:
            return False
        saving = self._saving
        if saving is not None and saving.is_alive():
            return False
        object.__setattr__(self, "_dir", directory)
        # live, the objects change at the next step: the writer gets a copy
        # (the only one; training waits for that copy, never for the disk)
        kept, gen = (_clone(self._committed()) if self._live else self._kept), self.generation
        step = int(kept["values"].get("step", 0))

        def fence():
            if ctx is not None and ctx.group is not None and ctx.group.gen == gen and ctx.ended(gen):
                raise etorch.CheckpointError(0, "generation %d ended while this rank did not go on: fenced" % gen)
            latest = etorch.latest_step(directory)
            if latest is not None and latest > step:
                raise etorch.CheckpointError(0, "latest is at step %d already: never moved back" % latest)

        def write():
            began = time.monotonic()
            try:
                state = dict(kept, step=step, generation=gen)
                path = etorch.save_checkpoint(directory, state, before_commit=fence)
            except Exception as e:  # noqa: BLE001 - a background save is never fatal
                _log("checkpoint of step %d not written: %s" % (step, e))
                return
            if done is not None:
                try:
                    done(path, time.monotonic() - began)
                except Exception as e:  # noqa: BLE001
                    _log("checkpoint of step %d written; its callback failed: %s" % (step, e))

        t = threading.Thread(target=write, name="etjob-checkpoint-%d" % step, daemon=True)
        object.__setattr__(self, "_saving", t)
        _writers.add(t)
        t.start()
        return True

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
        state["step"] = int(state["values"].get("step", 0))
        state["generation"] = self.generation

        def fence():
            if ctx is not None and ctx.group is not None and ctx.ended(ctx.group.gen):
                raise etorch.CheckpointError(0, "generation %d is over: this rank is fenced" % ctx.group.gen)

        return etorch.save_checkpoint(directory, state, before_commit=fence)

    def load_checkpoint(self, directory):
        """load_checkpoint loads the newest checkpoint of directory (written by
        checkpoint) and keeps it as the commit; False when there is none."""
        got = etorch.load_checkpoint(directory)
        if got is None:
            return False
        self._load(got)
        object.__setattr__(self, "_dir", directory)
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
        steps = torch.full((g.size,), -1, dtype=torch.int64)
        steps[g.rank] = self.step_of()
        ctx.allreduce(steps, dist.ReduceOp.MAX, "sync")
        newest = int(steps.max())
        if int(steps.min()) == newest:
            return None
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

    @staticmethod
    def _move(ctx, src, tensors, total):
        """_move broadcasts the state's bytes from src over ctx's group,
        chunk by chunk, each a bounded collective."""
        g = ctx.group
        views = stateio.byte_views(tensors)
        chunk = max(int(_env_float("ETJOB_SYNC_CHUNK_MB", "64") * 2**20), 1)
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
            return fn(state, *args, **kwargs)
        except CollectiveError as e:
            _log("rolling back to step %d: %s" % (state._committed()["values"].get("step", 0), e))
            state.restore()
        except MembershipChanged:
            changed = True


def _meet(ctx, state, survivor, changed):
    """_meet meets the others in a new generation and brings this rank to
    the newest commit any member holds (State._sync), again until a sync
    succeeds; it returns the generation. survivor and changed are
    Context.rendezvous's."""
    while True:
        began = time.monotonic()
        try:
            g = ctx.rendezvous(survivor, changed, state.step_of())
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


def get_rank():
    """get_rank is torch.distributed's name for rank()."""
    return rank()


def get_world_size():
    """get_world_size is torch.distributed's name for size()."""
    return size()


def init_process_group(backend="gloo", **kwargs):
    """init_process_group is torch.distributed's call, kept so that a DDP
    script adopts etjob.elastic by its import line: it forms no group (the
    ranks meet in Optimizer.steps, and again after every membership change)
    and chooses the transport of DistributedDataParallel's buckets: gloo
    (the generation's own group; CPU or CUDA tensors) or nccl (a
    communicator of their own each generation; the votes, the state's sync
    and the heartbeats stay on gloo and the store). Others are refused by
    name."""
    from etjob import ddp

    ddp.use(str(backend))
    unknown = set(kwargs) - {"init_method", "timeout", "world_size", "rank", "store", "group_name", "pg_options", "device_id"}
    if unknown:
        raise TypeError("etjob.elastic.init_process_group: unexpected %s" % ", ".join(sorted(unknown)))


def supervisor():
    """supervisor is this pod's etjob.supervisor.Supervisor (notices, progress)."""
    return _context().sup


# DDP and the vote-then-step optimizer (etjob.ddp), under this module's name
from etjob.ddp import DistributedDataParallel, Optimizer  # noqa: E402 - after what it uses

__all__ = ["State", "run", "allreduce_", "broadcast_", "allreduce_gradients", "rank", "size", "supervisor",
           "get_rank", "get_world_size", "init_process_group",
           "DistributedDataParallel", "Optimizer", "CollectiveError", "MembershipChanged", "EXIT_CODE_PREEMPTED"]
