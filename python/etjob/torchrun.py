"""torchrun for etjob workers: `python3 -m etjob.torchrun ARGS...`.

It runs torch.distributed.run unchanged (every torchrun flag and PET_* variable
works as documented) with these additions (docs/worker-library.md). They patch
and read torch internals (_INTERNALS); a torch that lacks one is refused at
start, naming it (_check_torch).

* Debian's torch 1.13 on Python 3.11 crashes at launch (IntFlag
  iteration changed, so `Std.from_str("0")` returns None); Std.from_str is fixed.
* torch closes the rendezvous for every node whenever one agent exits other
  than by success (its launcher calls rdzv_handler.shutdown() in a finally:
  a SIGTERM from a pod deletion is enough), which ends the whole elastic job.
  Here an agent that did not succeed only leaves the rendezvous; the others go
  on, and a successful agent still closes it, as torch's completion needs.
* A worker told to leave (a reclamation notice, a scale-in: the node agent says
  so) stops at the step all ranks agreed on, after the checkpoint, with exit
  code 75. When that happens on a leaving pod, this agent leaves the rendezvous
  itself (survivors need not wait out the 15 s heartbeat expiry, measured) and
  exits 75, which the controller counts as a preemption. On a surviving pod the
  agent restarts its workers, which resume from the agreed step's checkpoint.
* Fast resizes: workers fork from a forkserver that imported torch once
  (plus $ETJOB_PRELOAD; ETJOB_WORKER_START=exec restores torch's start), and
  which outlives a SIGTERM to the pod's process group (etjob._forkserver); the
  store is polled every $ETJOB_RDZV_POLL_SECONDS (0.2); a round closes the
  moment the expected nodes joined (_patch_rendezvous).
* A pod told to leave never closes a round, and leaves one it waits in.
* The rendezvous state has a store client of its own (_patch_store_clients):
  torch's keep-alive heartbeats never wait behind the agent's blocking reads,
  so a member that waits for a peer is never taken for dead. With the job's
  store secret ($ETJOB_STORE_SECRET_FILE) torch's store clients connect
  through an authenticating tunnel of this process (etjob.storeauth).
* A round that loses a node before its workers start is given up at once and
  the survivors meet again (_patch_round_barriers): torch's agents otherwise
  wait 300 s for the lost node's data.
* The members of a round share the nodes of the next one through the store,
  and torch's last call waits, for a bounded grace, for an expected node that
  is alive (_complete_when_expected).
* Workers know their round (ETJOB_RDZV_ROUND, _patch_round_env): the worker
  library's heartbeat carries it.
* torch keeps the rendezvous state in the store as a pickle, which any holder
  of the job's store secret can write: here it is read by an unpickler that
  builds torch's rendezvous types, datetimes and containers only, and
  refuses anything else by name (_patch_state_codec), so a peer's bytes run
  no code in an agent.
"""

import io
import os
import pickle
import signal
import sys
import threading
import time

from etjob import contract
from etjob import supervisor as sup_module


#: What this wrapper patches or reads in torch, none of it public API: module
#: -> dotted attributes (classes, functions, enum members). Read on torch
#: 1.13 and 2.15; _check_torch refuses a torch that lacks any of them.
_INTERNALS = {
    "torch.distributed.run": ["main", "config_from_args"],
    "torch.distributed.elastic.multiprocessing.api": ["Std.from_str", "_terminate_process_handler"],
    "torch.distributed.elastic.agent.server.api": [
        "SimpleElasticAgent.run", "SimpleElasticAgent._rendezvous", "SimpleElasticAgent._restart_workers",
        "SimpleElasticAgent._stop_workers", "SimpleElasticAgent._assign_worker_ranks"],
    "torch.distributed.elastic.agent.server.local_elastic_agent": ["start_processes"],
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous": [
        "pickle", "_RendezvousState", "_NodeDesc", "_delay", "_should_keep_alive", "_RendezvousExitOp", "_RendezvousJoinOp.__call__",
        "DynamicRendezvousHandler.from_backend", "DynamicRendezvousHandler.next_rendezvous",
        "DynamicRendezvousHandler.shutdown", "DynamicRendezvousHandler._stop_heartbeats",
        "_Action.REMOVE_FROM_WAIT_LIST", "_Action.FINISH", "_Action.MARK_RENDEZVOUS_COMPLETE", "_Action.KEEP_ALIVE",
        "_Action.SYNC"],
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend": ["create_backend", "C10dRendezvousBackend"],
    "torch.distributed.elastic.rendezvous.utils": ["parse_rendezvous_endpoint"],
    "torch.distributed.elastic.utils.store": ["synchronize"],
}
#: ... and what it reads on a rendezvous handler's objects at run time.
_HANDLER_FIELDS = {
    "handler": ["_state_holder", "_heartbeat_lock", "_op_executor", "_this_node", "_settings"],
    "handler._state_holder": ["_backend", "state", "sync"],
    "handler._state_holder._backend": ["_key", "_store"],
    "handler._state_holder.state": ["round", "complete", "closed", "participants", "wait_list", "last_heartbeats"],
    "handler._this_node": ["pid", "local_id"],
    "handler._settings": ["min_nodes", "max_nodes"],
}


