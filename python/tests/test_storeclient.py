"""etjob.storeclient's compare_set on torch 1.x: torch builds that call's
answer without the GIL (pytorch/pytorch#123983), which crashes a process
whose other threads run Python; etjob asks it over a socket of its own there.
Real TCPStore servers and clients, on each torch the tests run with."""

import contextlib
import io
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(os.path.dirname(HERE))
sys.path.insert(0, PYTHON)

try:
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover
    torch = dist = None

if dist is not None:
    from etjob import storeauth, storeclient

_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) if torch is not None else (0, 0)

# A thread that allocates small Python objects without pause beside a loop of
# compare_set calls whose answers are small: torch < 2.4 builds each answer
# while that thread holds the GIL. argv: the client to use, seconds to run.
_CHURN = textwrap.dedent("""
    import sys, threading, time
    from datetime import timedelta
    import torch.distributed as dist
    from etjob import storeclient

    srv = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    raw = dist.TCPStore("127.0.0.1", srv.port, is_master=False, timeout=timedelta(seconds=10))
    if sys.argv[1] == "c10d":
        client = raw
    elif sys.argv[1] == "storeclient":
        client = storeclient.StoreClient(raw, "127.0.0.1", srv.port)
    else:
        client = storeclient.gil_safe(raw)
    stop = []

    def churn():
        keep = []
        while not stop:
            keep.append(b"x" * 30 + bytes(len(keep) % 7))
            if len(keep) > 1000:
                del keep[:500]

    threading.Thread(target=churn, daemon=True).start()
    end, n = time.monotonic() + float(sys.argv[2]), 0
    while time.monotonic() < end:
        assert client.compare_set("k", "", "y" * 30) == b"y" * 30
        n += 1
    stop.append(1)
    print("calls", n, flush=True)
""")


def _no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash the test forces leaves no core file behind


