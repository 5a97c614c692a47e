"""etjob.storeauth: the store's authenticating front and the clients'
tunnel, on real sockets (an echo server stands in for the store where the
test is about the relay), and the loopback-only store on real torch."""

import os
import socket
import sys
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


def echo_server():
    """echo_server is an upstream that writes back what it reads, on
    127.0.0.1; it returns its port."""
    ls = socket.create_server(("127.0.0.1", 0))

    def serve(c):
        with c:
            while True:
                d = c.recv(65536)
                if not d:
                    return
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
        c.sendall(b"ping")
        self.assertEqual(recv_all(c, 4), b"ping")
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
