import dataclasses
import inspect
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from datetime import datetime, timedelta, timezone

from agentstub import AgentStub
from test_elastic import store_secret

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from etjob import torchrun
except ImportError:  # pragma: no cover
    dr = None


def _settings():
    """torch's rendezvous settings of the tests: min 1, max 6, a 3 s last call."""
    return dr.RendezvousSettings(
        run_id="r", min_nodes=1, max_nodes=6, timeout=dr.RendezvousTimeout(last_call=timedelta(seconds=3)),
        keep_alive_interval=timedelta(seconds=5), keep_alive_max_attempt=3)


@unittest.skipIf(dr is None, "needs torch")
class CompleteWhenExpectedTest(unittest.TestCase):
    """A round the members expect N+1 nodes in completes as soon as N+1 have
    joined, even when the last to join was a joiner whose own max_nodes is the
    job's maximum (it used to wait out last_call_timeout)."""

    def setUp(self):
        self.join = torchrun._complete_when_expected(dr._RendezvousJoinOp.__call__)
        self.settings = _settings()
        self.nodes = [dr._NodeDesc("n%d" % i, 1, 0) for i in range(4)]

    def now(self):
        # torch's rendezvous state holds its times as torch's own clock gives
        # them: naive UTC on 1.13, aware UTC on 2.x (comparing the two
        # raises "can't compare offset-naive and offset-aware datetimes").
        return datetime.now(timezone.utc) if "timezone.utc" in inspect.getsource(dr) else datetime.utcnow()

    def act(self, node, participants, expected=None, complete=False):
        state = dr._RendezvousState()
        state.round = 2
        state.complete = complete
        for n in participants:
            state.participants[n] = 0
            state.last_heartbeats[n] = self.now()
        state.deadline = self.now() + timedelta(seconds=3)  # the last call, as torch set it
        if expected:
            torchrun._expecting[node] = expected
        try:
            return self.join(dr._RendezvousJoinOp(), dr._RendezvousContext(node, state, self.settings),
                             time.monotonic() + 60)
        finally:
            torchrun._expecting.pop(node, None)

    def test_member_completes_once_the_expected_nodes_joined(self):
        # members n0..n2 expect 4 nodes; the joiner n3 added itself last.
        self.assertEqual(self.act(self.nodes[0], self.nodes, expected=4), dr._Action.MARK_RENDEZVOUS_COMPLETE)

    def test_member_waits_while_some_are_missing(self):
        self.assertNotEqual(self.act(self.nodes[0], self.nodes[:3], expected=4), dr._Action.MARK_RENDEZVOUS_COMPLETE)

    def test_torch_rules_otherwise(self):
        # a joiner expects nothing: its max (6) does not complete a round of 4;
        self.assertNotEqual(self.act(self.nodes[3], self.nodes), dr._Action.MARK_RENDEZVOUS_COMPLETE)
        # a complete round is left alone.
        self.assertEqual(self.act(self.nodes[0], self.nodes, expected=4, complete=True), dr._Action.FINISH)

    def test_a_pod_told_to_leave_never_completes_a_round(self):
        torchrun._sup = _Told()
        try:
            self.assertNotEqual(self.act(self.nodes[0], self.nodes, expected=4), dr._Action.MARK_RENDEZVOUS_COMPLETE)
        finally:
            torchrun._sup = None