def _churn(kind, seconds):
    env = dict(os.environ, PYTHONPATH=PYTHON)
    return subprocess.run([sys.executable, "-c", _CHURN, kind, str(seconds)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=seconds + 60, cwd=tempfile.gettempdir(),
                          preexec_fn=_no_core)


@unittest.skipIf(dist is None, "needs torch")
class CompareSetWithoutGILTest(unittest.TestCase):
    @unittest.skipIf(_TORCH >= (2, 4), "torch >= 2.4 builds compare_set's answer with the GIL")
    def test_torchs_own_compare_set_crashes_beside_a_python_thread(self):
        """The harness forces the defect: without etjob's socket the
        process dies (in a second here; 20 s allowed)."""
        got = _churn("c10d", 20)
        self.assertLess(got.returncode, 0, "torch's compare_set survived 20 s beside a Python thread: the harness no "
                        "longer forces the defect (%s)" % got.stdout.strip())

    def test_etjobs_compare_set_survives_beside_a_python_thread(self):
        for kind in ("storeclient", "gil_safe"):
            got = _churn(kind, 3)
            self.assertEqual(got.returncode, 0, "%s: %s" % (kind, got.stderr[-2000:]))
            self.assertGreater(int(got.stdout.split()[-1]), 10, kind)


@unittest.skipIf(dist is None, "needs torch")
@unittest.skipIf(dist is None, "needs torch")
class WaitTest(unittest.TestCase):
    """StoreClient.wait (the rendezvous' wait for a generation's close,
    issue #43): on torch 2.x a wait that times out says so and leaves the
    client in step with its server; on torch 1.13, whose client it puts out
    of step, it is refused."""

    def test_a_timed_out_wait_keeps_the_client_in_step(self):
        srv = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
        raw = dist.TCPStore("127.0.0.1", srv.port, is_master=False, timeout=timedelta(seconds=10))
        c = storeclient.StoreClient(raw, "127.0.0.1", srv.port, limit=1.0)
        # once srv is gone, a later test's reconnect asks every client of the
        # process to call (storeclient._after_loss): this one must not wait
        # for its dead server (with the default limit a CI run waited 600 s)
        self.addCleanup(storeclient._clients.discard, c)
        if not storeclient.WAIT_SAFE:
            with self.assertRaisesRegex(RuntimeError, "out of step"):
                c.wait(["missing"], timedelta(seconds=0.1))
            return
        for i in range(3):
            self.assertFalse(c.wait(["missing"], timedelta(seconds=0.1)))
            self.assertEqual(c.add("counter", 1), i + 1)  # the answer to this call, not a late one to the wait
        srv.set("missing", "here")
        self.assertTrue(c.wait(["missing"], timedelta(seconds=1)))
        self.assertEqual(c.get("missing"), b"here")
        self.assertEqual(c.reconnects, 0)


class WireCompareSetTest(unittest.TestCase):
    """etjob's compare_set answers and stores what torch's does."""

    def setUp(self):
        self.srv = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
        self.raw = dist.TCPStore("127.0.0.1", self.srv.port, is_master=False, timeout=timedelta(seconds=10))

    def cases(self, cs):
        big = bytes(range(256)) * 4096  # a megabyte
        steps = [
            ("a", "", "first"),           # absent, "" expected: set
            ("a", "", "other"),           # present: its value, unchanged
            ("a", b"first", b"second"),   # a bytes token that matches: set
            ("a", "wrong", "third"),      # no match: the value
            ("b", "-absent-", "-absent-"),  # absent, expected given: expected back, nothing set
            ("c", "", b"\x00\xff\xfe"),   # any bytes
            ("c", b"\x00\xff\xfe", ""),   # an empty value
            ("d", "", big),
            ("d", big, "small"),
        ]
        # (a megabyte answer is named by its length: a failed comparison's diff would take minutes)
        return [(lambda got: got if len(got) < 4096 else len(got))(cs(k, e, d)) for k, e, d in steps]

    def test_same_answers_and_values_as_torchs(self):
        if not storeclient.WIRE_COMPARE_SET:
            self.skipTest("torch %s: compare_set is torch's own" % torch.__version__)
        theirs = self.cases(lambda k, e, d: self.raw.compare_set("t/" + k, e, d))
        wire = storeclient.gil_safe(self.raw)
        self.assertIsInstance(wire, storeclient.GILSafeStore)
        ours = self.cases(lambda k, e, d: wire.compare_set("o/" + k, e, d))
        self.assertEqual(ours, theirs)
        for k in ("a", "c", "d"):
            self.assertEqual(self.raw.get("o/" + k), self.raw.get("t/" + k), k)
        self.assertEqual(self.raw.add("o/b", 0), 0, "expected given on an absent key sets nothing")
        self.assertEqual(wire.add("n", 2), 2, "every other call is the client's")

    def test_store_client_on_each_torch(self):
        c = storeclient.StoreClient(self.raw, "127.0.0.1", self.srv.port)
        self.assertEqual(c._wire is not None, _TORCH < (2, 0))
        self.assertEqual(self.cases(c.compare_set)[:5], [b"first", b"first", b"second", b"second", b"-absent-"])
        self.assertIs(storeclient.gil_safe(self.raw) is self.raw, _TORCH >= (2, 0))

    def test_a_replaced_store_is_asked_again_and_a_lost_one_is_a_runtime_error(self):
        if not storeclient.WIRE_COMPARE_SET:
            self.skipTest("torch %s: compare_set is torch's own" % torch.__version__)

        def store():
            return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))

        first = store()
        where = [("127.0.0.1", first.port)]
        wire = storeclient.WireCompareSet(lambda: where[0], 5)
        self.assertEqual(wire("k", "", "v"), b"v")
        # the store replaced (here at another port): the connection made
        # before is to a store that is gone, and the call goes to the new one
        other = store()
        where[0] = ("127.0.0.1", other.port)
        del first
        self.assertEqual(wire("k", "", "w"), b"w", "asked again on a new connection, of the store now named")
        del other
        with self.assertRaises(RuntimeError) as got:
            wire("k", "", "x")
        self.assertIn("compare_set 'k' at 127.0.0.1:", str(got.exception))

    def test_a_reconnect_of_the_store_client_closes_the_compare_set_connection(self):
        c = storeclient.StoreClient(self.raw, "127.0.0.1", self.srv.port, limit=5)
        c.compare_set("r", "", "1")
        if c._wire is not None:
            self.assertIsNotNone(c._wire._sock)
        self.assertTrue(c._reconnect(c.reconnects, RuntimeError("a test's")), "the store answered at once")
        if c._wire is not None:
            self.assertIsNone(c._wire._sock, "the next compare_set connects to the store now there")
        self.assertEqual(c.compare_set("r", "1", "2"), b"2")

    def test_through_the_authenticating_tunnel(self):
        d = tempfile.mkdtemp(prefix="etjob-storeclient-")
        secret = storeauth.write_secret(os.path.join(d, "secret"))
        key = storeauth.load_secret(secret)
        front = storeauth.Front("127.0.0.1", 0, ("127.0.0.1", self.srv.port), key, who="test front")
        old = os.environ.get(storeauth.ENV)
        os.environ[storeauth.ENV] = secret
        try:
            c = storeclient.StoreClient(storeclient.new_client("127.0.0.1", front.port, timedelta(seconds=10)),
                                        "127.0.0.1", front.port)
            self.assertEqual(c.compare_set("tk", "", "v1"), b"v1")
            self.assertEqual(c.compare_set("tk", "v1", "v2"), b"v2")
            self.assertEqual(self.raw.get("tk"), b"v2", "written through the front")
        finally:
            if old is None:
                os.environ.pop(storeauth.ENV, None)
            else:
                os.environ[storeauth.ENV] = old


