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
import socket
import stat
import sys
import threading
import time
import weakref
from datetime import timedelta

import torch.distributed as dist


class StoreLost(RuntimeError):
    """The rendezvous store stayed unreachable for the client's limit."""


def _log(msg):
    sys.stderr.write("etjob.elastic: %s t=%.3f\n" % (msg, time.time()))
    sys.stderr.flush()


def _first_line(err):
    return (str(err).splitlines() or ["?"])[0]


# torch 1.13's store client has a second connection (for watched keys) served
# by a thread that polls it and, once the server is gone, spins on its end of
# file for ever (a peek that returns 0, then the poll again). Measured on the
# local cluster: after the launcher was replaced, every rank's old clients
# kept ~6 threads busy and steps took 17 times longer. A client that can be
# let go stops its thread when destroyed; those that cannot (a gloo group
# holds its setup's client for its life on 1.13) get quieted: each of their
# dead connections is replaced by one end of a socket pair that never
# becomes readable, where the thread then sleeps. torch 2.x's client has no
# such connection.
_SPINS_ON_EOF = not hasattr(dist.TCPStore, "check")
_quieted = []            # the socket pairs put in place of dead connections (kept open)
_clients = weakref.WeakSet()


def quiet_dead_connections(port):
    """quiet_dead_connections replaces this process's dead connections to a
    store server on port (the peer closed them) with sockets that never
    become readable, on torch 1.13 (above). It returns how many."""
    if not _SPINS_ON_EOF:
        return 0
    n = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except (OSError, ValueError):
            continue
        try:
            dead = (s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM and
                    s.getpeername()[1] == port and s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"")
        except OSError:  # not connected, or alive with nothing to read (BlockingIOError)
            dead = False
        finally:
            s.close()
        if dead:
            pair = socket.socketpair()
            _quieted.append(pair)
            os.dup2(pair[0].fileno(), fd)
            n += 1
    return n


def _after_loss(origin):
    """_after_loss runs once a client found its server gone and connected
    again: every other client of this process connects again too (a cheap
    call fails on a dead connection, which makes it connect again, and its
    old client is let go), then the dead connections left (clients that
    cannot be let go) are quieted."""
    for c in list(_clients):
        if c is not origin:
            try:
                c.add("etjob/store/replacement", 0)
            except Exception:  # noqa: BLE001 - that client's owner hears it on its own next call
                pass
    n = quiet_dead_connections(origin.port)
    if n:
        _log("quieted %d dead connections to the old store (torch 1.13's client threads spin on them)" % n)


class StoreClient:
    """StoreClient is a c10d store client (add, set, get, compare_set)
    that connects again when its server goes (module docstring)."""

    def __init__(self, client, host, port, limit=600.0, timeout=30.0, retry=1.0, on_connect=None, connect=None):
        self._c = client
        self.host, self.port = host, port
        self.limit, self.timeout, self.retry = limit, timeout, retry
        self.on_connect = on_connect
        self._connect = connect or self._tcp
        self._lock = threading.Lock()
        self.reconnects = 0
        _clients.add(self)

    def _tcp(self):
        # c10d's client holds the GIL while it connects and retries (torch
        # 1.13, measured: training stopped for as long as the store was
        # away): a plain socket, which lets go of it, finds the server first.
        try:
            socket.create_connection((self.host, self.port), timeout=max(self.retry, 0.1)).close()
        except OSError as e:
            raise RuntimeError("connect: %s" % e) from None
        return dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=self.timeout))

    @property
    def raw(self):
        """The c10d client in use now (a process group's setup takes one)."""
        return self._c

    def add(self, key, delta):
        return self._call("add", key, delta)

    def set(self, key, value):
        return self._call("set", key, value)

    def get(self, key):
        return self._call("get", key)

    def compare_set(self, key, expected, desired):
        return self._call("compare_set", key, expected, desired)

    def _call(self, name, *args):
        # A call that fails again right after a reconnect that found the
        # server at once is refused by a live server: raised, not retried.
        failed_live = 0
        while True:
            seen = self.reconnects
            try:
                return getattr(self._c, name)(*args)
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
        once (on torch 1.13 that stops its thread, before any quieting)."""
        with self._lock:
            if self.reconnects != seen:
                return True
            began = time.monotonic()
            said = False
            while True:
                try:
                    c = self._connect()
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
            self._c = c  # the broken client is let go: on torch 1.13 that stops its thread
            self.reconnects += 1
            if said:
                _log("reconnected to the rendezvous store at %s:%s after %.1f s" % (self.host, self.port, time.monotonic() - began))
        if self.on_connect is not None:
            self.on_connect(self)
        _after_loss(self)
        return not said
