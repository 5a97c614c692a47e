"""A rendezvous store client that outlives its server (needs PyTorch).

etjob.elastic keeps every generation's agreement in the job's rendezvous store
(the launcher's `etjob.rdzv`). The store is not on the training's path: a
generation's gloo group talks to its peers directly once it is set up, and a
commit's agreement is an all-reduce. So when the launcher is lost (its node
reclaimed, its pod deleted) the ranks train on in their generation, and only
what needs the store (a heartbeat, a join, a leave, the next generation)
waits for a new one.

StoreClient wraps one c10d TCPStore client. A call that fails (the server
gone: a broken pipe, a reset, a timeout) makes it connect again to the same
host and port, resolving the name again (the replacement launcher has
another address), every `retry` seconds for up to `limit` seconds
($ETJOB_STORE_LOSS_SECONDS, 600), then repeat the call; after that it raises
StoreLost. Each new connection calls `on_connect(client)` first, on the
calling thread, so that the caller re-seeds a store that may be new and empty
(etjob.elastic.Context._reseed) before its call goes on.

A call repeated on a new connection may have reached the old server: the
callers' keys are counters whose readers tolerate an extra count on the
same server (a reconnect while the server lives is rare: a timeout), and a
new server has none of the old counts.
"""

import os
import platform
import socket
import stat
import struct
import sys
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from etjob import storeauth


class StoreLost(RuntimeError):
    """The rendezvous store stayed unreachable for the client's limit."""


def _log(msg):
    sys.stderr.write("etjob.elastic: %s t=%.3f\n" % (msg, time.time()))
    sys.stderr.flush()


def _first_line(err):
    return (str(err).splitlines() or ["?"])[0]


# torch 1.13's store client has a second connection (for watched keys, which
# etjob never uses) served by a thread that polls it. Once the server is gone
# that thread spins on the end of file for ever (a peek that returns 0, then
# the poll again; measured on the local cluster: ~6 busy threads a rank, steps
# 17 times longer), and on a reset instead it throws and the process aborts
# (std::terminate, "Connection reset by peer", exit 134: a rank lost in a CI
# run when the launcher was deleted). So on torch 1.13 that connection is
# taken away as soon as a client is made: its fd gets one end of a socket pair
# that never becomes readable, where the thread then waits for ever, and the
# client is never destroyed (its destructor would wait for that thread).
# The thread is found by what it waits in: poll(2) on two fds, a pipe and a
# socket to the store's port (/proc/self/task/*/syscall and the pollfd array
# in /proc/self/mem; x86-64's syscall numbers). torch 2.x's client has no
# such connection.
_OWN_THREAD_POLLS = not hasattr(dist.TCPStore, "check")
_quieted = []            # the socket pairs put in place of those connections (kept open)
_kept = []               # torch 1.13 clients replaced by a reconnect: never destroyed
_clients = weakref.WeakSet()
_POLL = 7                # poll(2) on x86-64


