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

import socket
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist


class StoreLost(RuntimeError):
    """The rendezvous store stayed unreachable for the client's limit."""


def _log(msg):
    sys.stderr.write("etjob.elastic: %s t=%.3f\n" % (msg, time.time()))
    sys.stderr.flush()


def _first_line(err):
    return (str(err).splitlines() or ["?"])[0]


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
        self._old = []  # clients of servers gone: kept, never destroyed (torch 1.13's may block in it)
        self.reconnects = 0

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
            c = self._c
            try:
                return getattr(c, name)(*args)
            except RuntimeError as e:  # DistNetworkError, DistStoreError (torch 2.x), RuntimeError (1.13)
                err = e
            if self._reconnect(c, err):
                failed_live += 1
                if failed_live >= 2:
                    raise err
            else:
                failed_live = 0

    def _reconnect(self, broken, err):
        """_reconnect replaces the broken client (unless another thread did)
        with one to the server now at host:port, waiting for it up to limit.
        It reports whether the server answered at the first try."""
        with self._lock:
            if self._c is not broken:
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
            self._old.append(broken)
            self._c = c
            self.reconnects += 1
            if said:
                _log("reconnected to the rendezvous store at %s:%s after %.1f s" % (self.host, self.port, time.monotonic() - began))
        if self.on_connect is not None:
            self.on_connect(self)
        return not said
