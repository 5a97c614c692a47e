"""Several ranks a pod for etjob.elastic: a pod's local ranks, one failure
domain (stdlib only).

    python3 -m etjob.launch [--nproc-per-node N] train.py [args...]
    python3 -m etjob.launch [--nproc-per-node N] -m package.module [args...]

starts N processes of the script in this pod (torchrun's --nproc-per-node;
default $ETJOB_SLOTS_PER_WORKER, which the controller sets from
spec.slotsPerWorker, else 1), each with LOCAL_RANK (0..N-1) and
LOCAL_WORLD_SIZE (N) in its environment, as torchrun sets them.
etjob.elastic then keeps the pod's ranks together (docs/worker-library.md,
Several ranks a pod): they are adjacent ranks of every generation, they
join together, a notice or a scale-in takes them out together at one
commit, and each rank with a GPU uses device LOCAL_RANK.

The pod is one failure domain: when one local rank dies (a signal, an
error), this launcher kills the others at once (SIGKILL) and exits with the
dead rank's code (128 + the signal for a signal, as a shell says it), so
that the controller replaces the whole pod and the other pods' ranks go on
without it, in their own processes. A rank that leaves at an agreed commit
(exit 75: a notice, a scale-in, a stop below min) is waited for with its
siblings, which leave at the same commit; the launcher then exits 75. All
ranks ending 0 end the launcher 0.

SIGTERM and SIGINT are passed to every local rank (a pod's deletion: each
rank leaves at the next agreed commit). A launcher killed without a chance
to pass anything on takes its ranks with it (PR_SET_PDEATHSIG).
"""

import argparse
import ctypes
import os
import signal
import subprocess
import sys

from etjob import EXIT_CODE_PREEMPTED, contract

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """In the child before exec: SIGKILL when the launcher dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _log(msg):
    print("etjob.launch: " + msg, file=sys.stderr, flush=True)


def _code(status):
    """A Popen returncode as a shell's exit code (a signal: 128 + it)."""
    return 128 - status if status < 0 else status


def _how(status):
    if status < 0:
        try:
            return "was killed by %s" % signal.Signals(-status).name
        except ValueError:
            return "was killed by signal %d" % -status
    return "exited %d" % status


def parse(argv):
    p = argparse.ArgumentParser(
        prog="python3 -m etjob.launch",
        description="Run N local ranks of an etjob.elastic script in this pod; the pod is one failure domain.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", type=int, default=None,
                   help="ranks in this pod (default $%s, else 1)" % contract.ENV_SLOTS_PER_WORKER)
    p.add_argument("-m", dest="module", action="store_true", help="run the script as a module (python -m)")
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = p.parse_args(argv)
    slots = os.environ.get(contract.ENV_SLOTS_PER_WORKER, "")
    try:
        job = int(slots) if slots else None
    except ValueError:
        p.error("$%s=%r is not a number" % (contract.ENV_SLOTS_PER_WORKER, slots))
    if a.nproc is None:
        a.nproc = job or 1
    if a.nproc < 1:
        p.error("--nproc-per-node must be at least 1, not %d" % a.nproc)
    if job is not None and job != a.nproc:
        p.error("--nproc-per-node=%d, but this job's pods hold %d ranks each ($%s, spec.slotsPerWorker): "
                "leave the flag out, or make them equal" % (a.nproc, job, contract.ENV_SLOTS_PER_WORKER))
    return a


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    cmd = [sys.executable] + (["-m"] if a.module else []) + [a.script] + a.args
    procs = []
    for local in range(a.nproc):
        env = dict(os.environ)
        env[contract.ENV_LOCAL_RANK] = str(local)
        env[contract.ENV_LOCAL_WORLD_SIZE] = str(a.nproc)
        procs.append(subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent))

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except OSError:
                    pass

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    sys.exit(supervise(procs))


def supervise(procs):
    """supervise waits for the local ranks and returns the launcher's exit
    code: a rank that dies kills the others at once (the pod is one failure
    domain: within milliseconds, before they reach the next rendezvous);
    ranks that leave (75) or finish (0) are waited for."""
    by_pid = {p.pid: (local, p) for local, p in enumerate(procs)}
    left = False
    while by_pid:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        if pid not in by_pid:
            continue
        local, p = by_pid.pop(pid)
        p.returncode = status = os.waitstatus_to_exitcode(status)
        if status in (0, EXIT_CODE_PREEMPTED):
            left = left or status == EXIT_CODE_PREEMPTED
            continue
        others = [q for _, q in by_pid.values()]
        for q in others:
            try:
                q.kill()
            except OSError:
                pass
        for q in others:
            q.wait()
        _log("local rank %d (pid %d) %s: the pod's %d other running rank(s) were killed with it (a pod is one "
             "failure domain); the other pods go on without it" % (local, p.pid, _how(status), len(others)))
        return _code(status)
    return EXIT_CODE_PREEMPTED if left else 0


if __name__ == "__main__":
    main()
