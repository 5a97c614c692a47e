"""etjob.storeauth: the store's authenticating front and the clients'
tunnel, on real sockets (an echo server stands in for the store where the
test is about the relay), and the loopback-only store on real torch."""

import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

from etjob import storeauth  # noqa: E402

try:
    import torch.distributed as dist
except ImportError:  # pragma: no cover
    dist = None


def echo_server(heard=None):
    """echo_server is an upstream that writes back what it reads, on
    127.0.0.1; it returns its port. heard (a bytearray): what it read is
    added to it too."""
    ls = socket.create_server(("127.0.0.1", 0))

    def serve(c):
        with c:
            while True:
                d = c.recv(65536)
                if not d:
                    return
                if heard is not None:
                    heard.extend(d)
                c.sendall(d)

    def accept():
        while True:
            c, _ = ls.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return ls.getsockname()[1]


def recv_all(s, n):
    buf = bytearray()
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            break
        buf += d
    return bytes(buf)


class FrontTest(unittest.TestCase):
    KEY = b"k" * 32

    def setUp(self):
        self.front = storeauth.Front("127.0.0.1", 0, ("127.0.0.1", echo_server()), self.KEY, who="test front")

    def tunnel(self, key):
        t = storeauth.Tunnel("127.0.0.1", self.front.port, key, timeout=5)
        c = socket.create_connection(("127.0.0.1", t.local_port), timeout=10)
        self.addCleanup(c.close)
        return t, c

    def test_a_client_with_the_secret_is_relayed_both_ways(self):
        _, c = self.tunnel(self.KEY)
        data = os.urandom(8 << 20)  # more than the relays hold: back-pressure, not loss
        threading.Thread(target=c.sendall, args=(data,), daemon=True).start()
        self.assertEqual(recv_all(c, len(data)), data)
        c.shutdown(socket.SHUT_WR)
        self.assertEqual(c.recv(1), b"", "an end is passed on")
        c.close()
        end = time.monotonic() + 10
        while self.front.loop.pairs and time.monotonic() < end:
            time.sleep(0.01)
        self.assertEqual(self.front.loop.pairs, 0, "both ends closed once both sides ended")
        self.assertEqual(self.front.accepted, 1)

    def before_the_store(self):
        """A client of a tunnel to a port no store listens on yet, which has
        sent its first bytes and waited while the tunnel tried again; the
        port and the client."""
        # The port stays bound, not listening, until the test ends: no other
        # socket of a busy machine (an outgoing connection's ephemeral port)
        # takes it meanwhile, and the late front still binds it
        # (SO_REUSEADDR on both, neither listening).
        probe = socket.socket()
        self.addCleanup(probe.close)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        t = storeauth.Tunnel("127.0.0.1", port, self.KEY, timeout=5)
        c = socket.create_connection(("127.0.0.1", t.local_port), timeout=20)
        c.sendall(b"ping")
        time.sleep(1.5)  # the store is not up: the tunnel tries again
        return port, c

    def test_a_client_before_its_store_waits_for_it(self):
        # A torchrun agent that starts before its launcher: c10d's client
        # waits for its server, so the tunnel waits for the front (before,
        # the client's first call broke: "Broken pipe", the agent failed).
        port, c = self.before_the_store()
        self.addCleanup(c.close)
        late = storeauth.Front("127.0.0.1", port, ("127.0.0.1", echo_server()), self.KEY, who="late front")
        self.addCleanup(late.close)
        self.assertEqual(recv_all(c, 4), b"ping")
        self.assertEqual(late.accepted, 1)

    def test_a_client_that_gives_up_ends_the_wait(self):
        # The wait for a store not up yet is bounded by the client: once it
        # closes, the tunnel stops trying and never joins it to a store that
        # comes up later (its thread would otherwise try for 600 s).
        port, c = self.before_the_store()
        c.close()
        time.sleep(1.5)  # past its next try (at most 1 s apart)
        late = storeauth.Front("127.0.0.1", port, ("127.0.0.1", echo_server()), self.KEY, who="late front")
        self.addCleanup(late.close)
        time.sleep(2.5)  # two more tries, had it not given up
        self.assertEqual(late.accepted, 0, "the tunnel joined a client that had gone")

    def closing_server(self, closes):
        """A listener that accepts and closes its first `closes` connections
        (None: every one) in etjob's handshake, as a front starting or
        stopping does (or a store that does not authenticate), then hands
        the port to a real front; the port and the closes so far."""
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port, done = srv.getsockname()[1], []

        def serve():
            while closes is None or len(done) < closes:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                conn.recv(64)
                conn.close()
                done.append(1)
            srv.close()
            front = storeauth.Front("127.0.0.1", port, ("127.0.0.1", echo_server()), self.KEY, who="restarted front")
            self.addCleanup(front.close)

        threading.Thread(target=serve, daemon=True).start()
        self.addCleanup(srv.close)
        return port, done

    def test_a_front_that_closes_once_while_it_restarts_is_tried_again(self):
        # A replaced launcher's front closed a connection in the handshake
        # once; the workers' logs said the store did not authenticate.
        port, closed = self.closing_server(1)
        t = storeauth.Tunnel("127.0.0.1", port, self.KEY, timeout=5)
        c = socket.create_connection(("127.0.0.1", t.local_port), timeout=10)
        self.addCleanup(c.close)
        c.sendall(b"ping")
        self.assertEqual(recv_all(c, 4), b"ping", "relayed by the front that came after the close")
        self.assertEqual((len(closed), t.last_error), (1, ""))

    def test_a_store_that_closes_every_handshake_is_said_not_to_authenticate(self):
        port, closed = self.closing_server(None)
        t = storeauth.Tunnel("127.0.0.1", port, self.KEY, timeout=5)
        c = socket.create_connection(("127.0.0.1", t.local_port), timeout=10)
        self.addCleanup(c.close)
        began = time.monotonic()
        self.assertEqual(c.recv(1), b"", "the tunnel closes the client's connection")
        self.assertIn("it does not authenticate clients", t.last_error)
        self.assertGreaterEqual(time.monotonic() - began, storeauth.CLOSED_GRACE - 0.5)
        self.assertGreater(len(closed), 1, "tried again within the grace")

    def test_another_secret_is_refused_and_said(self):
        t, c = self.tunnel(b"z" * 32)
        self.assertEqual(c.recv(1), b"", "the tunnel closes the client's connection")
        self.assertIn("does not hold this pod's secret", t.last_error)
        self.assertEqual(self.front.accepted, 0)

    def test_a_plain_client_reads_nothing(self):
        c = socket.create_connection(("127.0.0.1", self.front.port), timeout=10)
        self.addCleanup(c.close)
        c.sendall(b"\x00\x00\x00\x05hello")  # a c10d client's first bytes: no handshake
        self.assertEqual(c.recv(100), b"", "closed on its first bytes, with nothing written back")
        self.assertEqual((self.front.accepted, self.front.refused), (0, 1))

    def test_a_replayed_client_proof_is_refused(self):
        # A recorded handshake is no good later: the front's nonce is new.
        c = socket.create_connection(("127.0.0.1", self.front.port), timeout=10)
        self.addCleanup(c.close)
        nonce_c = b"n" * storeauth.NONCE
        c.sendall(storeauth.MAGIC + nonce_c)
        nonce_f = recv_all(c, storeauth.NONCE + storeauth.MAC)[:storeauth.NONCE]
        c.sendall(storeauth._mac(self.KEY, b"etjob-store client", nonce_f, nonce_c))
        c2f, f2c = storeauth.session_keys(self.KEY, nonce_c, nonce_f)
        c.sendall(storeauth.Sealer(c2f).seal(b"ping"))
        self.assertEqual(storeauth.Opener(f2c).open(recv_all(c, 4 + 4 + storeauth.TAG)), b"ping")
        d = socket.create_connection(("127.0.0.1", self.front.port), timeout=10)
        self.addCleanup(d.close)
        d.sendall(storeauth.MAGIC + nonce_c)
        recv_all(d, storeauth.NONCE + storeauth.MAC)
        d.sendall(storeauth._mac(self.KEY, b"etjob-store client", nonce_f, nonce_c))  # the old proof
        self.assertEqual(d.recv(4), b"")
        self.assertEqual(self.front.accepted, 1)

    def test_silent_clients_are_dropped_and_bounded(self):
        # More silent connections than may wait: the oldest are closed for
        # new ones, the rest after the handshake's deadline; a client with
        # the secret is served all along.
        silent = [socket.create_connection(("127.0.0.1", self.front.port)) for _ in range(storeauth.MAX_PENDING + 20)]
        _, c = self.tunnel(self.KEY)
        c.sendall(b"ping")
        self.assertEqual(recv_all(c, 4), b"ping")
        silent[0].settimeout(10)
        self.assertEqual(silent[0].recv(1), b"", "the oldest silent connection was closed for a new one")
        last = silent[-1]
        last.settimeout(storeauth.HANDSHAKE_SECONDS + 10)
        began = time.monotonic()
        self.assertEqual(last.recv(1), b"")
        print("a silent connection was closed after %.1f s" % (time.monotonic() - began))
        for s in silent:
            s.close()


