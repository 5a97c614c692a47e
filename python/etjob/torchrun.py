"""torchrun for etjob workers: `python3 -m etjob.torchrun ARGS...`.

It runs torch.distributed.run unchanged (every torchrun flag and PET_* variable
works as documented) with these additions (docs/worker-library.md):

* Debian's torch 1.13 on Python 3.11 crashes at launch (IntFlag
  iteration changed, so `Std.from_str("0")` returns None); Std.from_str is fixed.
* torch closes the rendezvous for every node whenever one agent exits other
  than by success (its launcher calls rdzv_handler.shutdown() in a finally:
  a SIGTERM from a pod deletion is enough), which ends the whole elastic job.
  Here an agent that did not succeed only leaves the rendezvous; the others go
  on, and a successful agent still closes it, as torch's completion needs.
* A worker told to leave (a reclamation notice, a scale-in: the node agent says
  so) stops at the step all ranks agreed on, after the checkpoint, with exit
  code 75. When that happens on a leaving pod, this agent leaves the rendezvous
  itself (survivors need not wait out the 15 s heartbeat expiry, measured) and
  exits 75, which the controller counts as a preemption. On a surviving pod the
  agent restarts its workers, which resume from the agreed step's checkpoint.
* Fast resizes: workers fork from a forkserver that imported torch once
  (plus $ETJOB_PRELOAD; ETJOB_WORKER_START=exec restores torch's start), and
  which outlives a SIGTERM to the pod's process group (etjob._forkserver); the
  store is polled every $ETJOB_RDZV_POLL_SECONDS (0.2); a round closes the
  moment the expected nodes joined (_patch_rendezvous).
* A pod told to leave never closes a round, and leaves one it waits in.
"""

import os
import signal
import sys
import threading
import time

from etjob import supervisor as sup_module


def _patch_std():
    from torch.distributed.elastic.multiprocessing import api

    std = api.Std
    original = std.from_str

    def from_str(vm):
        got = original(vm)
        if got is not None:
            return got
        # Python 3.11: a plain "0".."3" no longer maps through the IntFlag loop.
        if isinstance(vm, str) and vm.strip().isdigit():
            return std(int(vm))
        if isinstance(vm, str) and ":" in vm:
            return {int(k): std(int(v)) for k, v in (kv.split(":") for kv in vm.split(","))}
        return got

    std.from_str = staticmethod(from_str)



