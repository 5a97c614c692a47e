"""Authenticated connections to a job's rendezvous store (stdlib only).

c10d's TCPStore authenticates no one: whoever reaches its port may end a
generation, win a state sync with a forged step, or read every key (torch
2.x serves list_keys). So a job's store is served in two parts (etjob.rdzv):
the TCPStore itself listens on loopback only, and a front of etjob's own
listens on the pod's address and joins a connection to it only after the
client proved that it holds the job's secret. The secret is the file named
by $ETJOB_STORE_SECRET_FILE: the controller makes one per job (the Secret
`<job>-store`, random, never in any pod's environment) and mounts it into the
job's launcher and workers.

A client (etjob.elastic's store clients, etjob.torchrun's rendezvous) talks
to the front through a tunnel in its own process: c10d's client connects to
the tunnel on 127.0.0.1, and the tunnel opens a connection to the front for
each one, proves the secret, and then moves the bytes of c10d's own protocol
both ways, in records (below). A connection to the front that goes unanswered for
$ETJOB_STORE_SILENCE_SECONDS (30) ends (bound_silence): a store whose node
vanished is found in that time, and its clients connect again.

The handshake (fixed sizes, HMAC-SHA256 with the secret as its key):

    client -> front   MAGIC, nonce_c (32 bytes)
    front  -> client  nonce_f (32), HMAC(b"etjob-store server" + nonce_c + nonce_f)
    client -> front   HMAC(b"etjob-store client" + nonce_f + nonce_c)

Each side proves the secret over the other's fresh nonce, so neither a
replayed handshake nor a store that does not hold the secret passes. The
client speaks first, as c10d's own clients do: one without the secret (a
plain TCPStore client) is closed on its first bytes and reads nothing.

After the handshake every byte moves in records, each direction with a key
of its own derived from the secret and both nonces:

    length (4 bytes, big-endian, 1..RECORD), payload, TAG bytes of
    HMAC-SHA256(key_dir, sequence number (8 bytes) + length + payload)

The sequence number counts that direction's records from 0 and is never
sent. A record whose tag does not verify (bytes a relay injected, changed,
replayed or reordered after relaying the handshake: an impostor that
resolved as the store) ends the connection, and nothing of it reaches the
store or the client. What a member of the job sends is still trusted as a
member's (docs/security.md).
The front bounds what unauthenticated clients cost: a handshake must finish
in HANDSHAKE_SECONDS, and at most MAX_PENDING wait at once (the oldest is
closed for a new one).
"""

import collections
import hashlib
import hmac
import os
import select
import selectors
import socket
import stat
import sys
import threading
import time

from etjob import contract

MAGIC = b"ETJOB-STORE-2\n"  # 2: records with a tag after the handshake
NONCE = 32
MAC = 32
TAG = 16          # bytes of a record's HMAC-SHA256 kept
RECORD = 65536    # a record's payload, at most
HANDSHAKE_SECONDS = 5.0
MAX_PENDING = 256
MIN_SECRET = 16
#: How many bytes a relay holds for a side that does not read before it
#: stops reading the other side (c10d's messages are small; a state never
#: moves through the store).
_HIGH_WATER = 4 << 20

ENV = contract.ENV_STORE_SECRET_FILE


class SecretError(RuntimeError):
    """The job's store secret is configured but cannot be used."""


def load_secret(path=None):
    """load_secret returns the job's store secret (bytes), read from path or
    $ETJOB_STORE_SECRET_FILE, or None when neither names one. A named file
    that is missing, unreadable or shorter than MIN_SECRET bytes is an error,
    never a silent fall back to an unauthenticated store."""
    path = path or os.environ.get(ENV) or None
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as e:
        raise SecretError("the store secret %s ($%s) cannot be read: %s" % (path, ENV, e)) from None
    if len(key) < MIN_SECRET:
        raise SecretError("the store secret %s ($%s) has %d bytes; at least %d are needed" % (path, ENV, len(key), MIN_SECRET))
    return key


