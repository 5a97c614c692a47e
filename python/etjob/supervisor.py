"""Spot-notice supervision for training processes (stdlib only, Python >= 3.9).

A drop-in for Alibaba's closed kubeai Job-Supervisor::

    import etjob.supervisor as kubeai
    kubeai.init()
    for batch in loader:
        if not kubeai.check_alive():
            save_checkpoint()
            kubeai.exit_preempted()   # exit code 75: a preemption, never a failure
        ...

init() starts a background thread that asks this pod's node agent
($ETJOB_AGENT_ADDR, node-local) every ~100 ms what this pod must do, proving
who it is with its projected service-account token. check_alive() reads that
cache and costs nothing. A SIGTERM (the last resort: the pod is being deleted)
also makes check_alive() return False instead of killing the process, so the
step in flight finishes and a checkpoint can be written.

Without an agent (not on Kubernetes, or an old cluster) it degrades to the
SIGTERM fallback alone and says so once on stderr.
"""

import json
import os
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request

from etjob import contract

#: The reserved exit code of a worker that stops because it was told to
#: (EX_TEMPFAIL). The controller counts it as a preemption and never as a
#: failure; it is not 0, which Horovod would take for the end of the job.
EXIT_CODE_PREEMPTED = int(os.environ.get(contract.ENV_EXIT_CODE_PREEMPTED, str(contract.EXIT_CODE_PREEMPTED)))

# The pod's token for the node agent (audience etjob-agent, mounted by the
# controller and named in $ETJOB_AGENT_TOKEN_PATH). Without it no token is
# sent: the pod's API token is never sent over the agent's plain HTTP unless
# $ETJOB_AGENT_TOKEN_PATH names it (for an agent run with
# --token-audiences=""; docs/security.md, L3).
TOKEN_PATH = os.environ.get(contract.ENV_AGENT_TOKEN_PATH) or None