def _patch_shutdown():
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    state = {"succeeded": False}
    run = api.SimpleElasticAgent.run

    def run_and_remember(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        state["succeeded"] = not result.is_failed()
        return result

    api.SimpleElasticAgent.run = run_and_remember
    shutdown = dr.DynamicRendezvousHandler.shutdown

    def leave_or_close(self):
        if state["succeeded"]:
            return shutdown(self)
        _exit_round(self)
        return True

    dr.DynamicRendezvousHandler.shutdown = leave_or_close


_handlers = []  # the rendezvous handlers of this agent (one in practice)
# _store_lock serialises this wrapper's own uses of the rendezvous store with
# torch's rendezvous rounds: a store client is one socket, and two threads
# talking over it at once can each read the other's answer and wait forever.
# torch's keep-alive and num_nodes_waiting() hold the handler's
# _heartbeat_lock, which the wrapper takes too, after _store_lock, wherever
# the heartbeat thread may still run (_exit_round stops it first).
_store_lock = threading.Lock()


def _exit_round(handler):
    """_exit_round takes this node out of the rendezvous: out of the
    participants (torch's exit op) and out of the wait list (torch's exit op
    leaves a waiting node there until its heartbeat expires, and meanwhile the
    others see a node waiting and restart for it)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    def leave_wait_list(ctx, deadline):
        return dr._Action.REMOVE_FROM_WAIT_LIST if ctx.node in ctx.state.wait_list else dr._Action.FINISH

    handler._stop_heartbeats()
    try:
        with _store_lock, handler._heartbeat_lock:
            handler._op_executor.run(dr._RendezvousExitOp(), time.monotonic() + 10)
            handler._op_executor.run(leave_wait_list, time.monotonic() + 10)
    except Exception as e:  # the store may be gone; heartbeats expire anyway
        print("etjob.torchrun: leaving the rendezvous failed: %s" % e, file=sys.stderr, flush=True)


def _patch_rendezvous(poll):
    """Make re-rendezvous as fast as the membership allows.

    torch's dynamic rendezvous polls the store once a second, serves a state
    cached for a second, and closes a round below max_nodes only after
    last_call_timeout. Here it polls every `poll` seconds, and a node that
    restarts knows how many nodes the next round will have: the nodes of the
    round it ran in, minus those that marked themselves as leaving
    (_leave_early), plus the new ones waiting. The round closes the moment
    they have all joined, whichever node joined last
    (_complete_when_expected). When that is unknown (the first round, a node
    lost without a notice) torch's own rule applies: last_call_timeout after
    min_nodes joined.
    """
    import dataclasses
    import random

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    delay = dr._delay

    def _delay(seconds):
        if _joining and _told_to_leave():
            raise _LeaveRendezvous()
        if isinstance(seconds, tuple):
            seconds = random.uniform(*seconds)
        delay(seconds=min(seconds, poll))

    dr._delay = _delay
    original = dr.DynamicRendezvousHandler.next_rendezvous

    def next_rendezvous(self):
        if self not in _handlers:
            _handlers.append(self)
        holder = self._state_holder
        holder._cache_duration = min(getattr(holder, "_cache_duration", 1), poll / 2)
        settings = self._settings
        if not _told_to_leave():
            _unmark_left(self)  # a withdrawn notice: this node stays after all
        expected = _expected_nodes(self)
        if expected:
            narrowed = dataclasses.replace(settings, max_nodes=expected)
            self._settings = self._op_executor._settings = narrowed
            print("etjob.torchrun: expecting %d nodes in the next round" % expected, file=sys.stderr, flush=True)
        global _joining
        try:
            with _store_lock:
                _joining = True
                try:
                    got = original(self)
                finally:
                    _joining = False
            _rounds[id(self)] = set(self._state_holder.state.participants)
            return got
        except _LeaveRendezvous:
            _leave_rendezvous(self, "told to leave while waiting in the rendezvous")
        finally:
            self._settings = self._op_executor._settings = settings

    dr.DynamicRendezvousHandler.next_rendezvous = next_rendezvous
    dr._RendezvousJoinOp.__call__ = _complete_when_expected(dr._RendezvousJoinOp.__call__)


_sup = None  # this pod's Supervisor, when a node agent serves it (main)
_joining = False  # the agent's main thread waits in a rendezvous round


class _LeaveRendezvous(Exception):
    """Raised between the polls of a round when this pod was told to leave."""


def _told_to_leave():
    return _sigterm.is_set() or (_sup is not None and not _sup.check_alive())


_sigterm = threading.Event()  # this agent got SIGTERM: its pod is being deleted


def _patch_sigterm():
    """The agent's SIGTERM (a pod deletion: a scheduler's preemption, a
    drain) is a leave too. torch's agent stops its workers (they stop at the
    step all ranks agree on, after the checkpoint) and then ends without
    leaving the rendezvous, so the survivors waited out the heartbeat expiry
    (15 s) for it. Here the SIGTERM is noted first: the pod marks itself
    leaving at once (_leave_early), never closes a round, leaves the
    rendezvous once its workers stopped, and exits 75 (main)."""
    from torch.distributed.elastic.multiprocessing import api

    original = api._terminate_process_handler

    def handler(signum, frame):
        _sigterm.set()
        return original(signum, frame)

    api._terminate_process_handler = handler


def _leave_rendezvous(handler, why):
    """_leave_rendezvous takes this node out of the rendezvous (participants
    or wait list) and exits the pod with the reserved code. A pod told to
    leave while it waits in a round must not stay in it: the round could
    complete with it, and when the pod then goes, the others wait for its
    rank's data until their store times out and fail (exit 1, a job failure)
    instead of meeting again (seen in the spot story, session 3)."""
    print("etjob.torchrun: this pod leaves (%s, %s): leaving the rendezvous and exiting %d"
          % (_reason(), why, sup_module.EXIT_CODE_PREEMPTED), file=sys.stderr, flush=True)
    _exit_round(handler)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(sup_module.EXIT_CODE_PREEMPTED)


def _reason():
    if _sigterm.is_set():
        return "SIGTERM"
    return _sup.reason() if _sup is not None else ""


def _complete_when_expected(join):
    """torch completes a round below max_nodes only in add_to_participants,
    with the settings of the node that adds itself last: when that is a
    joiner, whose max_nodes is the job's, not the expected count, the round
    waited out last_call_timeout (3 s; the ~5 s join pauses measured in
    session 2). Here any participant whose (narrowed) max_nodes the round has
    reached completes it on its next poll."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    def call(self, ctx, deadline):
        state = ctx.state
        # A pod that goes never closes a round.
        if (not _told_to_leave() and not state.closed and not state.complete and ctx.node in state.participants
                and len(state.participants) >= ctx.settings.max_nodes and time.monotonic() <= deadline):
            return dr._Action.MARK_RENDEZVOUS_COMPLETE
        return join(self, ctx, deadline)

    return call