def _callback_sockets(port):
    """The fds of the sockets to port that a thread of this process waits on
    in poll(2) beside a pipe (torch 1.13's store-client threads), each with
    its local address."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/syscall" % tid) as f:
                parts = f.read().split()
            if len(parts) < 3 or parts[0] != str(_POLL) or int(parts[2], 16) != 2:
                continue
            with open("/proc/self/mem", "rb") as mem:
                mem.seek(int(parts[1], 16))
                pipe_fd, _, _, sock_fd, _, _ = struct.unpack("<ihhihh", mem.read(16))
            if not stat.S_ISFIFO(os.fstat(pipe_fd).st_mode) or not stat.S_ISSOCK(os.fstat(sock_fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(sock_fd))
        except (OSError, ValueError, OverflowError, struct.error):
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.getpeername()[1] == port:
                out.append((sock_fd, s.getsockname()[:2]))
        except OSError:
            pass
        finally:
            s.close()
    return out


def quiet_callback_connections(port, wait=0.0):
    """quiet_callback_connections takes away, on torch 1.13, the watched-key
    connections of this process's store clients of port (above), waiting up
    to `wait` seconds for one to show (a client just made starts its thread).
    It returns how many it took."""
    if not _OWN_THREAD_POLLS or platform.machine() != "x86_64" or socket.getdefaulttimeout() is not None:
        return 0  # (a default timeout would make the probing socket objects set O_NONBLOCK on the shared fds)
    end = time.monotonic() + wait
    n = 0
    while True:
        for fd, local in _callback_sockets(port):
            pair = socket.socketpair()
            _quieted.append(pair)
            # the tunnel's check of who connected finds it in no fd of this
            # process once it is taken away: it is still this process's
            storeauth.disowned.add(storeauth.loopback_name(local))
            os.dup2(pair[0].fileno(), fd)
            n += 1
        if n or time.monotonic() >= end:
            return n
        time.sleep(0.01)


_make_lock = threading.Lock()


# torch < 2.4's Store.compare_set builds its answer, a Python bytes object,
# with the GIL released (pytorch/pytorch#123983, fixed in torch 2.4 by
# pytorch/pytorch#128212). While another thread of the process runs Python
# (in an etjob process one always may: the store tunnel's loop, the
# supervisor's poll, a heartbeat) CPython's small-object allocator is then
# used by two threads at once and corrupted: torch 1.13 processes died with
# SIGSEGV in another thread's pure Python code. A Python thread that
# allocates beside a loop of compare_set calls crashes a torch 1.13 process
# within a second (test_storeclient.CompareSetWithoutGILTest). So on torch 1.x
# etjob asks compare_set over a socket of its own, in the store's wire
# format, and builds the answer in Python with the GIL held; the store holds
# the same bytes either way, so clients of either kind share keys. The wire
# format is torch 1.x's (a query byte, then each string as a native 64-bit
# length and its bytes; keys carry the client's "/" prefix). torch 2.0-2.3
# have the defect too and are not covered: etjob is tested on torch 1.13 and
# on torch >= 2.4.
_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
WIRE_COMPARE_SET = _TORCH[0] == 1
# A wait that times out leaves torch 2.x's client in step with its server
# (it says so with DistStoreError; measured: the next add answers right),
# torch 1.13's out of step: StoreClient.wait serves torch 2.x only.
WAIT_SAFE = _TORCH[0] >= 2 and hasattr(dist, "DistStoreError")
_said_exposed = []


def _say_if_exposed():
    """A torch with the defect and another wire format is named once."""
    if (2, 0) <= _TORCH < (2, 4) and not _said_exposed:
        _said_exposed.append(1)
        _log("torch %s builds a store's compare_set answer without the GIL (pytorch/pytorch#123983, fixed in torch "
             "2.4): a process may crash while another of its threads runs Python; etjob works around it on torch "
             "1.x only: use torch 1.13 or >= 2.4" % torch.__version__)
_QUERY_COMPARE_SET = 1  # TCPStore's QueryType::COMPARE_SET
_SIZE = struct.Struct("=Q")


def _wire_string(v):
    b = v if isinstance(v, bytes) else str(v).encode()
    return _SIZE.pack(len(b)) + b


class WireCompareSet:
    """WireCompareSet asks a TCPStore's compare_set over a connection of its
    own (the comment above): where() gives the address to connect to (a
    tunnel's, already routed), timeout is in seconds. One call at a time;
    a failed call closes the connection (the next connects again) and
    raises RuntimeError, as c10d's client does."""

    def __init__(self, where, timeout):
        self._where = where
        self.timeout = timeout
        self._sock = None
        self._lock = threading.Lock()

    def __call__(self, key, expected, desired):
        query = bytes([_QUERY_COMPARE_SET]) + _wire_string("/" + key) + _wire_string(expected) + _wire_string(desired)
        with self._lock:
            host, port = self._where()
            # A connection made before may be to a store that is gone (a
            # replacement listens on the same port now): one more try on a
            # new connection. compare_set may be asked twice: the second
            # answer is the same (the value it set, or the one that was there).
            for again in (self._sock is not None, False):
                try:
                    if self._sock is None:
                        s = socket.create_connection((host, port), timeout=self.timeout)
                        storeauth._nodelay(s)
                        self._sock = s
                    self._sock.sendall(query)
                    head = storeauth._recv_exact(self._sock, _SIZE.size)
                    answer = head and storeauth._recv_exact(self._sock, _SIZE.unpack(head)[0])
                    if answer is None:
                        raise OSError("the store closed the connection")
                    return answer
                except OSError as e:
                    self.close_locked()
                    if not again:
                        raise RuntimeError("compare_set %r at %s:%s: %s" % (key, host, port, e)) from None

    def close(self):
        """close ends the connection: the next call makes a new one."""
        with self._lock:
            self.close_locked()

    def close_locked(self):
        if self._sock is not None:
            storeauth._end(self._sock)
            self._sock = None


class GILSafeStore:
    """GILSafeStore is a c10d TCPStore client whose compare_set goes over
    WireCompareSet on torch 1.x (above); every other call is the client's.
    It stands in for the client where Python code holds it (torch's
    rendezvous backend), not where torch's C++ needs a Store."""

    def __init__(self, client):
        self._c = client
        self.compare_set = WireCompareSet(lambda: (client.host, client.port), client.timeout.total_seconds())

    def __getattr__(self, name):
        return getattr(self._c, name)


def gil_safe(client):
    """gil_safe is client, as a GILSafeStore where its compare_set needs
    one (a TCPStore client on torch 1.x)."""
    if WIRE_COMPARE_SET and isinstance(client, dist.TCPStore):
        return GILSafeStore(client)
    _say_if_exposed()
    return client


def new_client(host, port, timeout):
    """new_client makes a c10d store client of the store at host:port
    (timeout: a timedelta), through this process's authenticating tunnel
    when the job has a store secret (etjob.storeauth.route), and, on torch
    1.13, takes its watched-key connection away (above) before it can do
    harm. Its thread may start late on a loaded machine (a rank aborted on
    the store's reset in a CI run when the wait was 1 s): sweep takes later
    ones away too."""
    at_host, at_port = storeauth.route(host, port)
    with _make_lock:
        try:
            c = dist.TCPStore(at_host, at_port, is_master=False, timeout=timeout)
        except RuntimeError as e:
            t = storeauth.tunnel(host, port)
            if t is not None and t.last_error:
                raise RuntimeError("%s (%s)" % (t.last_error, _first_line(e))) from None
            raise
        if _OWN_THREAD_POLLS:
            _kept.append(c)
            quiet_callback_connections(at_port, wait=5.0)
    return c


def sweep(host, port):
    """sweep takes away, on torch 1.13, any watched-key connection to the
    store at host:port that a client's thread began to poll since
    new_client looked (the heartbeat watcher calls it every few seconds)."""
    if not _OWN_THREAD_POLLS:
        return 0
    _, at_port = storeauth.route(host, port)
    with _make_lock:
        return quiet_callback_connections(at_port)


def _after_loss(origin):
    """_after_loss runs once a client found its server gone and connected
    again: every other client of this process connects again too (a cheap
    call fails on a dead connection, which makes it connect again)."""
    for c in list(_clients):
        if c is not origin:
            try:
                c.add("etjob/store/replacement", 0)
            except Exception:  # noqa: BLE001 - that client's owner hears it on its own next call
                pass


class StoreClient:
    """StoreClient is a c10d store client (add, set, get, compare_set)
    that connects again when its server goes (module docstring)."""

    # How often a lost store is tried again. Short: the ranks' clients find
    # a replaced store within this of each other, well inside a
    # rendezvous' settle (0.5 s); at 1 s a member came a second after the
    # others and a generation closed without it (a CI run). An attempt is a
    # plain connect, refused at once while the port is closed.
    RETRY = 0.2

    def __init__(self, client, host, port, limit=600.0, timeout=30.0, retry=RETRY, on_connect=None):
        self._c = client
        self.host, self.port = host, port
        self.limit, self.timeout, self.retry = limit, timeout, retry
        self.on_connect = on_connect
        self._lock = threading.Lock()
        self.reconnects = 0
        # compare_set over a connection of its own on torch 1.x (WireCompareSet)
        self._wire = WireCompareSet(lambda: storeauth.route(self.host, self.port), timeout) if WIRE_COMPARE_SET else None
        _say_if_exposed()
        _clients.add(self)

    def _tcp(self):
        # c10d's client holds the GIL while it connects and retries (torch
        # 1.13, measured: training stopped for as long as the store was
        # away): a plain socket, which lets go of it, finds the server first.
        try:
            socket.create_connection((self.host, self.port), timeout=max(self.retry, 0.1)).close()
        except OSError as e:
            raise RuntimeError("connect: %s" % e) from None
        return new_client(self.host, self.port, timedelta(seconds=self.timeout))

    def add(self, key, delta):
        return self._call(lambda c: c.add(key, delta))

    def set(self, key, value):
        return self._call(lambda c: c.set(key, value))

    def get(self, key):
        return self._call(lambda c: c.get(key))

    def wait(self, keys, timeout):
        """wait returns True once every key of keys is set, False when
        timeout (a timedelta) passed first (torch 2.x only: WAIT_SAFE)."""
        if not WAIT_SAFE:
            raise RuntimeError("etjob.storeclient: a store wait that times out puts torch %s's client out of step"
                               % torch.__version__)
        timed_out = []

        def op(c):
            try:
                c.wait(keys, timeout)
            except dist.DistNetworkError:
                raise
            except dist.DistStoreError:
                timed_out.append(True)

        self._call(op)
        return not timed_out

    def compare_set(self, key, expected, desired):
        if self._wire is not None:
            return self._call(lambda _: self._wire(key, expected, desired))
        return self._call(lambda c: c.compare_set(key, expected, desired))

    def _call(self, op):
        # A call that fails again right after a reconnect that found the
        # server at once is refused by a live server: raised, not retried.
        failed_live = 0
        while True:
            seen = self.reconnects
            try:
                return op(self._c)
            except RuntimeError as e:  # DistNetworkError, DistStoreError (torch 2.x), RuntimeError (1.13)
                err = e
            if self._reconnect(seen, err):
                failed_live += 1
                if failed_live >= 2:
                    raise err
            else:
                failed_live = 0

    def _reconnect(self, seen, err):
        """_reconnect replaces the client that failed (unless another thread
        did since the failed call began: seen, the reconnects then) with one
        to the server now at host:port, waiting for it up to limit. It
        reports whether the server answered at the first try. No reference
        to the failed client is held here: replaced, it is destroyed at
        once on torch 2.x (new_client keeps torch 1.13's)."""
        with self._lock:
            if self.reconnects != seen:
                return True
            began = time.monotonic()
            said = False
            while True:
                try:
                    c = self._tcp()
                    break
                except RuntimeError as e:
                    waited = time.monotonic() - began
                    if waited >= self.limit:
                        raise StoreLost("the rendezvous store at %s:%s is gone: no answer for %.0f s "
                                        "($ETJOB_STORE_LOSS_SECONDS) after %s" % (self.host, self.port, waited, _first_line(err))) from None
                    if not said:
                        _log("the rendezvous store at %s:%s is unreachable (%s; then %s): training goes on in this "
                             "generation; waiting up to %.0f s for the store to come back" % (
                                 self.host, self.port, _first_line(err), _first_line(e), self.limit))
                        said = True
                    time.sleep(self.retry)
            self._c = c  # the broken client is let go (torch 1.13's are kept: new_client)
            if self._wire is not None:
                self._wire.close()  # to the store now there at the next compare_set
            self.reconnects += 1
            if said:
                _log("reconnected to the rendezvous store at %s:%s after %.1f s" % (self.host, self.port, time.monotonic() - began))
        if self.on_connect is not None:
            self.on_connect(self)
        _after_loss(self)
        return not said