class RelayedImpostorTest(unittest.TestCase):
    """Something between a tunnel and the front (an impostor that resolved
    as the store and relays the handshake to the real one) injects bytes
    after the handshake, in either direction: the connection ends and the
    injected bytes reach neither the store nor the client (issue #42, C2).
    Before records, both reached their target."""

    KEY = b"k" * 32

    def setUp(self):
        self.heard = bytearray()
        self.front = storeauth.Front("127.0.0.1", 0, ("127.0.0.1", echo_server(self.heard)), self.KEY, who="test front")
        self.addCleanup(self.front.close)
        self.inject = {"to_front": None, "to_client": None}
        self.ls = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(self.ls.close)
        threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self):
        """A man in the middle: passes everything through, and once the
        handshake went by (the client's proof), sends what the test asks,
        in the direction it asks."""
        c, _ = self.ls.accept()
        f = socket.create_connection(("127.0.0.1", self.front.port))
        hello = len(storeauth.MAGIC) + storeauth.NONCE

        def pipe(src, dst, first, key):
            seen = 0
            while True:
                try:
                    d = src.recv(65536)
                except OSError:
                    d = b""
                if not d:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                try:
                    dst.sendall(d)
                except OSError:
                    return
                seen += len(d)
                if seen >= first and self.inject[key] is not None:
                    extra, self.inject[key] = self.inject[key], None
                    try:
                        dst.sendall(extra)
                    except OSError:
                        return

        threading.Thread(target=pipe, args=(c, f, hello + storeauth.MAC, "to_front"), daemon=True).start()
        pipe(f, c, storeauth.NONCE + storeauth.MAC, "to_client")

    def client(self):
        t = storeauth.Tunnel("127.0.0.1", self.ls.getsockname()[1], self.KEY, timeout=5)
        c = socket.create_connection(("127.0.0.1", t.local_port), timeout=10)
        self.addCleanup(c.close)
        return c

    def frame(self):
        """A c10d frame a relay would inject: an add to a key that ends a generation."""
        return b"\x02\x00\x00\x00\x00\x00\x00\x00\x0detjob/g1/end\x01\x00\x00\x00\x00\x00\x00\x00"

    def test_a_frame_injected_toward_the_store_never_reaches_it(self):
        self.inject["to_front"] = self.frame()
        c = self.client()
        c.sendall(b"ping")
        try:
            recv_all(c, 4)  # the echo, or the end: the record before the injected bytes may pass or not
        except (ConnectionResetError, socket.timeout):
            pass
        end = time.monotonic() + 10
        while not getattr(self.front.loop, "forged", 0) and self.frame() not in bytes(self.heard) and time.monotonic() < end:
            time.sleep(0.01)
        self.assertNotIn(self.frame(), bytes(self.heard), "the injected frame reached the store")
        self.assertEqual(self.front.loop.forged, 1, "the front did not refuse the injected record")

    def test_bytes_injected_toward_the_client_never_reach_it(self):
        self.inject["to_client"] = b"\x00\x00\x00\x04fake" + b"\x00" * 16  # a record's shape, a forged tag
        c = self.client()
        c.sendall(b"ping")
        try:
            got = recv_all(c, 8)
        except (ConnectionResetError, socket.timeout):
            got = b""
        self.assertNotIn(b"fake", got, "the client read the relay's bytes")
        self.assertEqual(got, b"", "the tunnel did not end the client's connection")