def _check_torch():
    """_check_torch returns what this wrapper needs and this torch lacks (dotted
    names; empty when all is there): every patched or read internal, and the
    fields of a rendezvous handler built on an in-memory store."""
    import importlib

    missing, absent = [], object()
    for module, names in _INTERNALS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            missing.append(module)
            continue
        for name in names:
            obj = mod
            for part in name.split("."):
                # a class's own dunder: getattr would find type's __call__
                obj = vars(obj).get(part, absent) if part.startswith("__") else getattr(obj, part, absent)
                if obj is absent:
                    missing.append("%s.%s" % (module, name))
                    break
    if missing:
        return missing
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    try:
        store = dist.HashStore()
        handler = dr.DynamicRendezvousHandler.from_backend(
            "etjob-check", store, c10d.C10dRendezvousBackend(store, "etjob-check"), 1, 2)
    except Exception as e:  # noqa: BLE001 - a changed signature is a missing internal too
        return ["a rendezvous handler built as DynamicRendezvousHandler.from_backend(run_id, store, backend, "
                "min_nodes, max_nodes) (%s)" % e]
    objs = {"handler": handler}
    for path, fields in _HANDLER_FIELDS.items():
        obj = objs.get(path)
        if obj is None:
            parent, _, last = path.rpartition(".")
            obj = getattr(objs.get(parent), last, None) if objs.get(parent) is not None else None
            objs[path] = obj
        if obj is None:
            continue  # its parent's absence is reported already
        missing += ["dynamic_rendezvous.%s.%s" % (path, f) for f in fields if not hasattr(obj, f)]
    node = objs.get("handler._this_node")
    if node is not None and not (hasattr(node, "fqdn") or hasattr(node, "addr")):
        missing.append("dynamic_rendezvous.handler._this_node.addr (2.x) or .fqdn (1.13)")
    return missing


def _patch_std():
    from torch.distributed.elastic.multiprocessing import api

    std = api.Std
    original = std.from_str

    def from_str(vm):
        got = original(vm)
        if got is not None:
            return got
        # Python 3.11: a plain "0".."3" no longer maps through the IntFlag loop.
        if isinstance(vm, str) and vm.strip().isdigit():
            return std(int(vm))
        if isinstance(vm, str) and ":" in vm:
            return {int(k): std(int(v)) for k, v in (kv.split(":") for kv in vm.split(","))}
        return got

    std.from_str = staticmethod(from_str)



#: The globals a rendezvous state's pickle may name (module, name): torch's
#: own state types (the pickle of _RendezvousState on torch 1.13 and 2.15
#: names these and no others) and the datetime types of its deadlines and
#: heartbeats. Calling one of them with a peer's arguments builds data and
#: runs nothing else.
_STATE_GLOBALS = {
    ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_RendezvousState"),
    ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_NodeDesc"),
    ("datetime", "datetime"),
    ("datetime", "timezone"),
    ("datetime", "timedelta"),
}


class StateRefused(pickle.UnpicklingError):
    """StateRefused: a rendezvous state's pickle named a global that is not
    torch's rendezvous data (_STATE_GLOBALS), or was not a pickle of one.
    torch turns it into its RendezvousStateError ("the rendezvous state is
    corrupt"), with this as its cause."""


def _state_loads(data):
    """_state_loads reads a rendezvous state's pickle, building only the
    classes of _STATE_GLOBALS (no persistent ids, no other globals): a
    peer's bytes run no code in this agent."""
    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) not in _STATE_GLOBALS:
                raise StateRefused("etjob.torchrun: the rendezvous state in the store names %s.%s, which is not "
                               "torch's rendezvous data: refused (a holder of the job's store secret wrote it; "
                               "nothing of it was run)" % (module, name))
            return super().find_class(module, name)

        def persistent_load(self, pid):
            raise StateRefused("etjob.torchrun: the rendezvous state in the store holds a persistent id: refused")

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    got = Unpickler(io.BytesIO(data)).load()
    if not isinstance(got, dr._RendezvousState):
        raise StateRefused("etjob.torchrun: the rendezvous state in the store is a %s, not torch's "
                       "_RendezvousState: refused" % type(got).__name__)
    return got


def _patch_state_codec():
    """torch's DynamicRendezvousHandler keeps its state in the store as a
    pickle (dynamic_rendezvous.py: pickle.dumps to write it, pickle.loads
    to read it; the same on torch 1.13 and 2.15) and every holder of the
    job's store secret can write that key. The module's `pickle` is
    replaced by one whose loads is _state_loads; dumps is pickle's own."""
    import types

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    dr.pickle = types.SimpleNamespace(dumps=pickle.dumps, loads=_state_loads, PickleError=pickle.PickleError,
                                      UnpicklingError=pickle.UnpicklingError)