def write_secret(path):
    """write_secret writes a new random job secret to path (readable by its
    owner only) and returns path: for a store and its clients started by
    hand (the controller makes a job's as a Secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex())
    return path


def _mac(key, label, a, b):
    return hmac.new(key, label + a + b, hashlib.sha256).digest()


def session_keys(key, nonce_c, nonce_f):
    """session_keys are a connection's record keys, (client to front, front
    to client), from the secret and the handshake's nonces."""
    return _mac(key, b"etjob-store c2f", nonce_c, nonce_f), _mac(key, b"etjob-store f2c", nonce_c, nonce_f)


def _tag(key, seq, head, payload):
    return hmac.new(key, seq.to_bytes(8, "big") + head + payload, hashlib.sha256).digest()[:TAG]


class RecordError(RuntimeError):
    """A record that does not verify: its connection ends."""


class Sealer:
    """Sealer writes one direction's records (seal)."""

    def __init__(self, key):
        self.key, self.seq = key, 0

    def seal(self, data):
        """seal is data as records (RECORD bytes of payload each at most)."""
        out = bytearray()
        for i in range(0, len(data), RECORD):
            payload = bytes(data[i:i + RECORD])
            head = len(payload).to_bytes(4, "big")
            out += head + payload + _tag(self.key, self.seq, head, payload)
            self.seq += 1
        return bytes(out)


class Opener:
    """Opener reads one direction's records (open): bytes in, the payloads
    of the records they complete out; a record that does not verify raises
    RecordError."""

    def __init__(self, key):
        self.key, self.seq, self.buf = key, 0, bytearray()

    def open(self, data):
        self.buf += data
        out = bytearray()
        while len(self.buf) >= 4:
            n = int.from_bytes(self.buf[:4], "big")
            if not 0 < n <= RECORD:
                raise RecordError("a record of %d bytes (1 to %d)" % (n, RECORD))
            if len(self.buf) < 4 + n + TAG:
                break
            head, payload, tag = bytes(self.buf[:4]), bytes(self.buf[4:4 + n]), bytes(self.buf[4 + n:4 + n + TAG])
            if not hmac.compare_digest(tag, _tag(self.key, self.seq, head, payload)):
                raise RecordError("record %d does not carry this connection's tag" % self.seq)
            del self.buf[:4 + n + TAG]
            self.seq += 1
            out += payload
        return bytes(out)


def _log(who, msg):
    sys.stderr.write("%s: %s t=%.3f\n" % (who, msg, time.time()))
    sys.stderr.flush()


def _nodelay(s):
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _end(sock):
    """_end ends a connection for its peer and closes sock. The shutdown
    comes first: a process forked from this one (a DataLoader's workers)
    holds a copy of every fd, and a close alone would then send nothing, so
    a c10d client waiting on its tunnel would wait for ever."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def silence_seconds():
    """silence_seconds is how long a connection between a store client and
    the front may go unanswered before it is taken for lost
    ($ETJOB_STORE_SILENCE_SECONDS, 30)."""
    try:
        return max(float(os.environ.get(contract.ENV_STORE_SILENCE_SECONDS, "30")), 2.0)
    except ValueError:
        return 30.0


def bound_silence(sock, seconds=None):
    """bound_silence makes the kernel end sock with an error once its peer
    has said nothing for about seconds (silence_seconds): keep-alive probes
    while it is idle, TCP_USER_TIMEOUT while data waits for an
    acknowledgement. A store whose node vanished (no FIN, no reset: a
    half-open connection) is then found in that time, not after TCP's ~15
    minutes of retransmissions; c10d's own client sets neither, and torch
    1.13's waits on a reply with no timeout at all."""
    s = seconds or silence_seconds()
    opts = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", max(int(s / 3), 1)), ("TCP_KEEPINTVL", max(int(s / 6), 1)),
                        ("TCP_KEEPCNT", 4), ("TCP_USER_TIMEOUT", int(s * 1000))):
        if hasattr(socket, name):
            opts.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in opts:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:
            pass


