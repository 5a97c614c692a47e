"""etjob.elastic's generations: the rendezvous store's protocol, the
heartbeats and the bounded collectives (one concern of etjob.elastic; its
docstring and docs/worker-library.md say what they do).

Context is one rank's view of the job: it agrees generations with the others
in the store (counters only), watches the next rank's heartbeats, and runs
this rank's collectives with deadlines, abandoned on a failure. Group is one
generation."""

import ctypes
import itertools
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from etjob import EXIT_CODE_PREEMPTED
from etjob import contract, groupstore, storeauth, storeclient
from etjob.storeclient import StoreClient, new_client


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
# What a pod's local rank 0 tells its pod's other ranks in g<G>/at/<pod>
# when it found generation G closed (else its arrival index, 1 on).
_POD_LATE = 1 << 40


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
    group, and what its setup used: (the setup's store client, the
    group's BulkStore), kept as long as the group)."""

    def __init__(self, gen, rank, size, pg, ids, client=None, sub=False):
        self.gen, self.rank, self.size, self.pg, self.ids = gen, rank, size, pg, ids
        self.client = client
        self.sub = sub  # a group of some of the generation's ranks (Context.subgroup)
        self.work = None  # the work in flight, while this rank waits for it (or after it gave up on it)


# A collective in flight this long may be waiting for a rank that will never
# answer: from then on the heartbeat watcher asks the store whether the
# generation ended every tick (0.1 s; every tenth of the wait once it
# waited 1 s, at most once a beat), not only once a heartbeat timeout.
# Short: after a hard kill the ranks that are not the dead one's neighbours
# hear of it only so, and must arrive within the next generation's settle
# (0.5 s). At 0.5 s one came 0.6 s late and was left for the generation
# after (test_elastic_ddp); at 0.1 s a hard kill's pause grew from 0.65 to
# 0.85 s (make bench-elastic). The price: a rank whose DDP bucket waits
# this long for a slower peer asks every tick while it waits (issue #43).
_OVERDUE = 0.02
# How much a waiting rank's polls of the store grow apart (a factor a poll)
# and up to how far apart (seconds): a rank's store calls while it waits
# for a generation to close stay a few, whatever the number of ranks (at
# most _POLL_MAX later than the close).
_BACKOFF, _POLL_MAX = 2.0, 0.1

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
      g<G>/done      >0 once a member of G finished (its training function
                     returned, or opt.steps(total) ended): the job is over,
                     a newcomer waiting for G+1 exits 0 (finished)
      g<G>/hb<r>     rank r's heartbeats in G (its watcher adds one a beat)
      g<G>/at/<pod>  where a pod's local rank 0 went in G (its arrival
                     index, or _POD_LATE): the pod's other ranks follow it
      kinds, kind<i> the protocol and torch versions seen in the job;
      proto/<kind>   how many ranks registered that kind (protocol 2 on)
      lineage        in a store that replaced one: "members" once a member
                     re-seeded it, "newcomers" once newcomers gave up
                     waiting for that and opened generation 1 (set once)
    and, outside the job's prefix:
      etjob/store/id           a token naming this store (set once)
      etjob/store/replacement  >0: the store replaces one (etjob.rdzv)

    A pod may hold several ranks (etjob.launch: LOCAL_RANK of
    LOCAL_WORLD_SIZE). The pod is then the unit of the rendezvous: its local
    rank 0 arrives for it, so arrivals, the close count, `leave`, `joins`,
    minReplicas and maxReplicas count pods; the pod's ranks are adjacent in
    every generation (rank = its pod's place * LOCAL_WORLD_SIZE + LOCAL_RANK),
    and a commit's leave takes a pod's ranks out together (pod_wide).

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
        endpoint = os.environ.get(contract.ENV_RENDEZVOUS_ENDPOINT) or os.environ.get(contract.ENV_TORCHRUN_RDZV_ENDPOINT, "")
        self.collective_timeout = _env_float(contract.ENV_COLLECTIVE_TIMEOUT, "300")
        self.heartbeat_timeout = _env_float(contract.ENV_HEARTBEAT_TIMEOUT, "5")
        # A collective's deadline grows with the bytes it moves, at this
        # slowest rate a healthy group is expected to keep (bytes/s): a 4 GB
        # state broadcast or gradient all-reduce is not taken for a frozen
        # peer. The default, 50 MB/s, is a slow network; gloo on loopback
        # moved ~1 GB/s on this project's 2-core machines.
        self.min_bandwidth = _env_float(contract.ENV_MIN_BANDWIDTH_MBPS, "50") * 1e6
        self.settle = _env_float(contract.ENV_SETTLE_SECONDS, "0.5")
        self.join_timeout = _env_float(contract.ENV_JOIN_TIMEOUT, "600")
        # survivors of a hard loss below minReplicas wait this long for
        # replacements, then the newest commit is saved and every rank exits 75
        self.below_min_wait = _env_float(contract.ENV_BELOW_MIN_SECONDS, "60")
        # a newcomer ends a generation whose rank 0 sent no heartbeat for
        # this long: its members are gone (the whole job lost at once)
        self.stale = _env_float(contract.ENV_STALE_SECONDS, str(3 * self.heartbeat_timeout))
        self.poll = 0.01
        upstream = None  # the store's own address (a client may connect through a tunnel: etjob.storeauth)
        if store is None:
            if not endpoint:
                sys.exit("etjob.elastic: ETJOB_RDZV_ENDPOINT is not set (host:port of the job's rendezvous store)")
            host, _, port = endpoint.rpartition(":")
            upstream = (host, int(port))
            try:
                store = new_client(host, int(port), timedelta(seconds=30))
            except storeauth.SecretError as e:
                sys.exit("etjob.elastic: %s" % e)
            except RuntimeError as e:
                why = (str(e).splitlines() or ["?"])[0]
                if storeauth.ENV not in why:  # not the handshake's own words
                    why += "; a torch %s client cannot talk to a store of another torch major version: run the " \
                           "launcher and the workers on one torch" % torch.__version__
                sys.exit("etjob.elastic: no rendezvous store at %s (ETJOB_RDZV_ENDPOINT): %s" % (endpoint, why))
        # how long a lost store is waited for; how long a newcomer in a
        # replaced store waits for the members to re-seed it
        self.store_loss = _env_float(contract.ENV_STORE_LOSS_SECONDS, "600")
        self.reseed_wait = _env_float(contract.ENV_RESEED_SECONDS, str(self.stale))
        self.host, self.port = upstream or (store.host, store.port)
        self._reseed_lock = threading.RLock()
        self._store_since = time.monotonic()  # when this rank connected to the store it uses now
        self._store_id = None    # the token of that store (etjob/store/id)
        self._member_of = None   # the token of the store this rank last became a member in
        self._orphaned = False   # the job went on without this rank while its store was replaced
        self.store = StoreClient(store, self.host, self.port, limit=self.store_loss, on_connect=self._reseed)
        rid = os.environ.get(contract.ENV_TORCHRUN_RDZV_ID) or os.environ.get(contract.ENV_RENDEZVOUS_ID) or "default"
        self.prefix = prefix if prefix is not None else "etjob/elastic/%s/" % rid
        self.id = ident or os.environ.get(contract.ENV_POD_NAME) or "%s-%d" % (os.uname().nodename, os.getpid())
        self.local_rank, self.local_size = local_ranks()
        self.sizes = world_sizes(self.local_size)  # the legal pod counts (spec.worldSizes), or None: any
        # the pod's ranks share their launcher (etjob.launch), whose pid
        # tells this pod from another of the same name in a test
        self.pod_key = "%s-%d" % (self.id, os.getppid())
        if self.local_size > 1:
            self.id += "/%d" % self.local_rank
        lo, _, hi = os.environ.get(contract.ENV_TORCHRUN_N_NODES, "1:1000000").partition(":")
        self.min = min_size if min_size is not None else int(lo or 1)
        self.max = max_size if max_size is not None else int(hi or lo or 1000000)
        self.sup = sup
        self.group = None
        self.eager = None       # the group init() formed, until the first sync takes it (elastic._meet)
        self._over = -1         # the newest generation the watcher saw ended
        self._progress = (-1, 0.0)  # (generation, when) this rank's last all-reduce of a whole generation ended
        self._setup_store = None  # the groups' setups' store client (_setup_client)
        self._setup_reconnects = 0  # self.store.reconnects when it was made
        self._flight = {}       # collectives in flight: token -> when it began (begin_flight)
        self._tokens = itertools.count()
        self._joins = (0, 0)    # (generation, newcomers waiting for it), rank 0's watcher
        self._watcher = None
        self.watching = True    # False while rank 0 saves a stop: the others are gone on purpose
        self._seen = 0          # the newest generation this rank has seen (current() walks on from it)
        self._parked = []       # aborted groups whose work is still in flight (_retire)
        self._kinds_seen = 0    # how many kinds check_kinds last saw
        self._was_member = False  # this rank has been a member of a generation: it holds a commit
        self._said_awaiting = False  # _awaiting_members said it waits
        if not _ABORTABLE:
            _raise_fd_limit()
        self.kind = "p%d-torch%s" % (PROTOCOL, _torch_minor())
        self._handshake(_env_float(contract.ENV_STORE_PROBE_SECONDS, "15"))

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
                    client.compare_set(key, "0", str(g.size // self.local_size))
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
            if not self._said_awaiting:
                self._said_awaiting = True
                _log("the rendezvous store replaced one: waiting up to %.0f s for a member to re-seed it" % self.reseed_wait)
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
        if prev is None or prev.rank == 0:
            self.check_kinds()  # (a survivor passed its own; rank 0 says when another kind tries to join)
        began = time.monotonic()
        deadline = began + self.join_timeout
        want = prev.gen + 1 if (prev is not None and survivor) else None
        scanned = prev.gen + 1 if prev is not None else None
        while time.monotonic() < deadline:
            if self._orphaned:
                _log("leaving: the job went on without this rank while its rendezvous store was replaced")
                sys.exit(EXIT_CODE_PREEMPTED)
            self._leave_if_told()
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
                    # the lowest staying rank ends it within milliseconds:
                    # a short poll (a backed-off one cost every join ~0.3 s)
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

    def _leave_if_told(self):
        """A rank that never was a member holds nothing of the job's state:
        told to stop while it waits to join (SIGTERM, its pod deleted: a
        job that ended, a scale-in; a notice), it exits 75 at once, instead
        of waiting for a generation it would leave at its first commit (or,
        where none ever opens, for the kill after the grace period)."""
        if self.sup is None or self._was_member or not self.sup.must_stop():
            return
        _log("leaving while waiting to join (%s): this rank holds no state" % (self.sup.reason() or "told to stop"))
        self.sup.exit_preempted()

    def finished(self, limit=2.0):
        """finished marks this rank's generation done (g<G>/done): its
        training function returned, the job is over, and a newcomer still
        waiting to join exits 0 instead of waiting for a generation that
        will never take it (the controller's completion then waits for no
        one). Best effort, bounded by limit seconds: a store that is away
        must not hold a rank that finished."""
        g = self.group
        if g is None:
            return

        def mark():
            try:
                self.store.add(self._k("g%d/done" % g.gen), 1)
            except Exception:  # noqa: BLE001 - best effort: the newcomers then wait for the controller
                pass

        t = threading.Thread(target=mark, name="etjob-finished", daemon=True)
        t.start()
        t.join(limit)

    def _job_done(self, gen):
        """A rank waiting to join generation gen+1 leaves with exit 0 once a
        member of gen finished the job (finished)."""
        if self._count("g%d/done" % gen) > 0:
            _log("the job finished: generation %d's members completed it before this rank could join" % gen)
            sys.exit(0)

    def _client(self):
        """_client is a new store client (a data group's setup)."""
        client = new_client(self.host, self.port, timedelta(seconds=self.setup_limit()))
        if not _ABORTABLE:
            _keep_forever(client)
        return client

    def _setup_client(self, setup):
        """The store client the groups' setups use: one for the rank's life
        (a new connection a generation made the launcher's store accept,
        and resolve the name of, N connections a change: torch 2.x's server
        looks each client's address up in DNS on its one thread, 5 s when
        the resolver drops the query, measured here), a new one after a
        setup that failed or timed out (its waits may have left it out of
        step with the server on torch 1.13), and a new one after the store
        was lost and replaced: the old one still talks to the dead store
        (every member's first setup after a store loss failed on it, and the
        generation waited out a newcomer's 10 s setup limit and a 5 s
        heartbeat before it formed again)."""
        if self._setup_store is not None and self._setup_reconnects != self.store.reconnects:
            self._setup_store = None  # torch 1.13's is kept (_keep_forever)
        if self._setup_store is None:
            self._setup_store = new_client(self.host, self.port, setup)
            self._setup_reconnects = self.store.reconnects
            if not _ABORTABLE:
                _keep_forever(self._setup_store)
        return self._setup_store

    def _make_pg(self, key, rank, n):
        """_make_pg makes a gloo group of n ranks over the store prefix key,
        over the setup client (returned too, with the group's store)."""
        setup = timedelta(seconds=self.setup_limit(n) - 5)
        ops = timedelta(seconds=self.collective_timeout + 600)
        client = self._setup_client(setup)
        # torch 2.x's gloo waits for its peers' addresses up to the group's
        # timeout (1.13's, the store's): setup gets the short one, the
        # operations the long one after it.
        got = []
        # gloo reads every peer's address: through BulkStore one bulk read
        # a rank (etjob.groupstore), O(N) store calls for the group
        store = groupstore.BulkStore(dist.PrefixStore(self._k(key), client), rank, n, setup)

        def make():
            try:
                pg = dist.ProcessGroupGloo(store, rank, n, setup if _SET_TIMEOUT else ops)
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
            _keep_forever(store)
            self._setup_store = None
            raise RuntimeError("no group of %d after %.0f s (a member gone)" % (n, setup.total_seconds() + 5))
        if isinstance(got[0], Exception):
            self._setup_store = None
            raise got[0]
        pg = got[0]
        if _SET_TIMEOUT:
            pg.set_timeout(ops)
        if not _ABORTABLE:
            _keep_forever(store)
        return pg, (client, store)  # the store object lives as long as its group

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
        return Group(g.gen, ranks.index(g.rank), len(ranks), pg, ranks, client, sub=True)

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
        """_join arrives in generation gen; None when it closed without us.
        In a pod of several ranks, local rank 0 arrives for the pod and
        the others follow it (_follow)."""
        k = "g%d/" % gen
        if self.local_rank > 0:
            return self._follow(gen, deadline, step)
        closed = self._closed(gen)
        if closed is not None:
            self._tell_pod(gen, _POD_LATE)
            self._late_for_stop(gen, closed, step)
            return self._wait_next(gen, deadline)
        if not self._pod_whole(gen):
            return None
        i = self._count(k + "n", 1)
        self._tell_pod(gen, i)
        # Counters only: a blocking get of a key a dead rank never wrote, or a
        # wait that times out, leaves a torch 1.13 store client out of step.
        # A rank that was ever a member holds a commit: it says so even when
        # it comes back as a newcomer (late, fenced), for the stop below min.
        # The step is clamped to the code's 30 bits (it orders savers only).
        # In a pod of several ranks the code is the pod's: its old place.
        member = prev.rank // self.local_size if prev is not None else (_MEMBER_LATE if self._was_member else _NEWCOMER)
        code = 1 + member + (min(max(int(step), 0), _STEP_MAX) << _STEP_SHIFT)
        self._count(k + "m%d" % i, code)
        codes = None
        if i == 1:
            n, codes = self._close(gen, prev, deadline)
        else:
            n = self._await_close(gen, deadline)
        return self._form(gen, i, n, codes, deadline, step)

    def _tell_pod(self, gen, where):
        """Local rank 0 tells its pod's other ranks where it went in
        generation gen: its arrival index, or _POD_LATE."""
        if self.local_size > 1:
            self._count("g%d/at/%s" % (gen, self.pod_key), where)

    def _pod_whole(self, gen):
        """Local rank 0 arrives for its pod once the pod's other ranks said
        they are here (g<G>/at/<pod>/here): a pod one of whose ranks died
        never arrives (its launcher kills the others within milliseconds;
        a generation closed with it would wait for its group's setup to
        time out). After a heartbeat timeout without them it arrives anyway
        (a rank that is slow, not dead: the group's setup decides); False
        when gen ended meanwhile (look again)."""
        if self.local_size == 1:
            return True
        key = "g%d/at/%s/here" % (gen, self.pod_key)
        began = time.monotonic()
        nap = self.poll
        while self._count(key) < self.local_size - 1:
            self._leave_if_told()
            if time.monotonic() - began > self.heartbeat_timeout:
                _log("generation %d: the pod's other ranks did not come in %.1f s: arriving without them" % (
                    gen, self.heartbeat_timeout))
                return True
            if self.ended(gen):
                return False
            time.sleep(nap)
            nap = min(nap * _BACKOFF, 0.02)
        return True

    def _follow(self, gen, deadline, step):
        """A pod's local rank > 0 says it is here and goes where its local
        rank 0 went in generation gen: into it at its arrival index, or to
        wait for the next; None (look again) once gen ended without a word
        from it (it went on to a later one)."""
        key = "g%d/at/%s" % (gen, self.pod_key)
        self._count(key + "/here", 1)
        nap, looked = self.poll, time.monotonic()
        while time.monotonic() < deadline:
            self._leave_if_told()
            i = self._count(key)
            if i == _POD_LATE:
                self._late_for_stop(gen, self._closed(gen) or 0, step)
                return self._wait_next(gen, deadline, ask=False)
            if i > 0:
                n = self._await_close(gen, deadline)
                return self._form(gen, i, n, None, deadline, step)
            if time.monotonic() - looked >= _POLL_MAX:
                looked = time.monotonic()
                if self.ended(gen):
                    return None
            time.sleep(nap)
            nap = min(nap * _BACKOFF, _POLL_MAX)
        return None

    def _form(self, gen, i, n, codes, deadline, step):
        """_form makes this rank's group of generation gen, which the
        arrival i (its own, or its pod's) was counted in and which closed
        with n (None: it formed without it): None when it is not a member."""
        k = "g%d/" % gen
        if n is not None and i > n % _STOP:
            self._late_for_stop(gen, n, step)
        stop = n is not None and n >= _STOP
        if stop:
            n -= _STOP
        if n is None or i > n:
            return self._wait_next(gen, deadline, ask=self.local_rank == 0)
        codes = codes or self._published(gen, n) or self._arrival_codes(gen, n, None, time.monotonic() + self.heartbeat_timeout)
        if codes is None:
            # (a replaced store, re-seeded with the close count only)
            self.end(gen, "an arrival never said who it is")
            return self._wait_next(gen, deadline, ask=self.local_rank == 0)
        # newcomers after survivors, survivors by their old rank
        members = [((code - 1) & _MEMBER_MASK, j, (code - 1) >> _STEP_SHIFT) for j, code in enumerate(codes, 1)]
        if stop:
            # below min: the member with the newest commit (the lowest such
            # rank) saves it; everyone stops
            saver = min((m for m in members if m[0] != _NEWCOMER), key=lambda m: (-m[2], m[0]))
            raise BelowMin(gen, saver[1] == i and self.local_rank == 0, n)
        members.sort()
        # a pod's ranks are adjacent: its place times its ranks, + the local rank
        p = self.local_size
        rank = [m[1] for m in members].index(i) * p + self.local_rank
        try:
            # _make_pg gives the group a store client of its own (gloo's
            # setup waits on keys of peers that may be dead, and a timeout
            # there must not hurt ours) and bounds the setup; the group's own
            # timeout per operation is beyond any of ours, which decide first.
            pg, client = self._make_pg(k + "pg/", rank, n * p)
        except RuntimeError as e:
            self.end(gen, "group setup failed: %s" % e)
            return self._wait_next(gen, deadline, ask=self.local_rank == 0)
        group = Group(gen, rank, n * p, pg, [m[1] for m in members for _ in range(p)], client)
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
        without notice never comes; a heartbeat timeout while survivors of
        the generation before are due and none arrived yet). While it waits it beats (g<G>/cb), so
        that the others end the generation if it dies or freezes. A closer
        whose arrivals include a survivor and stayed below the minimum for
        below_min_wait stops the generation (close + _STOP)."""
        k = "g%d/" % gen
        expected = None
        before = gen - 1
        # (the count, and the arrivals' codes it published) or (None, None)
        # survivors of the generation before are due (some of its members
        # stay): until one arrived the closer waits a heartbeat timeout
        # after the last arrival, not `settle`. A survivor slower than
        # settle (a loaded machine, a long step's end) must not find its
        # job's next generation formed by newcomers alone, who hold an older
        # commit or none: their steps would be done again.
        survivors_due = False
        if before > 0:
            closed = self._count("g%d/close" % before)
            size = closed % _STOP
            if size > 0:
                stay = size - self._count("g%d/leave" % before)
                expected = stay + self._count("g%d/joins" % before)
                # a generation stopped below min has no survivors: its
                # members exited 75 and come back as new processes
                survivors_due = stay > 0 and closed < _STOP
        expected = min(expected, self.max) if expected else None
        codes = {}  # arrival -> its code, read once it said who it is
        began = time.monotonic()
        seen, since, beat = 0, began, 0.0
        nap = self.poll  # short after an arrival (the next may complete the count), longer while none comes
        interval = max(self.heartbeat_timeout / 5.0, 0.05)
        store = self.store.reconnects
        while time.monotonic() < deadline:
            self._leave_if_told()
            now = time.monotonic()
            if now - beat >= interval:
                beat = now
                self._count(k + "cb", 1)
                if self.ended(gen):  # the others took us for dead
                    return None, None
            if self._store_changed(store, gen):
                return None, None
            n = self._count(k + "n")
            if n != seen:
                seen, since, nap = n, now, self.poll
            if survivors_due and self._survivor_arrived(k, n, codes):
                survivors_due = False
            quiet = max(self.settle, self.heartbeat_timeout) if survivors_due else self.settle
            # never below the minimum: `expected` after a stop below min
            # is the stopped generation's few; with spec.worldSizes at the
            # largest legal size reached (the others wait as spares)
            size = self.legal(min(n, self.max))
            if size >= self.min and (n >= self.max or (expected is not None and n >= expected) or
                                     now - since >= quiet):
                return self._publish(gen, size, size, codes)
            if size < self.min and now - began >= self.below_min_wait and self._has_survivor(gen, n, codes):
                _log("generation %d: %d arrived in %.0f s, below the minimum %d: stopping" % (gen, n, now - began, self.min))
                return self._publish(gen, n, n + _STOP, codes)
            time.sleep(nap)
            nap = min(nap * _BACKOFF, 0.02)
        return None, None

    def _publish(self, gen, n, close, codes):
        """_publish closes generation gen with its first n arrivals: their
        codes, read once here (an arrival counted but not yet written waits
        up to a heartbeat timeout), go to g<G>/members before the close
        count (close) that tells the others to read them: each rank reads
        one key, not every arrival's (O(N) store calls a generation, not
        O(N^2)). An arrival that never says who it is ends the generation."""
        k = "g%d/" % gen
        got = self._arrival_codes(gen, n, codes, time.monotonic() + self.heartbeat_timeout)
        if got is None:
            self.end(gen, "an arrival never said who it is")
            return None, None
        self.store.set(self._k(k + "members"), ",".join(str(c) for c in got))
        self._count(k + "close", close)
        return close, got

    def _arrival_codes(self, gen, n, codes, until):
        """The codes of generation gen's first n arrivals (codes: a cache of
        those read before), read one key each, each waited for until
        `until`; None when one never came."""
        k = "g%d/" % gen
        out = []
        for j in range(1, n + 1):
            code = codes.get(j, 0) if codes is not None else 0
            nap = self.poll
            while code == 0:
                code = self._count(k + "m%d" % j)
                if code == 0:
                    if time.monotonic() > until:
                        return None
                    time.sleep(nap)
                    nap = min(nap * _BACKOFF, _POLL_MAX)
            if codes is not None:
                codes[j] = code
            out.append(code)
        return out

    def _published(self, gen, n):
        """The codes of generation gen's n members as its closer published
        them (one store call), or None where the store holds none (a
        replaced store, re-seeded with the close count only)."""
        raw = self.store.compare_set(self._k("g%d/members" % gen), "", "").decode()  # a read that never blocks
        codes = [int(c) for c in raw.split(",")] if raw else []
        return codes[:n] if len(codes) >= n else None

    def _survivor_arrived(self, k, n, codes):
        """Whether one of the first n arrivals at k (g<G>/) is a survivor of
        the generation before (not a newcomer, not a former member back
        late); codes caches the arrivals' codes (one store call each)."""
        for j in range(1, n + 1):
            if not codes.get(j):
                codes[j] = self._count(k + "m%d" % j)
            code = codes[j]
            if code and (code - 1) & _MEMBER_MASK < _MEMBER_LATE:
                return True
        return False

    def _has_survivor(self, gen, n, codes):
        """Whether one of generation gen's first n arrivals said it holds a
        commit of the job's state (a survivor, or a former member that came
        back late); codes caches the arrivals' codes (one store call each)."""
        for j in range(1, n + 1):
            if not codes.get(j):
                codes[j] = self._count("g%d/m%d" % (gen, j))
            code = codes[j]
            if code and (code - 1) & _MEMBER_MASK != _NEWCOMER:
                return True
        return False

    def _arrival_steps(self, gen, n):
        """The committed steps of generation gen's first n arrivals that hold
        a commit (not newcomers)."""
        codes = self._published(gen, n) or [self._count("g%d/m%d" % (gen, j)) for j in range(1, n + 1)]
        return [(c - 1) >> _STEP_SHIFT for c in codes if c and (c - 1) & _MEMBER_MASK != _NEWCOMER]

    def _late_for_stop(self, gen, closed, step):
        """A former member that comes to a generation stopped below min
        after it closed stops too (exit 75, BelowMin): it saves its commit
        only when it is newer than every arrival's (the saver's)."""
        if closed < _STOP or not self._was_member:
            return
        n = closed % _STOP
        newest = max(self._arrival_steps(gen, n), default=-1)
        raise BelowMin(gen, self.local_rank == 0 and min(int(step), _STEP_MAX) > newest, n)

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
        heartbeat for heartbeat_timeout is gone, and the generation ends.
        On torch 2.x it waits in the store for the closer's published
        members, a beat at a time; on 1.13 (whose client a wait that times
        out puts out of step) it asks the close count at polls that grow
        apart (up to _POLL_MAX). Whether the generation ended and the
        closer's beats are read every other beat: a few store calls a rank,
        whatever the number of ranks."""
        k = "g%d/" % gen
        beats, since = -1, time.monotonic()
        store = self.store.reconnects
        interval = max(2 * self.heartbeat_timeout / 5.0, 0.05)
        nap, looked = self.poll, time.monotonic()
        blocking = storeclient.WAIT_SAFE and isinstance(self.store, StoreClient)
        published = False
        while time.monotonic() < deadline:
            self._leave_if_told()
            if blocking:
                # torch 2.x: the store answers the moment the closer
                # publishes the members (before the close count), or after
                # a beat: one call a beat instead of polls
                published = self.store.wait([self._k(k + "members")], timedelta(seconds=interval))
            n = self._closed(gen)
            if n is not None:
                return n
            if self._store_changed(store, gen):
                return None
            now = time.monotonic()
            if now - looked >= interval:
                looked = now
                if self.ended(gen):
                    return None
                b = self._count(k + "cb")
                now = time.monotonic()
                if b != beats:
                    beats, since = b, now
                elif now - since > self.heartbeat_timeout:
                    self.end(gen, "its closer sent no heartbeat for %.1f s" % (now - since))
                    return None
            if not blocking or published:
                # (published but not closed: the closer is between its two
                # calls, or died there, which its stopped beats tell)
                time.sleep(nap)
                nap = min(nap * _BACKOFF, _POLL_MAX)
        return None

    def legal(self, pods):
        """legal is the largest number of pods, at most pods, that
        spec.worldSizes allows (0: none); pods itself without a list."""
        if self.sizes is None:
            return pods
        return max((p for p in self.sizes if p <= pods), default=0)

    def joining(self, pods, waiting):
        """joining is how many of `waiting` newcomers a generation of `pods`
        pods lets in at its next commit: all of them (the next generation
        takes as many as its size allows) when they make it larger, none
        when it is at the maximum or no larger legal size is reached (they
        wait as spares: a generation that ended for them would close at its
        size again, and end at every commit)."""
        if waiting <= 0 or pods >= self.max or self.legal(min(pods + waiting, self.max)) <= pods:
            return 0
        return waiting

    def _wait_next(self, gen, deadline, ask=True):
        """A newcomer to a closed generation asks to join and waits until it
        ends: the members let it in at their next commit. A generation whose
        rank 0 stops beating (its members are gone) is ended after `stale`
        seconds ($ETJOB_STALE_SECONDS, 3 heartbeat timeouts). A pod's local
        ranks > 0 wait without asking (ask=False): its local rank 0 asks
        for the pod."""
        k = "g%d/" % gen
        if ask:
            self._count(k + "joins", 1)
        size = self._count(k + "close") % _STOP
        if size >= self.max:
            _log("generation %d has the job's maximum of %d ranks: this rank waits to join as a spare, until a member leaves" % (
                gen, self.max * self.local_size))
        elif self.sizes is not None and self.legal(size + 1) == size:
            _log("generation %d is closed at %d ranks: this rank waits as a spare until enough come for the next of "
                 "the job's world sizes (%s) or a member leaves" % (
                     gen, size * self.local_size, ",".join(str(p * self.local_size) for p in self.sizes)))
        else:
            _log("generation %d is closed: this rank waits to join at its members' next commit" % gen)
        beat, since = self._count(k + "hb0"), time.monotonic()
        store = self.store.reconnects
        while time.monotonic() < deadline:
            self._leave_if_told()
            self._job_done(gen)
            if self.current() > gen:
                return None
            if self.store.reconnects != store:
                # a new store: the request to join was in the old one
                store = self.store.reconnects
                if ask:
                    self._count(k + "joins", 1)
            b = self._count(k + "hb0")
            if b != beat:
                beat, since = b, time.monotonic()
            elif time.monotonic() - since > self.stale:
                self.end(gen, "no heartbeat of its rank 0 for %.0f s" % (time.monotonic() - since))
                return None
            # one rank a join, not N: a short poll (a backed-off one cost
            # every join ~0.3 s, make bench-elastic)
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
        """The watcher: it ends the generation when the next rank's
        heartbeats stopped for heartbeat_timeout (each dead rank has a live
        predecessor that sees it, as long as one rank lives), and reads
        whether another rank ended it and (rank 0) how many newcomers wait.
        Its store client is its own: a training thread's store call never
        waits behind it.

        Its store calls stay about one every heartbeat timeout while the
        ranks train (issue #43: at 1,000 ranks, 3 calls a beat a rank were
        3,000 a second at the one store): an all-reduce of the whole
        generation that ended within the last beat shows every member alive
        (progressed), so a rank beats and reads its next rank's beats only
        when none did (a long step, a checkpoint, a wait for a peer), and
        rank 0 always (a newcomer watches its beats, and it reads the
        joins). Whether the generation ended is read once a heartbeat
        timeout, and every tick while a collective has waited _OVERDUE or
        more (the rank may be waiting for one that will never answer)."""
        interval = max(self.heartbeat_timeout / 5.0, 0.05)
        tick = min(interval, 0.1)  # how soon a rank waiting in a collective hears that another ended it
        seen_for, last, since, beat, looked = None, None, 0.0, 0.0, 0.0
        said = None  # the store error last logged: said once, not every tick
        swept = time.monotonic()
        while True:
            time.sleep(tick)
            if time.monotonic() - swept > 2.0:
                swept = time.monotonic()
                try:
                    storeclient.sweep(self.host, self.port)  # torch 1.13: a client thread that started late
                except Exception as e:  # noqa: BLE001 - never fatal to the watcher
                    _log("sweeping the store clients' watched-key connections: %s" % e)
            g = self._watched
            now = time.monotonic()
            waited = self.waited()
            k = self.prefix + "g%d/" % g.gen
            overdue = waited >= _OVERDUE
            every = min(max(tick, waited / 10.0), interval) if overdue else self.heartbeat_timeout
            ask_end = now - looked >= every
            if not ask_end and now - beat < interval:
                continue
            try:
                if ask_end:
                    looked = now
                    if int(client.add(k + "end", 0)) > 0:
                        self._over = max(self._over, g.gen)
                if time.monotonic() - beat < interval:
                    continue
                beat = time.monotonic()
                gen, at = self._progress
                alive = gen == g.gen and beat - at < interval  # every member was, a moment ago
                if g.rank == 0 or not alive:
                    client.add(k + "hb%d" % g.rank, 1)
                if g.rank == 0:
                    self._joins = (g.gen, int(client.add(k + "joins", 0)))
                if g.size > 1 and self._over < g.gen and self.watching:
                    nxt = (g.rank + 1) % g.size
                    if seen_for is not g or alive:
                        # the next rank beats only once it too saw no
                        # all-reduce end for a beat: its count is read
                        # afresh, and it has a whole timeout to move it
                        seen_for, last = g, None
                        if alive:
                            continue
                    beats = int(client.add(k + "hb%d" % nxt, 0))
                    now = time.monotonic()
                    if last is None or beats != last:
                        fresh = last is None
                        last, since = beats, now
                        if fresh and gen == g.gen:
                            # its beats are due from a beat after the last
                            # all-reduce: its timeout runs from then
                            since = min(now, at + interval)
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

    def begin_flight(self):
        """begin_flight notes a collective this rank now waits for; its
        token goes to end_flight when it is done, failed or given up."""
        token = next(self._tokens)
        self._flight[token] = time.monotonic()
        return token

    def end_flight(self, token):
        self._flight.pop(token, None)

    def waited(self):
        """waited: how long the oldest collective in flight has waited (0
        when none is)."""
        began = list(self._flight.values())
        return time.monotonic() - min(began) if began else 0.0

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
        token = self.begin_flight()
        try:
            self._wait(g, work, what, limit, start)
        finally:
            self.end_flight(token)

    def _wait(self, g, work, what, limit, start):
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
        self.progressed(g)
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
        self.progressed(g)

    def progressed(self, g):
        """progressed notes that an all-reduce of group g ended well: when g
        is a whole generation, every member was alive a moment ago (each
        one's part is in the result), and the heartbeat watcher needs no
        store call to know it (_watch_loop)."""
        if not g.sub:
            self._progress = (g.gen, time.monotonic())

    def setup_limit(self, n=0):
        """How long a group's setup may take (_make_pg), for a group of n
        ranks: gloo connects every pair, and rank 0 reads every rank's
        address; 10 ms more a rank (10 s more at 1,000)."""
        return max(2 * self.heartbeat_timeout, 10) + 5 + 0.01 * n

    def _live(self):
        if self.group is None:
            raise CollectiveError("no generation: call this inside the function etjob.elastic.run wraps")
        return self.group


def local_ranks():
    """local_ranks is (LOCAL_RANK, LOCAL_WORLD_SIZE) of this process, (0, 1)
    outside etjob.launch. A pod made for several ranks (spec.slotsPerWorker,
    $ETJOB_SLOTS_PER_WORKER) whose script runs alone is refused by name:
    its ranks would each arrive as a pod of one."""
    size = os.environ.get(contract.ENV_LOCAL_WORLD_SIZE, "")
    slots = os.environ.get(contract.ENV_SLOTS_PER_WORKER, "")
    try:
        if not size:
            if slots and int(slots) > 1:
                _fatal("this pod holds %s ranks ($%s, spec.slotsPerWorker) but its script runs alone: start it with "
                       "`python3 -m etjob.launch %s`, which starts the pod's ranks" % (
                           slots, contract.ENV_SLOTS_PER_WORKER, " ".join(sys.argv) or "train.py"))
            return 0, 1
        size, rank = int(size), int(os.environ.get(contract.ENV_LOCAL_RANK, "0"))
    except ValueError:
        _fatal("$%s=%r, $%s=%r: not numbers" % (contract.ENV_LOCAL_RANK, os.environ.get(contract.ENV_LOCAL_RANK),
                                                contract.ENV_LOCAL_WORLD_SIZE, size))
    if size < 1 or not 0 <= rank < size:
        _fatal("$%s=%d is not a local rank of $%s=%d" % (contract.ENV_LOCAL_RANK, rank, contract.ENV_LOCAL_WORLD_SIZE, size))
    return rank, size


def world_sizes(per_pod):
    """world_sizes is spec.worldSizes ($ETJOB_WORLD_SIZES: ranks, comma-
    separated) as numbers of pods of per_pod ranks, sorted; None where the
    job lists none (any whole number of pods). A size that is not a
    multiple of per_pod is never formed (said once); a list with no size
    left is refused by name."""
    raw = os.environ.get(contract.ENV_WORLD_SIZES, "").strip()
    if not raw:
        return None
    try:
        sizes = sorted({int(f) for f in raw.split(",") if f.strip()})
    except ValueError:
        _fatal("$%s=%r is not a list of numbers of ranks (spec.worldSizes)" % (contract.ENV_WORLD_SIZES, raw))
    pods = sorted({n // per_pod for n in sizes if n > 0 and n % per_pod == 0})
    skipped = [n for n in sizes if n <= 0 or n % per_pod]
    if skipped:
        _log("world sizes %s are not multiples of the %d ranks a pod holds: never formed" % (skipped, per_pod))
    if not pods:
        _fatal("no size of $%s=%r (spec.worldSizes) is a multiple of the %d ranks a pod holds" % (
            contract.ENV_WORLD_SIZES, raw, per_pod))
    return pods


def pod_wide(flags, size, per_pod):
    """pod_wide makes who leaves (flags[:size], one a rank, reduced) a
    pod's: every rank of a pod (per_pod adjacent ranks) leaves when one
    does (a notice reaches each rank's own poll of the node agent at its
    own moment: one may vote to leave a commit before its siblings)."""
    if per_pod > 1 and size % per_pod == 0:
        pods = flags[:size].view(size // per_pod, per_pod)
        flags[:size] = pods.max(dim=1, keepdim=True).values.expand(-1, per_pod).reshape(-1)
    return flags


def _nbytes(tensor):
    return tensor.numel() * tensor.element_size()