@unittest.skipIf(dr is None, "needs torch")
class SharedExpectedTest(unittest.TestCase):
    """RC-C and the shared expected set: the members of the last round share
    the nodes of the next one through the store (compare-and-set: the first
    offer is everyone's), and every node, a newcomer too, completes the
    round once they all joined; torch's last call (min 1: armed at the first
    participant) is held off, for a bounded grace, while an expected node
    that is alive has not joined. The store is a real c10d HashStore; the
    handler and the round's state are torch's own types, filled by hand."""

    def setUp(self):
        self.join = torchrun._complete_when_expected(dr._RendezvousJoinOp.__call__)
        self.settings = _settings()
        self.nodes = [dr._NodeDesc("n%d" % i, 1, 0) for i in range(4)]
        self.handler = dr.DynamicRendezvousHandler.__new__(dr.DynamicRendezvousHandler)
        holder = _FakeHolder(dr._RendezvousState())
        holder._backend._store = dist.HashStore()
        self.handler._state_holder = holder
        torchrun._handlers.append(self.handler)
        self.saved = dict(torchrun._grace), dict(torchrun._shared)
        torchrun._shared.clear()
        torchrun._short_since.clear()

    def tearDown(self):
        torchrun._handlers.remove(self.handler)
        torchrun._rounds.pop(id(self.handler), None)
        torchrun._round_of.pop(id(self.handler), None)
        torchrun._grace.update(self.saved[0])
        torchrun._shared.clear()
        torchrun._shared.update(self.saved[1])
        torchrun._short_since.clear()

    now = CompleteWhenExpectedTest.now

    def act(self, node, participants, wait_list=(), gone=(), last_call_passed=True):
        """The join op of node in round 5, whose participants and wait list
        are given; gone: nodes with no heartbeat left."""
        state = dr._RendezvousState()
        state.round = 5
        for n in participants:
            state.participants[n] = 0
        for n in wait_list:
            state.wait_list.add(n)
        for n in list(participants) + list(wait_list):
            if n not in gone:
                state.last_heartbeats[n] = self.now()
        state.deadline = self.now() + timedelta(seconds=-1 if last_call_passed else 3)
        return self.join(dr._RendezvousJoinOp(), dr._RendezvousContext(node, state, self.settings),
                         time.monotonic() + 60)

    def share(self, nodes, ran_in=4):
        torchrun._round_of[id(self.handler)] = ran_in
        return torchrun._share_expected(self.handler, {torchrun._node_id(n) for n in nodes})

    def test_the_first_offer_is_everyones(self):
        n = self.nodes
        self.assertEqual(self.share(n[:3]), {torchrun._node_id(x) for x in n[:3]})
        # a second member's offer, made a moment later, reads the first
        self.assertEqual(self.share(n), {torchrun._node_id(x) for x in n[:3]})
        self.assertEqual(torchrun._read_expected(5), {torchrun._node_id(x) for x in n[:3]})
        self.assertIsNone(torchrun._read_expected(6), "no set shared for round 6")

    def test_a_newcomer_completes_the_round_once_the_expected_joined(self):
        # torch's rule: a newcomer (it expects nothing) waits for max_nodes
        # or the last call; the shared set completes it at once
        n = self.nodes
        self.share(n[:3])
        self.assertEqual(self.act(n[2], n[:3], last_call_passed=False), dr._Action.MARK_RENDEZVOUS_COMPLETE)
        self.assertNotEqual(self.act(n[2], n[1:3], wait_list=[n[0]], last_call_passed=False),
                            dr._Action.MARK_RENDEZVOUS_COMPLETE)

    def test_last_call_held_while_an_expected_node_is_alive(self):
        # RC-C: min 1, the newcomer n3 alone in round 5 past torch's last
        # call, the last round's members n0..n2 alive in the wait list (a
        # loaded machine: they have not polled again yet)
        n = self.nodes
        self.share(n)
        self.assertNotEqual(self.act(n[3], [n[3]], wait_list=n[:3]), dr._Action.MARK_RENDEZVOUS_COMPLETE)
        # without a shared set (a first round), the wait list alone holds it
        torchrun._shared.clear()
        torchrun._round_of[id(self.handler)] = 7  # the set shared for round 8, not 5
        self.assertNotEqual(self.act(n[3], [n[3]], wait_list=n[:3]), dr._Action.MARK_RENDEZVOUS_COMPLETE)

    def test_a_gone_node_holds_nothing(self):
        # an expected node lost with no notice: torch's sanitizer removed its
        # heartbeat, and the last call completes the round as torch would
        n = self.nodes
        self.share(n)
        self.assertEqual(self.act(n[0], n[:3], wait_list=[n[3]], gone=[n[3]]), dr._Action.MARK_RENDEZVOUS_COMPLETE)
        self.assertEqual(self.act(n[0], n[:3]), dr._Action.MARK_RENDEZVOUS_COMPLETE)

    def test_the_hold_is_bounded(self):
        n = self.nodes
        self.share(n)
        torchrun._grace["s"] = 0.2
        self.assertNotEqual(self.act(n[3], [n[3]], wait_list=n[:3]), dr._Action.MARK_RENDEZVOUS_COMPLETE)
        time.sleep(0.3)
        self.assertEqual(self.act(n[3], [n[3]], wait_list=n[:3]), dr._Action.MARK_RENDEZVOUS_COMPLETE)


class _Told:
    """A Supervisor whose pod was told to leave."""

    def check_alive(self):
        return False

    def reason(self):
        return "ReclaimNotice(test)"