# A store server that imports torch first, then listens on argv's port
# once told to (a line on stdin): the test times its return to the moment.
_LATE_SERVER = textwrap.dedent("""
    import sys, time
    from datetime import timedelta
    import torch.distributed as dist
    print("ready", flush=True)
    sys.stdin.readline()
    srv = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                        timeout=timedelta(seconds=10))
    print("listening", flush=True)
    sys.stdin.readline()
""")


@unittest.skipIf(dist is None, "needs torch")
class ReconnectPaceTest(unittest.TestCase):
    """A client of a lost store finds its replacement soon after it
    listens: the ranks of a job then come back within a fraction of a
    rendezvous' settle (0.5 s) of each other. At a retry of 1 s a member
    came a second after the others, and the generation the members formed
    with a newcomer closed without it (test_elastic_faults.StoreLossTest,
    a CI run)."""

    def server(self, port):
        p = subprocess.Popen([sys.executable, "-c", _LATE_SERVER, str(port)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
        self.addCleanup(lambda: (p.kill(), p.wait(), p.stdin.close(), p.stdout.close()))
        self.assertEqual(p.stdout.readline().strip(), "ready")
        return p

    def listen(self, p):
        p.stdin.write("go\n")
        p.stdin.flush()
        self.assertEqual(p.stdout.readline().strip(), "listening")
        return time.monotonic()

    def test_a_lost_store_is_found_again_soon_after_it_listens(self):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        first, second = self.server(port), self.server(port)
        self.listen(first)
        c = storeclient.StoreClient(storeclient.new_client("127.0.0.1", port, timedelta(seconds=10)), "127.0.0.1", port,
                                    limit=30)
        self.assertEqual(c.add("k", 1), 1)
        first.kill()
        first.wait()
        done = []
        t = threading.Thread(target=lambda: done.append((c.add("k", 5), time.monotonic())), daemon=True)
        with contextlib.redirect_stderr(io.StringIO()) as said:
            t.start()
            time.sleep(0.3)  # its first try failed: it waits for the next
            back = self.listen(second)
            t.join(20)
        self.assertTrue(done, "no answer from the new store in 20 s: " + said.getvalue())
        value, at = done[0]
        self.assertEqual(value, 5, "a new store: the old count is gone")
        self.assertLess(at - back, 0.5, "the client found the store %.2f s after it listened" % (at - back))


if __name__ == "__main__":
    unittest.main()