class Supervisor:
    """Supervisor polls the node agent and tracks SIGTERM for one pod."""

    def __init__(self, agent_addr=None, namespace=None, pod=None, token_path=TOKEN_PATH,
                 interval=0.1, install_sigterm=True, log=None, clock=time.time, heartbeat=True):
        self.agent_addr = agent_addr if agent_addr is not None else os.environ.get(contract.ENV_AGENT_ADDR, "")
        self.namespace = namespace or os.environ.get(contract.ENV_NAMESPACE, "default")
        self.pod = pod or os.environ.get(contract.ENV_POD_NAME) or os.environ.get("HOSTNAME", "")
        self.token_path = token_path
        self.interval = interval
        self._log = log or (lambda msg: print("etjob.supervisor: " + msg, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self._signal = {"action": "none", "reason": "", "deadline": "", "source": ""}
        self._sigterm = False
        self._sigterm_said = False
        self._pending = False  # a checkpoint asked for and not yet reported by should_checkpoint
        self._clock = clock
        self._stop = threading.Event()
        self._thread = None
        self._warned = set()
        self._beat = None   # (step, world, round) the library said last (beat)
        self._alive_calls = 0  # check_alive() calls: the step of a script that says nothing more
        # False for a process that does not train (etjob.torchrun's agent):
        # its polls carry no heartbeat, which would be another world's
        self._heartbeat_on = heartbeat
        if install_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- public API --------------------------------------------------------

    def start(self):
        """start begins polling the agent in a daemon thread (idempotent)."""
        if self._thread is None and self.agent_addr:
            self._thread = threading.Thread(target=self._run, name="etjob-supervisor", daemon=True)
            self._thread.start()
        elif not self.agent_addr:
            self._warn_once("no-agent", contract.ENV_AGENT_ADDR + " is not set: only SIGTERM will stop this worker")
        return self

    def close(self):
        """close stops the polling thread."""
        self._stop.set()

    def check_alive(self):
        """check_alive is False once this worker must checkpoint and stop. A
        worker on a noticed node that the controller lets train through the
        notice stays alive until the signal's stopAt (stop_at()). Called
        once a step, it also counts the steps of the worker's heartbeat."""
        with self._lock:
            self._alive_calls += 1
            return not self._sigterm_seen() and not self._stopping()

    def must_stop(self):
        """must_stop is check_alive's answer negated, without counting a
        step: for a process that asks while it does not train (a newcomer
        waiting to join)."""
        with self._lock:
            return self._sigterm_seen() or self._stopping()

    def beat(self, step, world, round_):
        """beat says this worker's training step, world size and round (its
        rendezvous round, or its etjob.elastic generation); the next poll of
        the node agent carries them, and the controller sees from them a
        member that stopped advancing or trains apart (a split). The worker
        library calls it on its own; a script that never does is counted by
        its check_alive() calls, with WORLD_SIZE and ETJOB_RDZV_ROUND."""
        with self._lock:
            self._beat = (int(step), int(world), int(round_))

    def _heartbeat(self):
        """The heartbeat the next poll carries, or None (nothing said)."""
        if not self._heartbeat_on:
            return None
        with self._lock:
            if self._beat is not None:
                return self._beat
            calls = self._alive_calls
        if not calls:
            return None
        try:
            return calls, int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get(contract.ENV_RENDEZVOUS_ROUND, "0"))
        except ValueError:
            return None

    def _stopping(self):
        if self._signal["action"] != "leave":
            return False
        at = _parse_time(self._signal.get("stopAt") or "")
        return at is None or self._clock() >= at

    def should_checkpoint(self):
        """should_checkpoint is True when a checkpoint is wanted now: once for
        each early warning (AWS rebalance, GCP maintenance) or notice this
        worker trains through, and always while it stops."""
        with self._lock:
            if self._sigterm_seen() or self._stopping():
                return True
            pending, self._pending = self._pending, False
            return pending

    def stop_at(self):
        """stop_at is when this worker stops training through its notice
        (seconds since the epoch), or None."""
        with self._lock:
            return _parse_time(self._signal.get("stopAt") or "")

    def deadline(self):
        """deadline is the reclamation deadline (seconds since the epoch), or None."""
        with self._lock:
            return _parse_time(self._signal.get("deadline") or "")

    def reason(self):
        """reason says why this worker must stop ("" while it may go on)."""
        with self._lock:
            if self._sigterm_seen():
                return "SIGTERM"
            return self._signal.get("reason", "") if self._signal["action"] != "none" else ""

    def exit_preempted(self):
        """exit_preempted ends the process with the reserved exit code."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_CODE_PREEMPTED)

    def report_progress(self, step, checkpoint_step=0, checkpoint_path="", checkpoint_seconds=0.0, samples_per_second=0.0,
                        workers=0):
        """report_progress tells the node agent how far this worker got and its
        last checkpoint; the agent publishes new checkpoints on the pod, and the
        controller shows the newest in status.lastCheckpoint. samples_per_second
        is the throughput measured with `workers` workers (the world size): the
        controller's growth rule compares it across sizes. Best effort: it
        never raises and gives up after one second."""
        if not self.agent_addr:
            return False
        body = json.dumps({"step": int(step), "checkpointStep": int(checkpoint_step), "checkpointPath": checkpoint_path,
                           "checkpointSeconds": float(checkpoint_seconds), "samplesPerSecond": float(samples_per_second),
                           "workers": int(workers)}).encode()
        req = self._request("/v1/progress", body)
        try:
            with urllib.request.urlopen(req, timeout=1):
                return True
        except Exception as e:
            self._warn_once("progress-" + type(e).__name__, "reporting progress to the node agent failed: %s" % e)
            return False

    def poll_once(self):
        """poll_once asks the agent once (with this worker's heartbeat) and
        updates the cached signal."""
        beat = self._heartbeat()
        extra = {"step": beat[0], "world": beat[1], "round": beat[2]} if beat else None
        req = self._request("/v1/signal", query=extra)
        try:
            with urllib.request.urlopen(req, timeout=1) as resp:
                got = json.load(resp)
        except Exception as e:  # the agent may be restarting: keep the last answer
            self._warn_once(type(e).__name__, "asking the node agent at %s failed: %s" % (self.agent_addr, e))
            return False
        if got.get("action") not in ("none", "checkpoint", "leave"):
            self._warn_once("bad-action", "the node agent answered an unknown action: %r" % (got,))
            return False
        with self._lock:
            if self._signal.get("action") == "leave" and got.get("action") != "leave":
                # A leave stands: the ranks are already stopping at an agreed
                # step, and a restarted agent may not know the notice yet.
                return True
            changed = got.get("action") != self._signal.get("action") or got.get("stopAt") != self._signal.get("stopAt")
            if self._signal.get("action") == "none" and got.get("action") != "none":
                self._pending = True
            self._signal = got
        if changed and got.get("action") != "none":
            msg = "node agent %s says %s (%s, deadline %s)" % (self.agent_addr, got.get("action"), got.get("reason", ""), got.get("deadline", ""))
            if got.get("stopAt"):
                msg += ": training on until " + got["stopAt"]
            self._log(msg)
        return True

    # -- internals -----------------------------------------------------------

    def _request(self, path, body=None, query=None):
        """_request is a request for this pod to the agent, carrying the pod's
        token for the agent, if it has one (a POST of JSON when body is given)."""
        query = urllib.parse.urlencode(dict({"namespace": self.namespace, "pod": self.pod}, **(query or {})))
        addr = self.agent_addr if "://" in self.agent_addr else "http://" + self.agent_addr
        req = urllib.request.Request(addr + path + "?" + query, data=body, method="POST" if body is not None else "GET")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if self.token_path:
            try:
                with open(self.token_path) as f:
                    req.add_header("Authorization", "Bearer " + f.read().strip())
            except OSError:
                pass
        return req

    def _run(self):
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

    def _on_sigterm(self, signum, frame):
        # Python runs this in the main thread between two bytecodes, maybe
        # while that thread holds self._lock (check_alive(), once a step) or
        # writes to stderr: it takes no lock and prints nothing (waiting for
        # the lock its own thread holds hung the worker for good). A bool
        # store is atomic; the readers say it once (_sigterm_seen).
        self._sigterm = True

    def _sigterm_seen(self):
        """_sigterm_seen is whether SIGTERM came, said once in the log;
        self._lock held."""
        if self._sigterm and not self._sigterm_said:
            self._sigterm_said = True
            self._log("SIGTERM: finishing the step, then checkpoint and exit %d" % EXIT_CODE_PREEMPTED)
        return self._sigterm

    def _warn_once(self, key, msg):
        if key not in self._warned:
            self._warned.add(key)
            self._log(msg)


def _parse_time(s):
    """_parse_time reads an RFC 3339 time as seconds since the epoch (None if empty or not a time)."""
    if not s:
        return None
    try:
        from datetime import datetime
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


_default = None


def init(**kwargs):
    """init starts the process-wide supervisor (kubeai.init())."""
    global _default
    if _default is None:
        _default = Supervisor(**kwargs).start()
    return _default


def _sup():
    return _default if _default is not None else init()


def check_alive():
    """check_alive is False once this worker must checkpoint and stop (kubeai.check_alive())."""
    return _sup().check_alive()


def should_checkpoint():
    """should_checkpoint is True when a checkpoint is wanted now."""
    return _sup().should_checkpoint()


def deadline():
    """deadline is the reclamation deadline (epoch seconds) or None."""
    return _sup().deadline()


def stop_at():
    """stop_at is when this worker stops training through its notice (epoch seconds) or None."""
    return _sup().stop_at()


def reason():
    """reason says why this worker must stop."""
    return _sup().reason()


def exit_preempted():
    """exit_preempted ends the process with the reserved exit code 75."""
    _sup().exit_preempted()


def report_progress(step, checkpoint_step=0, checkpoint_path="", checkpoint_seconds=0.0, samples_per_second=0.0, workers=0):
    """report_progress tells the node agent the step and the last checkpoint."""
    return _sup().report_progress(step, checkpoint_step, checkpoint_path, checkpoint_seconds, samples_per_second, workers)