_rounds = {}  # id(handler) -> the nodes of the last round it joined


def _left_key(handler, node):
    # A counter per node: torch 1.13's Store has no non-blocking existence
    # check, but add(key, 0) reads a counter without waiting.
    return "%s.etjob.left.%s_%s_%s" % (handler._state_holder._backend._key, node.fqdn, node.pid, node.local_id)


def _unmark_left(handler):
    """_unmark_left clears this node's leaving mark (_leave_early), if any:
    the survivors would otherwise count it out of every later round."""
    try:
        with _store_lock, handler._heartbeat_lock:
            store = handler._state_holder._backend._store
            key = _left_key(handler, handler._this_node)
            marked = store.add(key, 0)
            if marked:
                store.add(key, -marked)
                print("etjob.torchrun: no longer leaving: mark cleared", file=sys.stderr, flush=True)
    except Exception as e:  # the survivors fall back to torch's last call
        print("etjob.torchrun: clearing the leaving mark failed: %r" % (e,), file=sys.stderr, flush=True)


def _expected_nodes(handler):
    """The size of the next round if it is known, else None."""
    last = _rounds.get(id(handler))
    if not last:
        return None
    try:
        with _store_lock, handler._heartbeat_lock:
            handler._state_holder.sync()
            state = handler._state_holder.state
            store = handler._state_holder._backend._store
            left = {n for n in last if n != handler._this_node and store.add(_left_key(handler, n), 0) > 0}
    except Exception as e:
        print("etjob.torchrun: reading the rendezvous state failed: %r" % (e,), file=sys.stderr, flush=True)
        return None
    if state.closed:
        return None
    joining = (set(state.participants) | set(state.wait_list)) - last
    n = len(last - left) + len(joining)
    if n < handler._settings.min_nodes or n >= handler._settings.max_nodes:
        return None
    return n


def _leave_early(sup):
    """A pod told to leave marks its node as leaving in the rendezvous store at
    once, while its workers still run to the agreed stop step: the survivors
    then expect the right number of nodes when they re-rendezvous."""

    def run():
        while True:
            while not _told_to_leave() or not _handlers:
                time.sleep(0.05)
            mark()
            while _told_to_leave():  # a withdrawn notice: mark again at the next one
                time.sleep(0.05)

    def mark():
        for h in list(_handlers):
            try:
                with _store_lock, h._heartbeat_lock:
                    h._state_holder._backend._store.add(_left_key(h, h._this_node), 1)
                print("etjob.torchrun: told to leave (%s): marked in the rendezvous" % _reason(), file=sys.stderr, flush=True)
            except Exception as e:  # the store may be gone: survivors fall back to torch's last call
                print("etjob.torchrun: marking the leave failed: %s" % e, file=sys.stderr, flush=True)

    threading.Thread(target=run, name="etjob-leave", daemon=True).start()


#: Modules a forkserver imports once for every worker start; ETJOB_PRELOAD
#: adds the training script's own heavy imports (comma-separated).
PRELOAD = ["torch", "torch.nn", "torch.nn.functional", "torch.distributed", "numpy", "etjob.supervisor", "etjob.torch"]


def _patch_worker_start(preload):
    """Start workers by forking a server that imported torch once.

    torchrun starts `python -u script.py` for every worker on every
    membership change, and each start imports torch again (seconds on a busy
    node: most of a resize's pause). Here the script runs as a function
    entrypoint under the "forkserver" start method: a single-threaded server
    imports `preload` once, and every worker start is a fork of it. Worker
    environment, exit codes, signals and the script's argv are as before.
    """
    import multiprocessing

    from torch.distributed import run

    original = run.config_from_args

    def config_from_args(args):
        config, cmd, cmd_args = original(args)
        if cmd != os.getenv("PYTHON_EXEC", sys.executable) or cmd_args[:1] != ["-u"]:
            return config, cmd, cmd_args
        rest = cmd_args[1:]
        kind = "script"
        if rest[:1] == ["-m"]:
            kind, rest = "module", rest[1:]
        # The entrypoint is pickled by reference: name it by its module, not
        # by __main__ (python -m etjob.torchrun), and let the forkserver find
        # the package.
        import etjob
        from etjob import torchrun as module

        root = os.path.dirname(os.path.dirname(os.path.abspath(etjob.__file__)))
        path = os.environ.get("PYTHONPATH", "")
        if root not in path.split(os.pathsep):
            os.environ["PYTHONPATH"] = root + (os.pathsep + path if path else "")
        os.environ["ETJOB_AGENT_PID"] = str(os.getpid())
        multiprocessing.set_forkserver_preload(["etjob._forkserver"] + list(preload))
        config.start_method = "forkserver"
        return config, module.run_worker, [kind] + rest

    run.config_from_args = config_from_args


