import dataclasses
import inspect
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from datetime import datetime, timedelta, timezone

from agentstub import AgentStub

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from etjob import torchrun
except ImportError:  # pragma: no cover
    dr = None


@unittest.skipIf(dr is None, "needs torch")
class CompleteWhenExpectedTest(unittest.TestCase):
    """A round the members expect N+1 nodes in completes as soon as N+1 have
    joined, even when the last to join was a joiner whose own max_nodes is the
    job's maximum (it used to wait out last_call_timeout)."""

    def setUp(self):
        self.join = torchrun._complete_when_expected(dr._RendezvousJoinOp.__call__)
        self.settings = dr.RendezvousSettings(
            run_id="r", min_nodes=1, max_nodes=6, timeout=dr.RendezvousTimeout(last_call=timedelta(seconds=3)),
            keep_alive_interval=timedelta(seconds=5), keep_alive_max_attempt=3)
        self.nodes = [dr._NodeDesc("n%d" % i, 1, 0) for i in range(4)]

    def now(self):
        # torch's rendezvous state holds its times as torch's own clock gives
        # them: naive UTC on 1.13, aware UTC on 2.x (comparing the two
        # raises "can't compare offset-naive and offset-aware datetimes").
        return datetime.now(timezone.utc) if "timezone.utc" in inspect.getsource(dr) else datetime.utcnow()

    def act(self, node, participants, max_nodes, complete=False):
        state = dr._RendezvousState()
        state.round = 2
        state.complete = complete
        for n in participants:
            state.participants[n] = 0
            state.last_heartbeats[n] = self.now()
        state.deadline = self.now() + timedelta(seconds=3)  # the last call, as torch set it
        settings = dataclasses.replace(self.settings, max_nodes=max_nodes)
        return self.join(dr._RendezvousJoinOp(), dr._RendezvousContext(node, state, settings), time.monotonic() + 60)

    def test_member_completes_once_the_expected_nodes_joined(self):
        # members n0..n2 expect 4 nodes; the joiner n3 added itself last.
        self.assertEqual(self.act(self.nodes[0], self.nodes, max_nodes=4), dr._Action.MARK_RENDEZVOUS_COMPLETE)

    def test_member_waits_while_some_are_missing(self):
        self.assertNotEqual(self.act(self.nodes[0], self.nodes[:3], max_nodes=4), dr._Action.MARK_RENDEZVOUS_COMPLETE)

    def test_torch_rules_otherwise(self):
        # the joiner's own settings (max 6) do not complete a round of 4;
        self.assertNotEqual(self.act(self.nodes[3], self.nodes, max_nodes=6), dr._Action.MARK_RENDEZVOUS_COMPLETE)
        # a complete round is left alone.
        self.assertEqual(self.act(self.nodes[0], self.nodes, max_nodes=4, complete=True), dr._Action.FINISH)

    def test_a_pod_told_to_leave_never_completes_a_round(self):
        torchrun._sup = _Told()
        try:
            self.assertNotEqual(self.act(self.nodes[0], self.nodes, max_nodes=4), dr._Action.MARK_RENDEZVOUS_COMPLETE)
        finally:
            torchrun._sup = None


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
        self.env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
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

        store = TCPStore("127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=10))
        got = C10dRendezvousBackend(store, "leave-test").get_state()
        return pickle.loads(got[0]) if got else None

    def test_told_to_leave_while_waiting(self):
        script = os.path.join(tempfile.mkdtemp(), "noop.py")
        with open(script, "w") as f:
            f.write("print('trained')\n")
        env = dict(self.env, ETJOB_AGENT_ADDR=self.agent.addr, ETJOB_NAMESPACE="ns", ETJOB_POD_NAME="w-0")
        p = subprocess.Popen(
            [sys.executable, "-m", "etjob.torchrun", "--nnodes=2:3", "--nproc_per_node=1", "--rdzv_backend=c10d",
             "--rdzv_endpoint=127.0.0.1:%d" % self.port, "--rdzv_id=leave-test",
             "--rdzv_conf=is_host=false,join_timeout=600,last_call_timeout=3", script],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.time() + 120
            while True:
                st = self.state()
                if st is not None and len(st.participants) == 1:
                    break
                self.assertLess(time.time(), deadline, "the agent never joined the round")
                self.assertIsNone(p.poll(), p.stdout.read() if p.poll() is not None else "")
                time.sleep(0.2)
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


if __name__ == "__main__":
    unittest.main()