@unittest.skipIf(dr is None, "needs torch")
class LeaveWhileWaitingTest(unittest.TestCase):
    """A pod told to leave while its agent waits in a rendezvous round stops
    waiting at the next poll (the wrapper then leaves the round and exits 75);
    outside a round (its own exit, say) the polls go on."""

    def setUp(self):
        self.saved = (dr._delay, dr.DynamicRendezvousHandler.next_rendezvous, dr._RendezvousJoinOp.__call__)
        self.slept = []
        dr._delay = lambda seconds: self.slept.append(seconds)  # torch's, as the patch wraps it
        torchrun._patch_rendezvous(0.01)
        torchrun._sup = _Told()

    def tearDown(self):
        torchrun._sup = None
        torchrun._joining = False
        dr._delay, dr.DynamicRendezvousHandler.next_rendezvous, dr._RendezvousJoinOp.__call__ = self.saved

    def test_poll_in_a_round_raises(self):
        torchrun._joining = True
        with self.assertRaises(torchrun._LeaveRendezvous):
            dr._delay(seconds=1)
        self.assertEqual(self.slept, [], "no wait once told to leave")

    def test_poll_outside_a_round_waits(self):
        torchrun._joining = False
        dr._delay(seconds=1)
        self.assertEqual(self.slept, [0.01], "one poll, capped at the poll interval")


class _FakeStore:
    """A fake store client: counters only (the leaving marks)."""

    def __init__(self):
        self.counters = {}

    def add(self, key, n):
        self.counters[key] = self.counters.get(key, 0) + n
        return self.counters[key]


class _FakeHolder:
    """A fake rendezvous state holder over a fixed state."""

    def __init__(self, state):
        self.state = state
        self._cache_duration = 1
        self._backend = type("Backend", (), {"_store": _FakeStore(), "_key": "torch.rendezvous.r"})()

    def sync(self):
        return None


@unittest.skipIf(dr is None, "needs torch")
class NoNarrowingTest(unittest.TestCase):
    """RC-B: the wrapper's expected size of the next round must not narrow the
    handler's max_nodes while torch runs the round: torch also uses max_nodes
    to admit a node that missed a round to the wait list, and a narrowed one
    left such a node outside both lists, unheard until its 600 s join timeout.
    The handler here is a fake (a state holder over a fixed state, torch's
    own settings); the round itself is a fake that records what it saw."""

    def setUp(self):
        self.saved = (dr._delay, dr.DynamicRendezvousHandler.next_rendezvous, dr._RendezvousJoinOp.__call__)
        self.seen = []

        def fake_round(handler):
            self.seen.append((handler._settings.max_nodes, handler._op_executor._settings.max_nodes,
                              getattr(torchrun, "_expecting", {}).get(handler._this_node, 3)))
            return "store", 0, 3

        dr.DynamicRendezvousHandler.next_rendezvous = fake_round
        torchrun._patch_rendezvous(0.01)

    def tearDown(self):
        dr._delay, dr.DynamicRendezvousHandler.next_rendezvous, dr._RendezvousJoinOp.__call__ = self.saved

    def test_the_expected_size_leaves_max_nodes_alone(self):
        nodes = [dr._NodeDesc("n%d" % i, 1, 0) for i in range(3)]
        settings = _settings()
        state = dr._RendezvousState()
        state.round = 4
        state.complete = True
        for n in nodes:
            state.participants[n] = 0
        handler = dr.DynamicRendezvousHandler.__new__(dr.DynamicRendezvousHandler)
        handler._this_node, handler._settings = nodes[0], settings
        handler._state_holder = _FakeHolder(state)
        handler._heartbeat_lock = threading.Lock()
        handler._op_executor = type("Executor", (), {"_settings": settings})()
        torchrun._rounds[id(handler)] = set(nodes)
        try:
            dr.DynamicRendezvousHandler.next_rendezvous(handler)
        finally:
            torchrun._rounds.pop(id(handler), None)
            getattr(torchrun, "_round_of", {}).pop(id(handler), None)
            if handler in torchrun._handlers:
                torchrun._handlers.remove(handler)
        # the round of 3 it ran in is what it expects: max_nodes stays 6.
        self.assertEqual(self.seen, [(6, 6, 3)])
        self.assertEqual(getattr(torchrun, "_expecting", {}), {}, "the expectation ends with the round")