class ForeignClientTest(unittest.TestCase):
    """With hostNetwork a node's loopback is every host-network process's:
    the tunnel, which passes its clients' bytes on authenticated, serves the
    sockets of its own process and its children only (issue #42, M4)."""

    KEY = b"k" * 32

    def test_a_connection_from_another_process_is_closed(self):
        front = storeauth.Front("127.0.0.1", 0, ("127.0.0.1", echo_server()), self.KEY, who="test front")
        self.addCleanup(front.close)
        t = storeauth.Tunnel("127.0.0.1", front.port, self.KEY, timeout=5)
        out = tempfile.NamedTemporaryFile(delete=False)
        out.close()
        self.addCleanup(os.unlink, out.name)
        # The shell starts the client in the background and exits: the
        # client is no child of this process (it goes to init).
        subprocess.run(["sh", "-c", '"$0" -c "$1" "$2" > "$3" 2>&1 &', sys.executable, FOREIGN_CLIENT,
                        str(t.local_port), out.name], check=True)
        end = time.monotonic() + 30
        said = ""
        while time.monotonic() < end:
            with open(out.name) as f:
                said = f.read()
            if said.endswith("\n"):
                break
            time.sleep(0.05)
        self.assertEqual(said, "closed\n", "a process outside this one was served through the tunnel")
        self.assertEqual(t.refused, 1)
        # This process's own client is served.
        c = socket.create_connection(("127.0.0.1", t.local_port), timeout=10)
        self.addCleanup(c.close)
        c.sendall(b"ping")
        self.assertEqual(recv_all(c, 4), b"ping")
        self.assertEqual(t.refused, 1)


    def test_an_ipv6_client_of_this_process_is_served(self):
        # torch's c10d client reaches 127.0.0.1 over an IPv6 socket
        # (::ffff:127.0.0.1), which /proc/net/tcp6 lists: the CI run that
        # first had the check refused every torch client of the tunnels
        front = storeauth.Front("127.0.0.1", 0, ("127.0.0.1", echo_server()), self.KEY, who="test front")
        self.addCleanup(front.close)
        t = storeauth.Tunnel("127.0.0.1", front.port, self.KEY, timeout=5)
        c = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.addCleanup(c.close)
        c.settimeout(10)
        c.connect(("::ffff:127.0.0.1", t.local_port))
        c.sendall(b"ping")
        self.assertEqual(recv_all(c, 4), b"ping")
        self.assertEqual(t.refused, 0)