def _patch_shutdown():
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    state = {"succeeded": False}
    run = api.SimpleElasticAgent.run

    def run_and_remember(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        state["succeeded"] = not result.is_failed()
        return result

    api.SimpleElasticAgent.run = run_and_remember
    shutdown = dr.DynamicRendezvousHandler.shutdown

    def leave_or_close(self):
        if state["succeeded"]:
            return shutdown(self)
        _exit_round(self)
        return True

    dr.DynamicRendezvousHandler.shutdown = leave_or_close


_handlers = []  # the rendezvous handlers of this agent (one in practice)
# The wrapper reads and writes the rendezvous state through the handler's
# state holder under its _heartbeat_lock, as torch's keep-alive and
# num_nodes_waiting() do: the holder caches the state and is not thread-safe.
# Store calls themselves need no lock of ours: a c10d store client serialises
# its own operations (one at a time per client; measured on torch 1.13 and
# 2.15: an add waits for a blocking get on the same client to time out),
# which is also why the rendezvous state has a client of its own
# (_patch_store_clients).


def _exit_round(handler):
    """_exit_round takes this node out of the rendezvous: out of the
    participants (torch's exit op) and out of the wait list (torch's exit op
    leaves a waiting node there until its heartbeat expires, and meanwhile the
    others see a node waiting and restart for it)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    def leave_wait_list(ctx, deadline):
        return dr._Action.REMOVE_FROM_WAIT_LIST if ctx.node in ctx.state.wait_list else dr._Action.FINISH

    handler._stop_heartbeats()
    try:
        with handler._heartbeat_lock:
            handler._op_executor.run(dr._RendezvousExitOp(), time.monotonic() + 10)
            handler._op_executor.run(leave_wait_list, time.monotonic() + 10)
    except Exception as e:  # the store may be gone; heartbeats expire anyway
        print("etjob.torchrun: leaving the rendezvous failed: %s" % e, file=sys.stderr, flush=True)


def _patch_rendezvous(poll):
    """Make re-rendezvous as fast as the membership allows.

    torch's dynamic rendezvous polls the store once a second, serves a state
    cached for a second, and closes a round below max_nodes only after
    last_call_timeout. Here it polls every `poll` seconds, and a node that
    restarts knows how many nodes the next round will have: the nodes of the
    round it ran in, minus those that marked themselves as leaving
    (_leave_early), plus the new ones waiting. The round closes the moment
    they have all joined, whichever node joined last
    (_complete_when_expected). When that is unknown (the first round, a node
    lost without a notice) torch's own rule applies: last_call_timeout after
    min_nodes joined.
    """
    import random

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    delay = dr._delay

    def _delay(seconds):
        if _joining and _told_to_leave():
            raise _LeaveRendezvous()
        if isinstance(seconds, tuple):
            seconds = random.uniform(*seconds)
        delay(seconds=min(seconds, poll))

    dr._delay = _delay
    original = dr.DynamicRendezvousHandler.next_rendezvous

    def next_rendezvous(self):
        if self not in _handlers:
            _handlers.append(self)
        holder = self._state_holder
        holder._cache_duration = min(getattr(holder, "_cache_duration", 1), poll / 2)
        if not _told_to_leave():
            _unmark_left(self)  # a withdrawn notice: this node stays after all
        # The expected size only decides when the round may complete
        # (_complete_when_expected); the handler's own max_nodes stays the
        # job's: torch also uses it to admit a node that missed a round to the
        # wait list, and a narrowed one left such a node outside both lists,
        # polling unheard until its join timeout.
        expected = _expected_nodes(self)
        if expected:
            _expecting[self._this_node] = len(expected)
            shared = _share_expected(self, expected)
            how = "not shared" if shared is None else "this node's set shared" if shared == expected else \
                "another member's set of %d shared first" % len(shared)
            print("etjob.torchrun: expecting %d nodes in the next round (round %d: %s)" % (
                len(expected), _round_of.get(id(self), -1) + 1, how), file=sys.stderr, flush=True)
        global _joining
        try:
            _joining = True
            try:
                got = original(self)
            finally:
                _joining = False
            state = _note_round(self)
            print("etjob.torchrun: joined round %d with %d nodes" % (state.round, len(state.participants)),
                  file=sys.stderr, flush=True)
            return got
        except _LeaveRendezvous:
            _leave_rendezvous(self, "told to leave while waiting in the rendezvous")
        finally:
            _expecting.pop(self._this_node, None)

    dr.DynamicRendezvousHandler.next_rendezvous = next_rendezvous
    dr._RendezvousJoinOp.__call__ = _complete_when_expected(dr._RendezvousJoinOp.__call__)


def _patch_store_clients():
    """Give the rendezvous state a store client of its own.

    torch's c10d backend hands one store client to the handler's state
    (rounds, keep-alive heartbeats) and to the agent, whose post-round reads
    block until every node of the round wrote (store_util.synchronize sets the
    client's timeout to 300 s). A client runs one operation at a time, so
    while the agent waited for a node, its keep-alive heartbeats waited too,
    the others took it for dead after 15 s, and nodes that joined meanwhile
    completed a round of their own: the job trained in two halves. Here the
    state has a second connection to the same store; the agent keeps torch's."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    from etjob import storeauth, storeclient

    original = c10d.create_backend

    def create_backend(params):
        # With the job's store secret, torch's clients reach the store
        # through this process's authenticating tunnel (etjob.storeauth).
        host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
        at_host, at_port = storeauth.route(host, port)
        if (at_host, at_port) != (host, port):
            params.endpoint = "%s:%d" % (at_host, at_port)
        backend, store = original(params)
        if isinstance(store, TCPStore):
            own = TCPStore(store.host, store.port, is_master=False, timeout=store.timeout)
            # torch 1.x builds compare_set's answer without the GIL: asked
            # over a socket of its own there (etjob.storeclient.gil_safe)
            backend = c10d.C10dRendezvousBackend(storeclient.gil_safe(own), params.run_id)
        return backend, store

    c10d.create_backend = create_backend


class _RoundLost(Exception):
    """Raised while the agent waits for the nodes of its round when one of
    them is no longer in the rendezvous (it was lost, or left)."""


#: How often a wait for the keys of a round checks that the round is whole.
_ROUND_CHECK_SECONDS = 1.0


def _round_lost():
    """What is missing from the round this agent's workers are about to run in,
    or "" while the round is whole: torch drops a node from the participants
    when its heartbeats stop (15 s) or when it exits the round."""
    for h in list(_handlers):
        last, number = _rounds.get(id(h)), _round_of.get(id(h))
        if not last:
            continue
        with h._heartbeat_lock:
            h._state_holder.sync()
            state = h._state_holder.state
        if state.closed:
            return "the rendezvous is closed"  # the next round says so, as torch would
        if state.round != number:
            return "round %d is over (the rendezvous is at round %d)" % (number, state.round)
        gone = [str(n) for n in last if n not in state.participants]
        if gone:
            return "%s left round %d" % (", ".join(sorted(gone)), number)
    return ""


#: The suffix of the counter that marks a key as written on torch 1.13
#: (_set_marked): a counter is read with add(key, 0), which never waits.
#: torch 1.13's Store has no check; a timed-out wait leaves a waiter on the
#: server whose late answer the client's next call reads instead of its own;
#: and its compare_set builds its answer without holding the GIL, which
#: corrupted the agent's memory while other threads ran (a segfault in
#: _have_keys and a TypeError in the supervisor's HTTP poll, seen in the e2e
#: stories; pytorch/pytorch#123983, fixed in torch 2.4).
_MARK = ".etjob.written"


def _have_keys(store, keys):
    if hasattr(store, "check"):  # torch 2.x
        return store.check(keys)
    return all(store.add(k + _MARK, 0) > 0 for k in keys)


def _set_marked(store, key, value):
    """_set_marked sets key and, on torch 1.13, marks it written (_have_keys):
    every node runs this wrapper, so every key a node waits for is marked."""
    store.set(key, value)
    if not hasattr(store, "check"):
        store.add(key + _MARK, 1)


def _wait_keys(store, keys, poll=0.2, timeout=300.0):
    """_wait_keys waits until every key is in the store, without ever blocking
    in the store, and gives the round up (_RoundLost) as soon as a node of it
    is gone: the key it was to write would never come. After `timeout`
    seconds (torch's own post-round timeout) it fails as torch's wait would."""
    began = checked = time.monotonic()
    while not _have_keys(store, keys):
        now = time.monotonic()
        if now - began > timeout:
            raise RuntimeError("etjob.torchrun: timed out after %.0f s waiting for %s" % (timeout, ", ".join(keys)))
        if now - checked >= _ROUND_CHECK_SECONDS:
            checked = now
            lost = _round_lost()
            if lost and not _have_keys(store, keys):
                raise _RoundLost(lost)
        time.sleep(poll)


def _synchronize(store, data, rank, world_size, key_prefix):
    """torch 1.13's store_util.synchronize (every agent's data to every agent,
    then rank 0 waits until all have read), each wait through _wait_keys."""
    _set_marked(store, "%s%d" % (key_prefix, rank), data)
    keys = ["%s%d" % (key_prefix, i) for i in range(world_size)]
    _wait_keys(store, keys)
    got = [store.get(k) for k in keys]
    _set_marked(store, "%s%d.FIN" % (key_prefix, rank), b"FIN")
    if rank == 0:
        _wait_keys(store, [k + ".FIN" for k in keys])
    return got


def _post_round_layout():
    """Which keys torch's agents wait for after a round, by torch's layout:
    "sync" (torch 1.x: store_util.synchronize of "torchelastic/role_info<i>",
    then rank 0's MASTER_ADDR and MASTER_PORT), "assigned" (torch 2.x: every
    agent writes "torchelastic/role_info/<rank>", rank 0 reads them all and
    writes "torchelastic/assigned_ranks/<i>"), or None (unknown)."""
    import inspect

    from torch.distributed.elastic.agent.server import api

    try:
        source = inspect.getsource(api.SimpleElasticAgent._assign_worker_ranks)
    except (OSError, TypeError):
        return None
    if "torchelastic/assigned_ranks/" in source and "torchelastic/role_info/" in source:
        return "assigned"
    if "_share_and_gather" in source and hasattr(api.SimpleElasticAgent, "_get_master_addr_port"):
        return "sync"
    return None


def _patch_bootstrap_wait():
    """torch 2.x: inside next_rendezvous, the nodes other than rank 0 read rank
    0's master address from the round's store keys (RendezvousStoreInfo.build,
    a blocking read). A rank 0 lost right after the round kept them there
    until the store's timeout; here that wait is checked against the round
    too (_wait_keys), the round noted first since next_rendezvous has not
    returned yet."""
    from torch.distributed.elastic.rendezvous import api as rdzv_api

    info = getattr(rdzv_api, "RendezvousStoreInfo", None)
    if info is None:
        return
    build = info.build

    def guarded_build(rank, store, *args, **kwargs):
        if rank != 0:
            for h in list(_handlers):
                _note_round(h)
            _wait_keys(store, [info.MASTER_ADDR_KEY, info.MASTER_PORT_KEY])
        return build(rank, store, *args, **kwargs)

    info.build = staticmethod(guarded_build)


def _patch_round_barriers():
    """After a round, torch's agents share their ranks through the store and
    wait for every node of the round (300 s on torch 1.13; the store's read
    timeout on 2.x). A node lost in between (the second node of a burst, lost
    just after the round completed) kept the survivors there while the job
    looked healthy. Here those waits are checked against the rendezvous each
    second (_wait_keys), and a round that lost a node is given up: the agent
    joins the next round at once (_RoundLost)."""
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.utils import store as store_util

    layout = _post_round_layout()
    if layout is None:
        import torch

        print("etjob.torchrun: torch %s shares ranks after a round in a way this wrapper does not know: a node lost "
              "right after a round keeps the others waiting until the store's timeout" % torch.__version__,
              file=sys.stderr, flush=True)
        return
    if layout == "sync":
        synchronize = store_util.synchronize

        def guarded_synchronize(store, data, rank, world_size, key_prefix, *args, **kwargs):
            if key_prefix == "torchelastic/role_info":  # the post-round one; the exit barrier is torch's
                return _synchronize(store, data, rank, world_size, key_prefix)
            return synchronize(store, data, rank, world_size, key_prefix, *args, **kwargs)

        store_util.synchronize = guarded_synchronize
        master = api.SimpleElasticAgent._get_master_addr_port
        set_master = api.SimpleElasticAgent._set_master_addr_port

        def set_master_addr_port(store, *args, **kwargs):
            set_master(store, *args, **kwargs)
            for key in ("MASTER_ADDR", "MASTER_PORT"):
                if not hasattr(store, "check"):
                    store.add(key + _MARK, 1)

        api.SimpleElasticAgent._set_master_addr_port = staticmethod(set_master_addr_port)

        def get_master_addr_port(store):
            _wait_keys(store, ["MASTER_ADDR", "MASTER_PORT"])
            return master(store)

        api.SimpleElasticAgent._get_master_addr_port = staticmethod(get_master_addr_port)
    else:
        assign = api.SimpleElasticAgent._assign_worker_ranks

        def assign_worker_ranks(self, store, group_rank, group_world_size, spec):
            if os.environ.get("TORCH_ELASTIC_WORKER_IDENTICAL", "0") != "1":
                info = api._RoleInstanceInfo(spec.role, group_rank, spec.local_world_size)
                store.set("torchelastic/role_info/%d" % group_rank, info.serialize())  # as torch does, first
                if group_rank == 0:
                    _wait_keys(store, ["torchelastic/role_info/%d" % i for i in range(group_world_size)])
                else:
                    _wait_keys(store, ["torchelastic/assigned_ranks/%d" % group_rank])
            return assign(self, store, group_rank, group_world_size, spec)

        api.SimpleElasticAgent._assign_worker_ranks = assign_worker_ranks
        _patch_bootstrap_wait()

    rendezvous = api.SimpleElasticAgent._rendezvous

    def _rendezvous(self, worker_group):
        while True:
            try:
                return rendezvous(self, worker_group)
            except _RoundLost as e:
                print("etjob.torchrun: the round lost a node before its workers started (%s): joining the next round"
                      % e, file=sys.stderr, flush=True)

    api.SimpleElasticAgent._rendezvous = _rendezvous


_sup = None  # this pod's Supervisor, when a node agent serves it (main)
_joining = False  # the agent's main thread waits in a rendezvous round


class _LeaveRendezvous(Exception):
    """Raised between the polls of a round when this pod was told to leave."""


def _told_to_leave():
    return _sigterm.is_set() or (_sup is not None and not _sup.check_alive())


_sigterm = threading.Event()  # this agent got SIGTERM: its pod is being deleted


def _patch_sigterm():
    """The agent's SIGTERM (a pod deletion: a scheduler's preemption, a
    drain) is a leave too. torch's agent stops its workers (they stop at the
    step all ranks agree on, after the checkpoint) and then ends without
    leaving the rendezvous, so the survivors waited out the heartbeat expiry
    (15 s) for it. Here the SIGTERM is noted first: the pod marks itself
    leaving at once (_leave_early), never closes a round, leaves the
    rendezvous once its workers stopped, and exits 75 (main)."""
    from torch.distributed.elastic.multiprocessing import api

    original = api._terminate_process_handler

    def handler(signum, frame):
        _sigterm.set()
        return original(signum, frame)

    api._terminate_process_handler = handler


def _leave_rendezvous(handler, why):
    """_leave_rendezvous takes this node out of the rendezvous (participants
    or wait list) and exits the pod with the reserved code. A pod told to
    leave while it waits in a round must not stay in it: the round could
    complete with it, and when the pod then goes, the others wait for its
    rank's data until their store times out and fail (exit 1, a job failure)
    instead of meeting again."""
    print("etjob.torchrun: this pod leaves (%s, %s): leaving the rendezvous and exiting %d"
          % (_reason(), why, sup_module.EXIT_CODE_PREEMPTED), file=sys.stderr, flush=True)
    _exit_round(handler)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(sup_module.EXIT_CODE_PREEMPTED)


def _reason():
    if _sigterm.is_set():
        return "SIGTERM"
    return _sup.reason() if _sup is not None else ""


def _complete_when_expected(join):
    """torch completes a round below max_nodes only in add_to_participants,
    with the settings of the node that adds itself last, and only at
    max_nodes: below it the round waited out last_call_timeout (3 s; the
    ~5 s join pauses measured before this rule). Here any participant that
    expects a size the round has reached completes it on its next poll."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    def call(self, ctx, deadline):
        state = ctx.state
        if state.closed or state.complete or time.monotonic() > deadline:
            return join(self, ctx, deadline)
        shared = _read_expected(state.round)
        ids = {_node_id(n) for n in state.participants}
        member = ctx.node in state.participants
        # A pod that goes never closes a round.
        if member and not _told_to_leave() and len(state.participants) >= ctx.settings.min_nodes:
            if shared and shared <= ids:
                return dr._Action.MARK_RENDEZVOUS_COMPLETE
            if len(state.participants) >= _expecting.get(ctx.node, ctx.settings.max_nodes):
                return dr._Action.MARK_RENDEZVOUS_COMPLETE
        action = join(self, ctx, deadline)
        if action != dr._Action.MARK_RENDEZVOUS_COMPLETE:
            return action
        # torch's last call. Held off, for a bounded grace, while a node that
        # is alive (its heartbeat is in the state) and expected (in the
        # shared set, or in the wait list) has not joined yet: on a loaded
        # machine a member that left the last round may take seconds to add
        # itself again, and a round completed without it makes it restart
        # the others at once (RC-C). A node that is gone has no heartbeat
        # left (torch's sanitizer removes it): it holds nothing.
        alive = {_node_id(n) for n in state.last_heartbeats}
        missing = (((shared or set()) | {_node_id(n) for n in state.wait_list}) - ids) & alive
        if not missing:
            return action
        first = _short_since.setdefault(state.round, time.monotonic())
        if time.monotonic() - first < _grace["s"]:
            if not _short_said.get(state.round):
                _short_said[state.round] = True
                print("etjob.torchrun: round %d: last call held off while %d expected nodes that are alive have not "
                      "joined (%d joined)" % (state.round, len(missing), len(ids)), file=sys.stderr, flush=True)
            return dr._Action.KEEP_ALIVE if dr._should_keep_alive(ctx) else dr._Action.SYNC
        print("etjob.torchrun: round %d: completed by torch's last call after %.1f s with %d nodes; %d expected "
              "did not join" % (state.round, _grace["s"], len(ids), len(missing)), file=sys.stderr, flush=True)
        return action

    return call


_grace = {"s": 30.0}   # ETJOB_RDZV_GRACE_SECONDS: how long a last call waits for the expected nodes
_short_since = {}      # round -> when this node first saw torch's last call while short
_short_said = {}
_shared = {}           # round -> the expected node ids shared for it (read once it is there)


def _node_id(node):
    host = getattr(node, "fqdn", None) or getattr(node, "addr", "")  # torch 1.13 names it fqdn, 2.x addr
    return "%s_%s_%s" % (host, node.pid, node.local_id)


_ABSENT = "-etjob-absent-"


def _expected_key(handler, rnd):
    return "%s.etjob.expected.%d" % (handler._state_holder._backend._key, rnd)


def _share_expected(handler, expected):
    """_share_expected offers expected (node ids) as the set of the next
    round (the round after the one this node ran in) with compare-and-set:
    the first member to offer one sets it for every node, newcomers too. It
    returns the set shared (this one, another member's, or None when the
    store could not be reached)."""
    rnd = _round_of.get(id(handler), -1) + 1
    try:
        got = handler._state_holder._backend._store.compare_set(
            _expected_key(handler, rnd), "", ",".join(sorted(expected)))
    except Exception as e:  # torch's own rules then
        print("etjob.torchrun: sharing the expected nodes failed: %r" % (e,), file=sys.stderr, flush=True)
        return None
    got = got.decode() if isinstance(got, bytes) else got
    return set(got.split(",")) if got else set()


def _read_expected(rnd):
    """_read_expected is the set of node ids shared for round rnd, or None
    (none shared: a first round, or no member knew its next round)."""
    if rnd in _shared:
        return _shared[rnd]
    if not _handlers:
        return None
    h = _handlers[-1]
    try:
        # compare_set with the same absent marker on both sides reads a key
        # without waiting for it (torch 1.13's store has no check())
        got = h._state_holder._backend._store.compare_set(_expected_key(h, rnd), _ABSENT, _ABSENT)
    except Exception:  # noqa: BLE001 - torch's rules then
        return None
    got = got.decode() if isinstance(got, bytes) else got
    if got == _ABSENT:
        return None
    _shared[rnd] = set(got.split(",")) if got else set()
    return _shared[rnd]


_rounds = {}  # id(handler) -> the nodes of the last round it joined
_round_of = {}  # id(handler) -> the number of that round
_expecting = {}  # node -> the size of the round it waits in, when known (next_rendezvous)


def _note_round(handler):
    """_note_round records the round the handler has just joined (its state
    holder's view) as the one its workers are about to run in, and returns
    that state."""
    state = handler._state_holder.state
    _rounds[id(handler)] = set(state.participants)
    _round_of[id(handler)] = state.round
    return state


def _left_key(handler, node):
    # A counter per node: torch 1.13's Store has no non-blocking existence
    # check, but add(key, 0) reads a counter without waiting.
    return "%s.etjob.left.%s" % (handler._state_holder._backend._key, _node_id(node))


def _unmark_left(handler):
    """_unmark_left clears this node's leaving mark (_leave_early), if any:
    the survivors would otherwise count it out of every later round."""
    try:
        with handler._heartbeat_lock:
            store = handler._state_holder._backend._store
            key = _left_key(handler, handler._this_node)
            marked = store.add(key, 0)
            if marked:
                store.add(key, -marked)
                print("etjob.torchrun: no longer leaving: mark cleared", file=sys.stderr, flush=True)
    except Exception as e:  # the survivors fall back to torch's last call
        print("etjob.torchrun: clearing the leaving mark failed: %r" % (e,), file=sys.stderr, flush=True)


def _expected_nodes(handler):
    """The nodes (ids) of the next round if they are known, else None: the
    last round's, less those marked as leaving, plus the new ones waiting."""
    last = _rounds.get(id(handler))
    if not last:
        return None
    try:
        with handler._heartbeat_lock:
            handler._state_holder.sync()
            state = handler._state_holder.state
            store = handler._state_holder._backend._store
            left = {n for n in last if n != handler._this_node and store.add(_left_key(handler, n), 0) > 0}
    except Exception as e:
        print("etjob.torchrun: reading the rendezvous state failed: %r" % (e,), file=sys.stderr, flush=True)
        return None
    if state.closed:
        return None
    joining = (set(state.participants) | set(state.wait_list)) - last
    nodes = (last - left) | joining
    if len(nodes) < handler._settings.min_nodes or len(nodes) > handler._settings.max_nodes:
        return None
    return {_node_id(n) for n in nodes}


def _leave_early(sup):
    """A pod told to leave marks its node as leaving in the rendezvous store at
    once, while its workers still run to the agreed stop step: the survivors
    then expect the right number of nodes when they re-rendezvous."""

    def run():
        while True:
            while not _told_to_leave() or not _handlers:
                time.sleep(0.05)
            mark()
            while _told_to_leave():  # a withdrawn notice: mark again at the next one
                time.sleep(0.05)

    def mark():
        for h in list(_handlers):
            try:
                h._state_holder._backend._store.add(_left_key(h, h._this_node), 1)
                print("etjob.torchrun: told to leave (%s): marked in the rendezvous" % _reason(), file=sys.stderr, flush=True)
            except Exception as e:  # the store may be gone: survivors fall back to torch's last call
                print("etjob.torchrun: marking the leave failed: %s" % e, file=sys.stderr, flush=True)

    threading.Thread(target=run, name="etjob-leave", daemon=True).start()


#: Modules a forkserver imports once for every worker start; ETJOB_PRELOAD
#: adds the training script's own heavy imports (comma-separated).
PRELOAD = ["torch", "torch.nn", "torch.nn.functional", "torch.distributed", "numpy", "etjob.supervisor", "etjob.torch"]


def _patch_round_env():
    """Workers get the rendezvous round they run in as ETJOB_RDZV_ROUND:
    the worker library sends it, with its step and world size, in its
    heartbeat, and members that report different rounds are a split
    (docs/design.md). torch builds a worker's environment itself, so the
    round is added where the agent hands the environments to
    start_processes."""
    from torch.distributed.elastic.agent.server import local_elastic_agent as lea

    start = lea.start_processes

    def start_processes(*args, **kwargs):
        rnd = max(_round_of.values()) if _round_of else 0
        for env in (kwargs.get("envs") or {}).values():
            env[contract.ENV_RENDEZVOUS_ROUND] = str(rnd)
        return start(*args, **kwargs)

    lea.start_processes = start_processes


def _patch_worker_start(preload):
    """Start workers by forking a server that imported torch once.

    torchrun starts `python -u script.py` for every worker on every
    membership change, and each start imports torch again (seconds on a busy
    node: most of a resize's pause). Here the script runs as a function
    entrypoint under the "forkserver" start method: a single-threaded server
    imports `preload` once, and every worker start is a fork of it. Worker
    environment, exit codes, signals and the script's argv are as before.
    """
    import multiprocessing

    from torch.distributed import run

    original = run.config_from_args

    def config_from_args(args):
        config, cmd, cmd_args = original(args)
        if cmd != os.getenv("PYTHON_EXEC", sys.executable) or cmd_args[:1] != ["-u"]:
            return config, cmd, cmd_args
        rest = cmd_args[1:]
        kind = "script"
        if rest[:1] == ["-m"]:
            kind, rest = "module", rest[1:]
        # The entrypoint is pickled by reference: name it by its module, not
        # by __main__ (python -m etjob.torchrun), and let the forkserver find
        # the package.
        import etjob
        from etjob import torchrun as module

        root = os.path.dirname(os.path.dirname(os.path.abspath(etjob.__file__)))
        path = os.environ.get("PYTHONPATH", "")
        if root not in path.split(os.pathsep):
            os.environ["PYTHONPATH"] = root + (os.pathsep + path if path else "")
        os.environ[contract.ENV_AGENT_PID] = str(os.getpid())
        multiprocessing.set_forkserver_preload(["etjob._forkserver"] + list(preload))
        config.start_method = "forkserver"
        return config, module.run_worker, [kind] + rest

    run.config_from_args = config_from_args


def _die_with_agent():
    """A worker dies with the agent that started it. The agent is what stops
    workers gracefully (it forwards SIGTERM, which the library turns into an
    agreed stop); once it is gone nobody collects a worker's result, and a
    finished worker would wait for it forever. The forkserver is no witness:
    every worker holds it alive. So a thread watches the agent's pid."""
    agent = int(os.environ.get(contract.ENV_AGENT_PID, "0"))
    if agent <= 1:
        return

    def alive():
        try:
            with open("/proc/%d/stat" % agent) as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie is gone
        except (OSError, IndexError):
            return False

    def watch():
        while alive():
            time.sleep(0.5)
        os._exit(137)

    threading.Thread(target=watch, name="etjob-agent-watch", daemon=True).start()


def run_worker(kind, target, *args):
    """run_worker runs a training script or module as `python -u` would, in a
    worker forked from the forkserver. A SystemExit keeps its code."""
    import runpy
    import signal

    # the forkserver ignores them (etjob._forkserver); a worker does not
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _die_with_agent()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=True)
        except (AttributeError, ValueError):
            pass
    sys.argv = [target] + list(args)
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)
    return None


def _patch_leaving(sup):
    from torch.distributed.elastic.agent.server import api

    original = api.SimpleElasticAgent._restart_workers

    def _restart_workers(self, worker_group):
        if sup is not None:
            sup.poll_once()  # the workers may have heard it a poll earlier
        if _told_to_leave():
            try:
                self._stop_workers(worker_group)
            except Exception:
                pass
            _leave_rendezvous(worker_group.spec.rdzv_handler, "its workers stopped")
        return original(self, worker_group)

    api.SimpleElasticAgent._restart_workers = _restart_workers


def main(argv=None):
    # torch 2.x shares the rank-0 agent's store with the workers and keeps
    # the master address of the first round it joined: a node that joins a
    # later round then waits for an address rank 0 never writes (60 s, then
    # it fails), and after rank 0 is lost the others' workers would dial a
    # dead master. torch's own opt-out publishes the address every round.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    from etjob import storeauth

    try:
        storeauth.load_secret()  # a named secret that cannot be used stops the agent here, said plainly
    except storeauth.SecretError as e:
        sys.exit("etjob.torchrun: %s" % e)
    missing = _check_torch()
    if missing:
        import torch

        sys.exit("etjob.torchrun: torch %s lacks what etjob.torchrun patches or reads in it (torch's internals, "
                 "read on torch 1.13 and 2.15): %s. Use one of those versions, or torch's own torchrun "
                 "(python3 -m torch.distributed.run: no agreed leaves, no fast resizes)"
                 % (torch.__version__, ", ".join(missing)))
    _patch_std()
    _patch_state_codec()
    _patch_shutdown()
    _patch_rendezvous(float(os.environ.get(contract.ENV_RENDEZVOUS_POLL_SECONDS, "0.2")))
    _grace["s"] = float(os.environ.get(contract.ENV_RENDEZVOUS_GRACE_SECONDS, "30"))
    _patch_store_clients()
    _patch_round_barriers()
    _patch_round_env()
    if os.environ.get(contract.ENV_WORKER_START, "forkserver") == "forkserver":
        extra = [m.strip() for m in os.environ.get(contract.ENV_PRELOAD, "").split(",") if m.strip()]
        _patch_worker_start(PRELOAD + extra)
    _patch_sigterm()
    if os.environ.get(contract.ENV_AGENT_ADDR):
        # torch's agent keeps its own SIGTERM handling (it stops the workers).
        global _sup
        # the agent trains nothing: its workers' own polls carry the heartbeat
        _sup = sup_module.Supervisor(install_sigterm=False, heartbeat=False).start()
    _patch_leaving(_sup)
    _leave_early(_sup)
    from torch.distributed import run

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    try:
        run.main()
    except SignalException as e:
        if e.sigval != signal.SIGTERM:
            raise
        # torch stopped the workers (they stopped at the agreed step) and
        # leaves the rendezvous as it is: leave it, and go as told.
        for h in list(_handlers):
            _exit_round(h)
        print("etjob.torchrun: SIGTERM: the workers stopped; left the rendezvous, exiting %d"
              % sup_module.EXIT_CODE_PREEMPTED, file=sys.stderr, flush=True)
        sys.exit(sup_module.EXIT_CODE_PREEMPTED)
    except ChildFailedError as e:
        # Every worker stopped because it was told to: so does the pod, with
        # the reserved code, instead of torchrun's generic 1.
        codes = {f.exitcode for f in e.failures.values()}
        if codes == {sup_module.EXIT_CODE_PREEMPTED}:
            print("etjob.torchrun: all workers stopped as told; exiting %d" % sup_module.EXIT_CODE_PREEMPTED,
                  file=sys.stderr, flush=True)
            sys.exit(sup_module.EXIT_CODE_PREEMPTED)
        raise


if __name__ == "__main__":
    main()