class _End:
    """_End is one socket of a relayed pair: out holds what waits to be
    written to it; events, what the selector watches it for (0: not
    registered, as a side that ended and has nothing to write)."""

    __slots__ = ("sock", "peer", "out", "eof", "shut", "closed", "events", "cb", "opener", "sealer")

    def __init__(self, sock):
        self.sock, self.peer, self.out = sock, None, bytearray()
        self.eof = self.shut = self.closed = False
        self.events, self.cb = 0, None
        self.opener = self.sealer = None  # the records of a sealed side: what it reads, what it is written


class Loop:
    """Loop is one thread that relays pairs of connected sockets (and runs
    the front's handshakes) without blocking: one thread however many
    clients a store has."""

    def __init__(self, name):
        self.sel = selectors.DefaultSelector()
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self.sel.register(self._r, selectors.EVENT_READ, self._woken)
        self._calls = collections.deque()
        self._timers = []  # (deadline, fn): few, scanned
        self.pairs = 0
        self.forged = 0  # connections ended on a record that did not verify
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def call_soon(self, fn):
        """call_soon runs fn on the loop's thread (from any thread)."""
        self._calls.append(fn)
        try:
            self._w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending

    def _woken(self, sock, _mask):
        try:
            sock.recv(4096)
        except OSError:
            pass

    def _run(self):
        while True:
            timeout = None
            if self._timers:
                timeout = max(0.0, min(d for d, _ in self._timers) - time.monotonic())
            for key, mask in self.sel.select(timeout):
                try:
                    key.data(key.fileobj, mask)
                except Exception as e:  # noqa: BLE001 - one connection's fault never stops the loop
                    _log("etjob.storeauth", "relay: %r" % e)
            while self._calls:
                self._safely(self._calls.popleft())
            if self._timers:
                now = time.monotonic()
                due = [t for t in self._timers if t[0] <= now]
                if due:
                    self._timers = [t for t in self._timers if t[0] > now]
                    for _, fn in due:
                        self._safely(fn)

    @staticmethod
    def _safely(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the loop serves every other connection on
            _log("etjob.storeauth", "relay: %r" % e)

    def after(self, seconds, fn):
        """after runs fn on the loop's thread once seconds passed (call it
        on the loop's thread)."""
        self._timers.append((time.monotonic() + seconds, fn))

    def relay(self, a, b, records=None):
        """relay moves bytes between connected sockets a and b until both
        sides ended (call it on the loop's thread). records, (Opener,
        Sealer): a speaks in records, read with the opener and written with
        the sealer; b in plain bytes."""
        ea, eb = _End(a), _End(b)
        ea.peer, eb.peer = eb, ea
        if records is not None:
            ea.opener, ea.sealer = records
        for e in (ea, eb):
            e.sock.setblocking(False)
            _nodelay(e.sock)
            e.cb = self._on_event(e)
        self.pairs += 1
        self._interest(ea)
        self._interest(eb)

    def _on_event(self, e):
        def on_event(_sock, mask):
            self._service(e, mask)
        return on_event

    def _service(self, e, mask):
        if e.closed:
            return
        try:
            if mask & selectors.EVENT_READ and not e.eof:
                data = e.sock.recv(65536)
                if data:
                    if e.opener is not None:
                        data = e.opener.open(data)
                    if e.peer.sealer is not None and data:
                        data = e.peer.sealer.seal(data)
                    e.peer.out += data
                    self._flush(e.peer)
                else:
                    e.eof = True
            if mask & selectors.EVENT_WRITE:
                self._flush(e)
            for x in (e, e.peer):
                if x.eof and not x.peer.out and not x.peer.shut:
                    x.peer.shut = True
                    x.peer.sock.shutdown(socket.SHUT_WR)
        except (BlockingIOError, InterruptedError):
            pass
        except RecordError as err:
            self.forged += 1
            _log("etjob.storeauth", "a connection's record did not verify (%s): closed, nothing of it passed on; "
                 "something between this process and its peer changed or injected bytes (%d so far)" % (err, self.forged))
            self._close(e)
            return
        except OSError:
            self._close(e)
            return
        if e.eof and e.peer.eof and not e.out and not e.peer.out:
            self._close(e)
            return
        self._interest(e)
        self._interest(e.peer)

    def _flush(self, e):
        if e.out and not e.closed:
            n = e.sock.send(e.out)
            del e.out[:n]

    def _interest(self, e):
        if e.closed:
            return
        want = 0
        if not e.eof and len(e.peer.out) < _HIGH_WATER:
            want |= selectors.EVENT_READ
        if e.out:
            want |= selectors.EVENT_WRITE
        if want == e.events:
            return
        if e.events == 0:
            self.sel.register(e.sock, want, e.cb)
        elif want == 0:
            self.sel.unregister(e.sock)  # an ended side is always readable: never watched idle
        else:
            self.sel.modify(e.sock, want, e.cb)
        e.events = want

    def _close(self, e):
        for x in (e, e.peer):
            if not x.closed:
                x.closed = True
                if x.events:
                    self.sel.unregister(x.sock)
                    x.events = 0
                _end(x.sock)
        self.pairs -= 1


class Front:
    """Front listens on (host, port) for the job's store clients and relays
    each one that proves the secret to the store at upstream (loopback)."""

    def __init__(self, host, port, upstream, key, loop=None, who="etjob.rdzv"):
        self.key, self.upstream, self.who = key, upstream, who
        self.loop = loop or Loop("etjob-store-front")
        self.listener = socket.create_server((host, port), backlog=1024, reuse_port=False,
                                             family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self._pending = collections.OrderedDict()  # sock -> [its hello so far, (nonce_c, nonce_f) once answered, deadline]
        self.accepted = self.refused = 0
        self._said = 0.0
        self.loop.call_soon(lambda: self.loop.sel.register(self.listener, selectors.EVENT_READ, self._accept))
        self.loop.call_soon(self._tick)

    def close(self):
        """close stops listening and closes the clients still in their
        handshake (relayed ones end with their clients); it waits until the
        loop did."""
        done = threading.Event()

        def stop():
            try:
                self.loop.sel.unregister(self.listener)
            except (KeyError, ValueError):
                pass
            self.listener.close()
            while self._pending:
                s, _ = self._pending.popitem()
                self._drop(s, count=False)
            done.set()

        self.loop.call_soon(stop)
        done.wait(10)

    def _accept(self, listener, _mask):
        for _ in range(64):
            try:
                s, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: keep serving the others
                self._say("accepting: %s" % e)
                return
            s.setblocking(False)
            bound_silence(s)  # a client whose node vanished is let go too
            if len(self._pending) >= MAX_PENDING:
                old, _ = self._pending.popitem(last=False)
                self._drop(old, count=True)
            self._pending[s] = [bytearray(), None, time.monotonic() + HANDSHAKE_SECONDS]
            self.loop.sel.register(s, selectors.EVENT_READ, self._hello)

    def _hello(self, s, _mask):
        st = self._pending.get(s)
        if st is None:
            return
        want = len(MAGIC) + NONCE if st[1] is None else MAC
        try:
            data = s.recv(want - len(st[0]))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._pending.pop(s, None)
            self._drop(s, count=st[1] is not None)  # gone before its hello: a probe
            return
        st[0] += data
        if st[1] is None and not MAGIC.startswith(bytes(st[0][:len(MAGIC)])):
            self._pending.pop(s, None)
            self._drop(s, count=True)  # a client that does not speak etjob's handshake (a plain TCPStore's)
            return
        if len(st[0]) < want:
            return
        if st[1] is None:
            nonce_c = bytes(st[0][len(MAGIC):])
            nonce_f = os.urandom(NONCE)
            try:
                s.send(nonce_f + _mac(self.key, b"etjob-store server", nonce_c, nonce_f))  # 64 bytes: an empty buffer takes them
            except OSError:
                self._pending.pop(s, None)
                self._drop(s, count=False)
                return
            st[0], st[1] = bytearray(), (nonce_c, nonce_f)
            return
        self._pending.pop(s, None)
        nonce_c, nonce_f = st[1]
        if not hmac.compare_digest(bytes(st[0]), _mac(self.key, b"etjob-store client", nonce_f, nonce_c)):
            self._drop(s, count=True)
            return
        self.loop.sel.unregister(s)
        try:
            up = socket.create_connection(self.upstream, timeout=HANDSHAKE_SECONDS)
        except OSError as e:
            self._say("a client proved the secret, but the store at %s:%d did not answer: %s" % (self.upstream + (e,)))
            _end(s)
            return
        self.accepted += 1
        c2f, f2c = session_keys(self.key, nonce_c, nonce_f)
        self.loop.relay(s, up, (Opener(c2f), Sealer(f2c)))

    def _drop(self, s, count):
        try:
            self.loop.sel.unregister(s)
        except (KeyError, ValueError):
            pass
        if count:
            self.refused += 1
            try:
                peer = "%s:%s" % s.getpeername()[:2]
            except OSError:
                peer = "?"
            self._say("refused a client from %s without the job's secret (%d refused so far)" % (peer, self.refused))
        _end(s)

    def _say(self, msg):
        now = time.monotonic()
        if now - self._said >= 10.0:  # a flood costs one line in 10 s
            self._said = now
            _log(self.who, msg)

    def _tick(self):
        now = time.monotonic()
        while self._pending:
            s, st = next(iter(self._pending.items()))
            if st[2] > now:
                break
            self._pending.pop(s)
            self._drop(s, count=True)
        self.loop.after(0.5, self._tick)


class HandshakeError(RuntimeError):
    """The store did not accept this client, or did not prove the secret."""


class HandshakeClosed(HandshakeError):
    """The store closed the connection in the handshake: a store that does
    not authenticate, or a front starting or stopping (a launcher being
    replaced). The tunnel tries again for CLOSED_GRACE before it says so."""


# How long a tunnel keeps trying a store that closes its connections in the
# handshake before it takes the store for one that does not authenticate: a
# replaced launcher's front, stopping or starting, closed one once and the
# workers' logs said the store did not authenticate clients (it did).
CLOSED_GRACE = 2.0


def handshake(sock, key, where):
    """handshake proves the secret to the front on sock (connected,
    blocking, with a timeout) once the front proved it, and returns the
    connection's records, (Opener, Sealer). It raises HandshakeError saying
    which side failed."""
    nonce_c = os.urandom(NONCE)
    sock.sendall(MAGIC + nonce_c)
    try:
        reply = _recv_exact(sock, NONCE + MAC)
    except socket.timeout:
        raise HandshakeError("the store at %s did not answer etjob's handshake in %.0f s: it does not authenticate "
                             "clients (a launcher without $%s?)" % (where, sock.gettimeout(), ENV)) from None
    if reply is None:
        raise HandshakeClosed("the store at %s closed the connection in etjob's handshake: it does not authenticate "
                             "clients (a launcher without $%s, or another torch's store?)" % (where, ENV))
    nonce_f, proof = reply[:NONCE], reply[NONCE:]
    if not hmac.compare_digest(proof, _mac(key, b"etjob-store server", nonce_c, nonce_f)):
        raise HandshakeError("the store at %s does not hold this pod's secret ($%s): the launcher and the workers "
                             "must mount the same job's secret" % (where, ENV))
    sock.sendall(_mac(key, b"etjob-store client", nonce_f, nonce_c))
    c2f, f2c = session_keys(key, nonce_c, nonce_f)
    return Opener(f2c), Sealer(c2f)


def _closed(sock):
    """_closed reports whether the peer of sock closed it (or shut down its
    writing: a c10d client never half-closes)."""
    p = select.poll()
    p.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(p.poll(0))


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        try:
            got = sock.recv(n - len(buf))
        except ConnectionResetError:
            return None
        if not got:
            return None
        buf += got
    return bytes(buf)


def _proc_addr(ip, port, six):
    """_proc_addr is (ip, port), an IPv4 address, as /proc/net/tcp writes it,
    or with six as /proc/net/tcp6 writes it mapped (::ffff:a.b.c.d): each
    32-bit word in the host's order, in hex."""
    raw = socket.inet_aton(ip)
    if six:
        raw = b"\0" * 10 + b"\xff\xff" + raw
    words = [raw[i:i + 4] for i in range(0, len(raw), 4)]
    return "".join("%08X" % int.from_bytes(w, sys.byteorder) for w in words) + ":%04X" % port


def _tcp_inode(local, remote):
    """_tcp_inode is the inode of the TCP socket of this network namespace
    whose local and remote addresses are local and remote (each (ip, port),
    IPv4), from /proc/net/tcp, or /proc/net/tcp6 for an IPv6 socket that
    reached an IPv4 address (torch's c10d client opens those); 0 when there
    is none; None when neither table can be read."""
    read = False
    for path, six in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        want_l, want_r = _proc_addr(local[0], local[1], six), _proc_addr(remote[0], remote[1], six)
        try:
            with open(path) as f:
                read = True
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[1] == want_l and fields[2] == want_r:
                        return int(fields[9])
        except (OSError, ValueError):
            continue
    return 0 if read else None


def _descendants(root):
    """_descendants is root and every process below it that /proc shows."""
    children = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                st = f.read()
            ppid = int(st[st.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children[ppid].append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


#: Local addresses ((ip, port), IPv4 as a tunnel sees them) of this
#: process's connections that it disowned on purpose while a thread of its
#: own still waits on them (etjob.storeclient takes torch 1.13's watched-key
#: connections away): no fd holds them, and they are still this process's.
disowned = set()


def loopback_name(addr):
    """loopback_name is a socket's address as a tunnel's peer name reads
    it: an IPv4-mapped IPv6 address (::ffff:a.b.c.d) as a.b.c.d."""
    ip, port = addr[0], addr[1]
    if ip.startswith("::ffff:"):
        ip = ip[len("::ffff:"):]
    return ip, port


def peer_is_ours(sock):
    """peer_is_ours reports whether the other end of sock, a connection
    accepted on loopback, is a socket of this process or of one it started
    (torchrun's workers use their agent's store): with hostNetwork a node's
    loopback is every host-network process's, and a tunnel passes its
    clients' bytes on authenticated (issue #42, M4). None when /proc cannot
    tell (no /proc/net/tcp nor tcp6, or neither lists the peer's socket: one
    its owner closed, or a sandboxed runtime's /proc): the caller takes the
    connection."""
    try:
        peer, local = sock.getpeername()[:2], sock.getsockname()[:2]
    except OSError:
        return False
    if peer in disowned:
        return True
    inode = _tcp_inode(peer, local)
    if not inode:
        # unreadable tables; a socket its owner closed already (listed
        # without an inode, or gone); or a /proc that does not list it (a
        # sandboxed runtime): any process that reached this loopback is in
        # this network namespace, whose tables list a live socket
        return None
    target = "socket:[%d]" % inode

    def holds(pid):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) == target:
                    return True
            except OSError:
                continue
        return False

    # this process first (etjob.elastic's and the agents' own clients): one
    # directory; the process tree only for a child's (torchrun's workers)
    me = os.getpid()
    if holds("self") or any(holds(pid) for pid in _descendants(me) if pid != me):
        return True
    # No fd of ours holds it: another process's, or one of ours that its
    # owner is closing right now (the inode outlives the fd for a moment: a
    # test's clients closing while the tunnel got to them late)
    time.sleep(0.1)
    if peer in disowned:  # taken away since the first look (added before its fd goes)
        return True
    return None if _tcp_inode(peer, local) != inode else False


class Tunnel:
    """Tunnel listens on 127.0.0.1 for this process's c10d store clients
    (and its children's) and joins each to the front at (host, port),
    resolved again for every connection (a replacement launcher has another
    address), after the handshake. A connection from any other process is
    closed at once (peer_is_ours: a host-network node's loopback is shared).
    A front not up yet is tried again until the client gives up (or wait
    seconds); a refused handshake closes the client's connection at once:
    the c10d client sees its server gone, as without a tunnel; last_error
    says why."""

    def __init__(self, host, port, key, timeout=10.0, loop=None, wait=600.0):
        self.host, self.port, self.key, self.timeout, self.wait = host, port, key, timeout, wait
        self.loop = loop or Loop("etjob-store-tunnel")
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.listener.setblocking(False)
        self.local_port = self.listener.getsockname()[1]
        self.last_error = ""
        self._said = ""
        self.refused = 0  # connections from other processes, closed at once
        self.loop.call_soon(lambda: self.loop.sel.register(self.listener, selectors.EVENT_READ, self._accept))

    def _accept(self, listener, _mask):
        while True:
            try:
                s, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            threading.Thread(target=self._join, args=(s,), name="etjob-store-connect", daemon=True).start()

    def connect(self):
        """connect returns a socket to the front that passed the
        handshake (blocking) and its records (handshake), or raises OSError
        or HandshakeError."""
        where = "%s:%d" % (self.host, self.port)
        up = socket.create_connection((self.host, self.port), timeout=self.timeout)
        bound_silence(up)
        try:
            up.settimeout(min(self.timeout, HANDSHAKE_SECONDS))
            records = handshake(up, self.key, where)
            up.settimeout(None)
            return up, records
        except BaseException:
            up.close()
            raise

    def _join(self, local):
        # A store not up yet (a launcher still starting) is waited for, as
        # c10d's own client waits for its server: the tunnel accepted the
        # client's connection at once, so a refusal here would reach the
        # client as a broken pipe on its first call (found by
        # TestGrowthStory: a torchrun agent that came before its launcher
        # failed). The client's own timeout bounds the wait: once it gives up
        # and closes, so does this.
        ours = peer_is_ours(local)
        if ours is False:
            self.refused += 1
            if self.refused == 1:
                _log("etjob.storeauth", "the tunnel refused a connection from a process outside this one and its "
                     "children (another process of a host-network node?); it refuses every such one")
            _end(local)
            return
        began, delay, closing = time.monotonic(), 0.05, None
        while True:
            try:
                up, records = self.connect()
                break
            except HandshakeClosed as e:
                # a front starting or stopping closes one and serves the
                # next; a store that does not authenticate closes them all
                closing = closing if closing is not None else time.monotonic()
                if time.monotonic() - closing < CLOSED_GRACE and not _closed(local):
                    self.last_error = str(e)
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                self._give_up(local, str(e))
                return
            except HandshakeError as e:
                self._give_up(local, str(e))
                return
            except OSError as e:
                self.last_error = "the store at %s:%d is unreachable: %s" % (self.host, self.port, e)
                if _closed(local) or time.monotonic() - began > self.wait:
                    _end(local)
                    return
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        self.last_error = ""
        self.loop.call_soon(lambda: self.loop.relay(up, local, records))

    def _give_up(self, local, why):
        """_give_up ends a client's connection that no store accepted, and
        says why (once for a repeated reason)."""
        self.last_error = why
        if self._said != why:
            self._said = why
            _log("etjob.storeauth", why)
        _end(local)


_tunnels = {}
_tunnels_lock = threading.Lock()


def route(host, port):
    """route returns where this process's c10d clients of the store at
    host:port connect: a tunnel of this process when the job has a store
    secret ($ETJOB_STORE_SECRET_FILE), else host:port itself."""
    key = load_secret()
    if key is None:
        return host, port
    with _tunnels_lock:
        t = _tunnels.get((host, port))
        if t is None:
            t = _tunnels[(host, port)] = Tunnel(host, port, key)
        return "127.0.0.1", t.local_port


def tunnel(host, port):
    """tunnel returns this process's tunnel to host:port, or None."""
    with _tunnels_lock:
        return _tunnels.get((host, port))


def _socket_of(fd):
    """_socket_of is a socket object on a duplicate of fd (the caller
    closes it), or None when fd is not a TCP socket."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        return socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None


def _sockets():
    """_sockets lists (fd, local name, peer name or None when listening) of
    this process's TCP sockets."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        s = _socket_of(fd)
        if s is None:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                listening = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                out.append((fd, s.getsockname()[:2], None if listening else s.getpeername()[:2]))
        except OSError:
            pass
        finally:
            s.close()
    return out


def _listening_fd(port):
    """_listening_fd is the fd of this process's listening socket on port."""
    return next((fd for fd, local, peer in _sockets() if peer is None and local[1] == port), None)


def _accepted(port, foreign_only=False):
    """_accepted counts the connections this process accepted on port;
    foreign_only: only those whose client is not a socket of this process
    (torch 1.13's server store is a client of itself, twice)."""
    socks = _sockets()
    mine = {local for _, local, _ in socks}
    return sum(1 for _, local, peer in socks
               if peer is not None and local[1] == port and not (foreign_only and peer in mine))


def loopback_store(timeout):
    """loopback_store starts a c10d TCPStore server that listens on
    127.0.0.1 only, on a port of the kernel's choice, and returns it with
    that port. torch 2.x takes a listening socket of ours
    (master_listen_fd). torch 1.13's server always binds every address, so
    its listening socket is swapped, under its running accept loop, for one
    bound to loopback (dup2 onto the same fd, then one connection to wake
    the loop); a connection that reached the old socket meanwhile (the port
    was the kernel's pick and lived for milliseconds) makes it refuse to
    serve."""
    from torch.distributed import TCPStore

    ls = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = ls.getsockname()[1]
    try:
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timeout,
                         master_listen_fd=ls.fileno())
        ls.detach()
        return store, port
    except TypeError:
        pass  # torch 1.13: no master_listen_fd
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    wide = store.port
    fd = _listening_fd(wide)
    if fd is None:
        raise RuntimeError("etjob.storeauth: the store's listening socket on port %d was not found" % wide)
    # The store is a client of itself (twice): its connections must be
    # accepted before the old socket goes, or they are reset and its client
    # thread aborts the process.
    end = time.monotonic() + 10
    while True:
        socks = _sockets()
        clients = sum(1 for _, _, peer in socks if peer is not None and peer[1] == wide)
        if _accepted(wide) >= clients:
            break
        if time.monotonic() > end:
            raise RuntimeError("etjob.storeauth: the store did not accept its own connections in 10 s")
        time.sleep(0.01)
    waker = socket.create_connection(("127.0.0.1", port))  # queued on ls: the loop accepts it first
    os.dup2(ls.fileno(), fd)
    ls.close()
    try:
        kick = socket.create_connection(("127.0.0.1", wide))  # wakes the loop out of its poll on the old socket
    except (ConnectionRefusedError, ConnectionResetError):
        # the loop was not in its poll: the old socket closed with the dup2
        # (refused), or while this connection was being accepted on it
        # (reset: a CI run on a loaded machine), and the next poll is on ours
        kick = None
    end = time.monotonic() + 10
    while _listening_fd(wide) is not None or _accepted(port) == 0:
        if time.monotonic() > end:
            raise RuntimeError("etjob.storeauth: the store's accept loop did not take the loopback socket")
        time.sleep(0.01)
    waker.close()
    if kick is not None:
        kick.close()
    if _accepted(wide, foreign_only=True):
        raise RuntimeError("etjob.storeauth: a connection reached the store on port %d before it was confined to "
                           "loopback; refusing to serve" % wide)
    return store, port