FOREIGN_CLIENT = """
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
c.sendall(b"ping")
try:
    got = c.recv(4)
except ConnectionResetError:
    got = b""
print("closed" if got == b"" else repr(got), flush=True)
"""


class ForkTest(unittest.TestCase):
    """A tunnel whose connection to the front breaks (a reset) ends its
    client's connection even when a process forked from the client's (a
    DataLoader's workers) holds a copy of every fd: a close alone sends
    nothing then, and the c10d client waited for ever."""

    KEY = b"k" * 32

    def test_a_broken_front_ends_the_client_in_a_forked_process(self):
        # The front, in a process of its own (a fork of this one would keep
        # its connection open too): the handshake, "hi", then on a line from
        # stdin a reset, as a broken node's connection ends.
        front = subprocess.Popen([sys.executable, "-c", FAKE_FRONT, self.KEY.decode()], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        self.addCleanup(front.wait)
        self.addCleanup(front.kill)
        t = storeauth.Tunnel("127.0.0.1", int(front.stdout.readline()), self.KEY, timeout=5)
        c = socket.create_connection(("127.0.0.1", t.local_port), timeout=10)
        self.addCleanup(c.close)
        self.assertEqual(recv_all(c, 2), b"hi")
        pid = os.fork()
        if pid == 0:  # the forked process holds every fd and does nothing
            time.sleep(30)
            os._exit(0)
        self.addCleanup(lambda: (os.kill(pid, 9), os.waitpid(pid, 0)))
        front.stdin.write("reset\n")
        front.stdin.flush()
        c.settimeout(10)
        try:
            got = c.recv(1)
        except ConnectionResetError:
            got = b""
        except socket.timeout:
            got = None
        self.assertEqual(got, b"", "the client's connection did not end while a forked process held its copy")


FAKE_FRONT = """
import os, socket, sys
from etjob import storeauth
key = sys.argv[1].encode()
ls = socket.create_server(("127.0.0.1", 0))
print(ls.getsockname()[1], flush=True)
c, _ = ls.accept()
def recv(n):
    b = b""
    while len(b) < n:
        b += c.recv(n - len(b))
    return b
nonce_c = recv(len(storeauth.MAGIC) + storeauth.NONCE)[len(storeauth.MAGIC):]
nonce_f = os.urandom(storeauth.NONCE)
c.sendall(nonce_f + storeauth._mac(key, b"etjob-store server", nonce_c, nonce_f))
recv(storeauth.MAC)
c.sendall(storeauth.Sealer(storeauth.session_keys(key, nonce_c, nonce_f)[1]).seal(b"hi"))
sys.stdin.readline()
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00")
c.close()
"""


class SecretTest(unittest.TestCase):
    def test_a_named_secret_must_be_usable(self):
        d = os.path.join("/tmp", "etjob-secret-test-%d" % os.getpid())
        os.makedirs(d, exist_ok=True)
        short = os.path.join(d, "short")
        with open(short, "w") as f:
            f.write("abc\n")
        for path, want in ((os.path.join(d, "missing"), "cannot be read"), (short, "has 3 bytes")):
            with self.assertRaises(storeauth.SecretError) as got:
                storeauth.load_secret(path)
            self.assertIn(want, str(got.exception))
            self.assertIn(path, str(got.exception))
        old = os.environ.pop(storeauth.ENV, None)
        try:
            self.assertIsNone(storeauth.load_secret())
            self.assertEqual(storeauth.route("example.invalid", 29400), ("example.invalid", 29400))
        finally:
            if old is not None:
                os.environ[storeauth.ENV] = old


@unittest.skipIf(dist is None, "needs torch")
class LoopbackStoreTest(unittest.TestCase):
    def test_the_store_listens_on_loopback_only(self):
        from datetime import timedelta

        store, port = storeauth.loopback_store(timedelta(seconds=30))
        store.set("k", "v")
        other = [a for a in _addresses() if not a.startswith("127.")]
        if not other:
            self.skipTest("this machine has no address but loopback")
        for addr in other:
            with self.assertRaises(OSError, msg="the store answered on %s:%d" % (addr, port)):
                socket.create_connection((addr, port), timeout=2).close()
        c = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        self.assertEqual(c.get("k"), b"v")


def _netns_available():
    """_netns_available reports whether this process may make network
    namespaces and veth pairs (root, iproute2)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = "etjobprobe%d" % os.getpid()
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return True


# A store client as a rank's watcher uses one: an add every 0.2 s; it says
# when the store answered last, and when a call failed.
CLIENT = """
import sys, time
from datetime import timedelta
from etjob import storeclient
c = storeclient.new_client(sys.argv[1], int(sys.argv[2]), timedelta(seconds=120))
last = time.monotonic()
while True:
    try:
        c.add("beat", 1)
    except Exception as e:
        print("lost %.1f s after the last answer: %s" % (time.monotonic() - last, (str(e).splitlines() or ["?"])[0]), flush=True)
        sys.exit(0)
    last = time.monotonic()
    print("ok", flush=True)
    time.sleep(0.2)
"""


@unittest.skipUnless(dist is not None and _netns_available(), "needs torch, root and ip netns")
class VanishedStoreTest(unittest.TestCase):
    """A store whose node vanishes (its link gone: no FIN, no reset, a
    half-open connection) is found by its clients in about
    $ETJOB_STORE_SILENCE_SECONDS: the tunnel's connection to the front is
    bounded (storeauth.bound_silence). c10d's own client would wait for
    its call's timeout (here 120 s) on torch 2.x, and for TCP's ~15 minutes
    of retransmissions on torch 1.13, whose add has no timeout. The store
    runs in a network namespace of its own, behind a veth pair whose far end
    the test takes down."""

    SILENCE = 4

    def setUp(self):
        tag = "%d" % (os.getpid() % 100000)
        self.ns, here = "etjobst" + tag, "etjs" + tag
        self.addr = "10.213.77.2"

        def ip(*args, ns=None):
            cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip"] + list(args)
            subprocess.run(cmd, check=True, capture_output=True)

        ip("netns", "add", self.ns)
        self.addCleanup(subprocess.run, ["ip", "netns", "del", self.ns], capture_output=True)
        ip("link", "add", here, "type", "veth", "peer", "name", "store0")
        self.addCleanup(subprocess.run, ["ip", "link", "del", here], capture_output=True)
        ip("link", "set", "store0", "netns", self.ns)
        ip("addr", "add", "10.213.77.1/30", "dev", here)
        ip("link", "set", here, "up")
        ip("addr", "add", self.addr + "/30", "dev", "store0", ns=self.ns)
        ip("link", "set", "store0", "up", ns=self.ns)
        ip("link", "set", "lo", "up", ns=self.ns)
        self.ip = ip

    def test_a_vanished_store_is_found_in_the_silence_bound(self):
        secret = storeauth.write_secret(os.path.join(tempfile.mkdtemp(prefix="etjob-vanish-"), "secret"))
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"),
                   ETJOB_STORE_SECRET_FILE=secret, ETJOB_STORE_SILENCE_SECONDS=str(self.SILENCE))
        store = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, "-m", "etjob.rdzv", "--host", self.addr,
                                  "--port", "29400"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.addCleanup(store.wait)
        self.addCleanup(store.kill)
        self.assertIn("listening", store.stdout.readline())
        client = subprocess.Popen([sys.executable, "-c", CLIENT, self.addr, "29400"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        self.addCleanup(client.wait)
        self.addCleanup(client.kill)
        for _ in range(5):
            self.assertEqual(client.stdout.readline().strip(), "ok", "the client never reached the store")
        self.ip("link", "set", "store0", "down", ns=self.ns)  # the store's node is gone, silently
        began = time.monotonic()
        got = ""
        # poll, not select: the test process may hold more than 1,024 fds by
        # now (select refuses those: "filedescriptor out of range")
        watch = select.poll()
        watch.register(client.stdout, select.POLLIN | select.POLLHUP)
        while not got and time.monotonic() - began < 60:
            ready = watch.poll(1000)  # a client stuck in a call prints nothing
            line = client.stdout.readline() if ready else "ok"
            if not line or line.startswith("lost"):
                got = line.strip() or "the client exited"
        took = time.monotonic() - began
        print("a vanished store, %.1f s after its link went down: %s" % (took, got or "no call failed"))
        self.assertTrue(got.startswith("lost"), "no store call failed in 60 s (the silence bound is %d s)" % self.SILENCE)
        self.assertLess(took, 4 * self.SILENCE + 5, got)


def _addresses():
    """_addresses lists this machine's IPv4 addresses (from the routes the
    kernel keeps, no tool needed)."""
    out = set()
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for i, line in enumerate(lines):
        if "/32 host LOCAL" in line and i > 0:
            out.add(lines[i - 1].split()[-1])
    return sorted(out)


if __name__ == "__main__":
    unittest.main()
