"""Starts the etjob.elastic tests' workers (elastic_worker.py) by fork from a
process that imported torch once, as etjob.torchrun's forkserver starts a
job's workers: on this project's 2-core machines torch's import costs a
worker 1.0 CPU-s on torch 1.13 and 1.7 on torch 2.15, and the tests start
over a hundred workers a lane.

A forked worker is a real process of the interpreter under test: it imports
etjob itself (so what etjob reads from the environment when it is imported
is read from the worker's own), runs the script as __main__ and exits
through the interpreter's normal exit (atexit included). Its parent is this
zygote, which reaps it and reports its exit. What it shares with its
siblings: torch's import-time reading of the environment (the zygote's, the
test process's: no test sets torch's variables per job) and Python's hash
seed (set iteration orders are equal across ranks, as they are not across
the machines of a real job). Fork is the tests' default;
ETJOB_TEST_WORKER_START=exec starts every worker with its own interpreter
(subprocess.Popen) instead.

The zygote reads one JSON request a line on stdin ({"script", "env", "out",
"err"}) and answers on stdout: {"pid": P} for each fork, {"exit": P, "code":
C} when a worker ends (C as subprocess's returncode: -N for signal N). It
ends when its stdin closes."""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

PRELOAD = ("torch", "torch.nn", "torch.distributed")


def _serve():
    """The zygote's loop; in a forked worker it returns the worker's request."""
    for name in PRELOAD:
        __import__(name)
    out = sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=out, flush=True)
    buf = b""
    live = set()
    while True:
        r, _, _ = select.select([0], [], [], 0.05)
        while live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            live.discard(pid)
            print(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}), file=out, flush=True)
        if not r:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return None
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return req
            live.add(pid)
            print(json.dumps({"pid": pid}), file=out, flush=True)


def _become(req):
    """In the forked worker: its environment, its output files, a stdin of
    its own, default signal handlers; then the script as __main__."""
    import runpy

    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    sys.argv = [req["script"]]
    sys.path[0] = os.path.dirname(os.path.abspath(req["script"]))
    runpy.run_path(req["script"], run_name="__main__")


class Worker:
    """What a test holds of a forked worker: subprocess.Popen's pid, poll,
    wait, kill and send_signal."""

    def __init__(self, zygote, pid):
        self._zygote, self.pid, self.args = zygote, pid, "worker %d" % pid
        # Signals go through a pidfd: the zygote may reap the worker before
        # this process hears of it, and a pid alone could by then name
        # another process (Popen's child is never reaped behind its back).
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # already gone (and reaped)
            self._pidfd = None

    @property
    def returncode(self):
        code = self._zygote.codes.get(self.pid)
        if code is None and self._zygote.gone:
            # the zygote died: no exit will be reported; a worker that no
            # longer exists is taken as killed
            try:
                with open("/proc/%d/stat" % self.pid) as f:
                    alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                alive = False
            if not alive:
                code = self._zygote.codes.setdefault(self.pid, -signal.SIGKILL)
        if code is not None and self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return code

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        with self._zygote.ended:
            while self.returncode is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                # at most 1 s: once the zygote is gone nothing notifies
                self._zygote.ended.wait(min(left, 1.0) if left is not None else 1.0)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:  # it ended; its exit is on the way
                pass

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The test process's side: one zygote a test process, started at its
    first worker (see the module's doc)."""

    def __init__(self, env):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready = json.loads(self.proc.stdout.readline() or b"{}")
        if "ready" not in ready:
            raise RuntimeError("the workers' zygote did not start (exit %s)" % self.proc.wait())
        self.codes = {}
        self.gone = False
        self.ended = threading.Condition()
        self._pids = []
        self._one = threading.Lock()  # one request and its answer at a time
        self._started = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def _read(self):
        try:
            for line in self.proc.stdout:
                msg = json.loads(line)
                if "pid" in msg:
                    with self._started:
                        self._pids.append(msg["pid"])
                        self._started.notify_all()
                elif "exit" in msg:
                    with self.ended:
                        self.codes[msg["exit"]] = msg["code"]
                        self.ended.notify_all()
        finally:
            with self.ended:
                self.gone = True
                self.ended.notify_all()

    def close(self):
        """close ends the zygote (its workers run on)."""
        self.proc.stdin.close()
        self.proc.wait()
        self._reader.join(10)
        self.proc.stdout.close()

    def start(self, script, env, out, err):
        """start forks a worker running script with env, its stdout and
        stderr appended to the files out and err; a Worker."""
        with self._one, self._started:
            self.proc.stdin.write((json.dumps({"script": script, "env": env, "out": out, "err": err}) + "\n").encode())
            self.proc.stdin.flush()
            end = time.monotonic() + 60
            while not self._pids:
                if time.monotonic() > end or self.proc.poll() is not None:
                    raise RuntimeError("the workers' zygote did not fork (exit %s)" % self.proc.poll())
                self._started.wait(1.0)
            return Worker(self, self._pids.pop(0))


if __name__ == "__main__":
    _req = _serve()
    if _req is not None:
        _become(_req)