@unittest.skipIf(dr is None, "needs torch")
class LeaveWhileWaitingAgentTest(unittest.TestCase):
    """Real torchrun agent, real rendezvous store: an agent waiting in a round
    (min 2 nodes, only it came) is told to leave; it takes itself out of the
    round and exits 75, so no later round can complete with a node that is
    gone (the failure `make demo` found in session 3)."""

    def setUp(self):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        # the store and the agents authenticate with the job's secret, as a
        # launcher's and its workers' do (etjob.storeauth)
        self.env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), ETJOB_STORE_SECRET_FILE=store_secret(tempfile.mkdtemp(prefix="etjob-secret-")))
        self.store = subprocess.Popen([sys.executable, "-m", "etjob.rdzv", "--host", "127.0.0.1", "--port", str(self.port)],
                                      env=self.env, stdout=subprocess.PIPE, text=True)
        self.assertIn("listening", self.store.stdout.readline())
        self.agent = AgentStub()

    def tearDown(self):
        self.agent.close()
        self.store.terminate()
        self.store.wait(timeout=30)
        self.store.stdout.close()

    def state(self):
        from torch.distributed import TCPStore
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

        from etjob import storeauth

        from etjob import storeclient

        key = storeauth.load_secret(self.env["ETJOB_STORE_SECRET_FILE"])
        t = storeauth.Tunnel("127.0.0.1", self.port, key)
        store = TCPStore("127.0.0.1", t.local_port, is_master=False, timeout=timedelta(seconds=10))
        # as the agents do: torch 1.13's own compare_set builds its answer
        # without the GIL beside this process's tunnel thread (a segfault)
        got = C10dRendezvousBackend(storeclient.gil_safe(store), "leave-test").get_state()
        return pickle.loads(got[0]) if got else None

    def start_agent(self):
        """start_agent runs a real etjob.torchrun agent (min 2 nodes) and
        waits until it waits in the round alone, syncing the state."""
        script = os.path.join(tempfile.mkdtemp(), "noop.py")
        with open(script, "w") as f:
            f.write("print('trained')\n")
        env = dict(self.env, ETJOB_AGENT_ADDR=self.agent.addr, ETJOB_NAMESPACE="ns", ETJOB_POD_NAME="w-0")
        p = subprocess.Popen(
            [sys.executable, "-m", "etjob.torchrun", "--nnodes=2:3", "--nproc_per_node=1", "--rdzv_backend=c10d",
             "--rdzv_endpoint=127.0.0.1:%d" % self.port, "--rdzv_id=leave-test",
             "--rdzv_conf=is_host=false,join_timeout=600,last_call_timeout=3", script],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while True:
            st = self.state()
            if st is not None and len(st.participants) == 1:
                return p
            if time.time() > deadline or p.poll() is not None:
                p.kill()
                out = p.communicate()[0]
                self.fail("the agent never joined the round:\n" + out[-3000:])
            time.sleep(0.2)

    def test_told_to_leave_while_waiting(self):
        p = self.start_agent()
        try:
            self.agent.answer = {"action": "leave", "reason": "ReclaimNotice(test)", "deadline": "", "source": "aws"}
            code = p.wait(timeout=60)
            out = p.stdout.read()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
        self.assertEqual(code, 75, out[-2000:])
        self.assertIn("told to leave while waiting in the rendezvous", out)
        st = self.state()
        self.assertEqual((len(st.participants), len(st.wait_list)), (0, 0), "the agent left the round")


class _Marker:
    """A pickle that creates the file at path when it is loaded (open(path,
    "w")): what a holder of the store secret would write into torch's
    rendezvous state to run code in every agent."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@unittest.skipIf(dr is None, "needs torch")
class StatePickleTest(LeaveWhileWaitingAgentTest):
    """A real etjob.torchrun agent waits in a round of its real store; a
    client holding the job's store secret writes a pickle that would create
    a marker file as the rendezvous state (torch keeps that state as a
    pickle, and loads it with pickle.loads at every sync): no marker, and
    the agent refuses the state by name."""

    def client(self):
        from torch.distributed import TCPStore

        from etjob import storeauth

        key = storeauth.load_secret(self.env["ETJOB_STORE_SECRET_FILE"])
        t = storeauth.Tunnel("127.0.0.1", self.port, key)
        return TCPStore("127.0.0.1", t.local_port, is_master=False, timeout=timedelta(seconds=10))

    def test_a_forged_state_runs_nothing(self):
        import base64

        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

        from etjob import storeclient

        marker = os.path.join(tempfile.mkdtemp(prefix="etjob-pickle-"), "marker")
        p = self.start_agent()  # it waits in the round (min 2: it alone came), syncing the state
        try:
            store = self.client()
            forged = base64.b64encode(pickle.dumps(_Marker(marker)))
            store.set(C10dRendezvousBackend(storeclient.gil_safe(store), "leave-test")._key, forged)
            try:
                code = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            out = p.stdout.read()
            p.stdout.close()
        self.assertFalse(os.path.exists(marker), "the agent ran the forged state's code (the marker exists):\n" + out[-3000:])
        self.assertNotEqual(code, None, "the agent went on after the forged state:\n" + out[-3000:])
        self.assertIn("which is not torch's rendezvous data: refused", out, out[-3000:])

    def test_torchs_own_states_load(self):
        # the restricted reader takes what torch writes: aware and naive
        # datetimes, nodes in every field, on this torch
        now = datetime.now(timezone.utc)
        st = dr._RendezvousState()
        node = dr._NodeDesc(*(["h", 7, 0]))
        st.round, st.complete, st.deadline, st.closed = 3, True, now, False
        st.participants[node] = 0
        st.wait_list.add(dr._NodeDesc("g", 8, 1))
        st.last_heartbeats[node] = datetime.utcnow()
        for name in ("redundancy_list",):
            if hasattr(st, name):
                getattr(st, name).add(dr._NodeDesc("r", 9, 2))
        got = torchrun._state_loads(pickle.dumps(st))
        self.assertEqual(vars(got), vars(st))
        with self.assertRaisesRegex(pickle.UnpicklingError, "names (builtins|io).open"):
            torchrun._state_loads(pickle.dumps(_Marker("/nonexistent/x")))
        with self.assertRaisesRegex(pickle.UnpicklingError, "is a dict, not"):
            torchrun._state_loads(pickle.dumps({"round": 1}))

    test_told_to_leave_while_waiting = None


@unittest.skipIf(dr is None, "needs torch")
class RoundLostTest(unittest.TestCase):
    """Real torchrun agents on one real store (min 2, max 4): a node of a round
    is lost the moment the round completes, before its agent shared its ranks
    (forced_torchrun.py), and two new nodes arrive. Before etjob's fixes the
    survivors waited for the lost node's ranks (300 s on torch 1.13) with
    their heartbeats stuck behind that wait on the same store client, so the
    rendezvous took them for dead and the two new nodes completed a round of
    their own: the job trained in two halves, and nothing said so. Here the
    survivors give the round up once the lost node's heartbeats expire, and
    the four nodes finish in one round of 4."""

    def setUp(self):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), HERE]),
                        ETJOB_STORE_SECRET_FILE=store_secret(tempfile.mkdtemp(prefix="etjob-secret-")))
        self.env.pop("ETJOB_AGENT_ADDR", None)
        self.store = subprocess.Popen([sys.executable, "-m", "etjob.rdzv", "--host", "127.0.0.1", "--port", str(self.port)],
                                      env=self.env, stdout=subprocess.PIPE, text=True)
        self.assertIn("listening", self.store.stdout.readline())
        self.dir = tempfile.mkdtemp(prefix="rl-", dir="/tmp")
        self.script = os.path.join(self.dir, "train.py")
        with open(self.script, "w") as f:
            # Trains for 12 s in whatever world it is given: a restart for a
            # new round kills it, the last round's workers finish.
            f.write("import os, sys, time\n"
                    "print('world=%s node=%s round=%s' % (os.environ['WORLD_SIZE'], os.environ['GROUP_RANK'],\n"
                    "      os.environ.get('ETJOB_RDZV_ROUND')), flush=True)\n"
                    "time.sleep(12)\n")
        self.procs = []

    def tearDown(self):
        for p, out in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            out.close()
        self.store.terminate()
        self.store.wait(timeout=30)
        self.store.stdout.close()

    def agent(self, name, forced=False):
        out = open(os.path.join(self.dir, name + ".log"), "w+")
        cmd = [sys.executable] + ([os.path.join(HERE, "forced_torchrun.py")] if forced else ["-m", "etjob.torchrun"])
        cmd += ["--nnodes=2:4", "--nproc_per_node=1", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % self.port,
                "--rdzv_id=round-lost", "--max_restarts=100", "--monitor_interval=1",
                "--rdzv_conf=is_host=false,join_timeout=600,last_call_timeout=3", self.script]
        p = subprocess.Popen(cmd, env=dict(self.env, ETJOB_WORKER_START="exec"), stdout=out, stderr=subprocess.STDOUT,
                             text=True)
        self.procs.append((p, out))
        return p, out

    def test_a_node_lost_after_its_round_completed(self):
        began = time.time()
        survivors = [self.agent("survivor-%d" % i) for i in range(2)]
        victim, victim_log = self.agent("victim", forced=True)
        self.assertEqual(victim.wait(timeout=120), 9, "the forced node was not lost after a round")
        victim_log.seek(0)
        self.assertIn("forced: lost after round", victim_log.read())
        newcomers = [self.agent("newcomer-%d" % i) for i in range(2)]
        codes, logs = {}, {}
        names = ["survivor-0", "survivor-1", "newcomer-0", "newcomer-1"]
        for name, (p, out) in zip(names, survivors + newcomers):
            try:
                codes[name] = p.wait(timeout=max(1, began + 150 - time.time()))
            except subprocess.TimeoutExpired:
                codes[name] = None
            out.seek(0)
            logs[name] = out.read()
        worlds = {n: [line.split()[0] for line in text.splitlines() if line.startswith("world=")] for n, text in logs.items()}
        summary = "exit codes %s; the worlds each trained in %s" % (codes, worlds)
        for name in names:
            self.assertEqual(codes[name], 0, "%s did not finish in 150 s: %s\n%s" % (name, summary, logs[name][-2000:]))
            self.assertTrue(worlds[name] and worlds[name][-1] == "world=4",
                            "%s did not finish in one round with the other three: %s" % (name, summary))
        self.assertIn("the round lost a node before its workers started", logs["survivor-0"] + logs["survivor-1"])
        # every worker knows its rendezvous round (the heartbeat sends it): the four are in one
        rounds = {n: [w for w in text.split() if w.startswith("round=")][-1] for n, text in logs.items()}
        self.assertEqual(len(set(rounds.values())), 1, "the last round each worker ran in: %s" % rounds)
        self.assertNotIn("round=None", rounds.values(), "ETJOB_RDZV_ROUND not given to the workers: %s" % rounds)


@unittest.skipIf(dr is None, "needs torch")
class TorchInternalsTest(unittest.TestCase):
    """etjob.torchrun patches and reads torch internals that torch does not
    promise: a torch that lacks one is refused at start, naming each, instead
    of failing mid-job (or, worse, running without the fix it carried)."""

    def test_this_torch_has_them_all(self):
        self.assertEqual(torchrun._check_torch(), [])

    def test_a_missing_function_is_named(self):
        saved = dr._should_keep_alive
        del dr._should_keep_alive
        try:
            missing = torchrun._check_torch()
        finally:
            dr._should_keep_alive = saved
        self.assertEqual(missing, ["torch.distributed.elastic.rendezvous.dynamic_rendezvous._should_keep_alive"])

    def test_a_missing_handler_field_is_named(self):
        build = dr.DynamicRendezvousHandler.from_backend

        def without_lock(*args, **kwargs):
            h = build(*args, **kwargs)
            del h._heartbeat_lock
            return h

        dr.DynamicRendezvousHandler.from_backend = without_lock
        try:
            missing = torchrun._check_torch()
        finally:
            dr.DynamicRendezvousHandler.from_backend = build
        self.assertEqual(missing, ["dynamic_rendezvous.handler._heartbeat_lock"])

    def test_the_wrapper_refuses_such_a_torch(self):
        code = ("from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr\n"
                "del dr._RendezvousJoinOp.__call__, dr._delay\n"
                "from etjob import torchrun\n"
                "torchrun.main(['--nnodes=1', '--nproc_per_node=1', '-m', 'json.tool', '/dev/null'])\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        env.pop("ETJOB_STORE_SECRET_FILE", None)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 1, out.stderr)
        import torch

        self.assertIn("etjob.torchrun: torch %s lacks what etjob.torchrun patches" % torch.__version__, out.stderr)
        self.assertIn("in it (torch's internals, read on torch 1.13 and 2.15): "
                      "torch.distributed.elastic.rendezvous.dynamic_rendezvous._delay, "
                      "torch.distributed.elastic.rendezvous.dynamic_rendezvous._RendezvousJoinOp.__call__. "
                      "Use one of those versions, or torch's own torchrun", out.stderr)


if __name__ == "__main__":
    unittest.main()