def _die_with_agent():
    """A worker dies with the agent that started it. The agent is what stops
    workers gracefully (it forwards SIGTERM, which the library turns into an
    agreed stop); once it is gone nobody collects a worker's result, and a
    finished worker would wait for it forever. The forkserver is no witness:
    every worker holds it alive. So a thread watches the agent's pid."""
    agent = int(os.environ.get("ETJOB_AGENT_PID", "0"))
    if agent <= 1:
        return

    def alive():
        try:
            with open("/proc/%d/stat" % agent) as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie is gone
        except (OSError, IndexError):
            return False

    def watch():
        while alive():
            time.sleep(0.5)
        os._exit(137)

    threading.Thread(target=watch, name="etjob-agent-watch", daemon=True).start()


def run_worker(kind, target, *args):
    """run_worker runs a training script or module as `python -u` would, in a
    worker forked from the forkserver. A SystemExit keeps its code."""
    import runpy
    import signal

    # the forkserver ignores them (etjob._forkserver); a worker does not
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _die_with_agent()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=True)
        except (AttributeError, ValueError):
            pass
    sys.argv = [target] + list(args)
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)
    return None


def _patch_leaving(sup):
    from torch.distributed.elastic.agent.server import api

    original = api.SimpleElasticAgent._restart_workers

    def _restart_workers(self, worker_group):
        if sup is not None:
            sup.poll_once()  # the workers may have heard it a poll earlier
        if _told_to_leave():
            try:
                self._stop_workers(worker_group)
            except Exception:
                pass
            _leave_rendezvous(worker_group.spec.rdzv_handler, "its workers stopped")
        return original(self, worker_group)

    api.SimpleElasticAgent._restart_workers = _restart_workers


def main(argv=None):
    _patch_std()
    _patch_shutdown()
    _patch_rendezvous(float(os.environ.get("ETJOB_RDZV_POLL_SECONDS", "0.2")))
    if os.environ.get("ETJOB_WORKER_START", "forkserver") == "forkserver":
        extra = [m.strip() for m in os.environ.get("ETJOB_PRELOAD", "").split(",") if m.strip()]
        _patch_worker_start(PRELOAD + extra)
    _patch_sigterm()
    if os.environ.get("ETJOB_AGENT_ADDR"):
        # torch's agent keeps its own SIGTERM handling (it stops the workers).
        global _sup
        _sup = sup_module.Supervisor(install_sigterm=False).start()
    _patch_leaving(_sup)
    _leave_early(_sup)
    from torch.distributed import run

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    try:
        run.main()
    except SignalException as e:
        if e.sigval != signal.SIGTERM:
            raise
        # torch stopped the workers (they stopped at the agreed step) and
        # leaves the rendezvous as it is: leave it, and go as told.
        for h in list(_handlers):
            _exit_round(h)
        print("etjob.torchrun: SIGTERM: the workers stopped; left the rendezvous, exiting %d"
              % sup_module.EXIT_CODE_PREEMPTED, file=sys.stderr, flush=True)
        sys.exit(sup_module.EXIT_CODE_PREEMPTED)
    except ChildFailedError as e:
        # Every worker stopped because it was told to: so does the pod, with
        # the reserved code, instead of torchrun's generic 1.
        codes = {f.exitcode for f in e.failures.values()}
        if codes == {sup_module.EXIT_CODE_PREEMPTED}:
            print("etjob.torchrun: all workers stopped as told; exiting %d" % sup_module.EXIT_CODE_PREEMPTED,
                  file=sys.stderr, flush=True)
            sys.exit(sup_module.EXIT_CODE_PREEMPTED)
        raise


if __name__ == "__main__":
    main()
