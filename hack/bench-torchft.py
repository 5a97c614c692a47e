#!/usr/bin/python3
"""Head to head on one machine: plain DDP, torchft and etjob.elastic training
the same small GPT (examples/gpt) with the same ranks and schedule.

    hack/bench-torchft.py [--ranks 3] [--steady-steps 150] [--rounds 2]
                          [--fault-minutes 10] [--every 30] [--restart-delay 5]
                          [--modes ddp,etjob,torchft,torchft-pure] [--python PY]

1. Steady state: each mode trains --steady-steps steps with no fault, the
   modes one after the other, --rounds times (interleaved, so that a noisy
   neighbour falls on every mode alike): the median step time of each (the
   gaps between the first lines of successive steps, the first 20 steps
   left out) and its ratio to plain DDP in the same round.
   torchft runs its DistributedDataParallel (DDP's buckets, its comm hook);
   torchft-pure its PureDistributedDataParallel (an all-reduce a gradient):
   0.2.0's DistributedDataParallel ends the surviving processes at a hard
   kill (an AssertionError in its comm hook after gloo's "Connection reset
   by peer"), its pure one does not.
2. Faults (etjob and the torchft modes): every --every seconds one rank is killed
   (SIGKILL; the ranks in turn: 1, 2, 0, ...) and started again by this
   harness --restart-delay seconds later, for --fault-minutes. Reported: the
   share of the wall time spent training (1 - the pauses over the wall
   time: every gap between new steps longer than 3 median steps, less one
   step), the pause at each fault (the longest such gap from its kill to
   the next: the loss or the replacement's join; p50 and max) and the steps
   done again (a step logged once the job had gone past it).

Plain DDP gets no faults: it has no recovery (torchrun would restart every
rank). Step lines are examples/gpt's `step=S rank=R world=W ... t=T`. The
interpreter is the torch 2.x venv (hack/install-torch2.sh), which has
torchft 0.2.0 and its lighthouse. Output: a Markdown table on stdout, the
ranks' logs under a temporary directory (printed).
"""

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
from etjob import storeauth  # noqa: E402  (stdlib only: no torch in this process)

STEP = re.compile(r"^step=(\d+) rank=\d+ world=(\d+) loss=[\d.]+ pid=\d+ t=([\d.]+)$")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Run:
    """Run is one mode's processes: its services and its ranks, their logs
    under dir."""

    def __init__(self, mode, args, steps, dir_):
        self.mode, self.args, self.dir = mode, args, dir_
        self.py = args.python
        self.env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), STEPS=str(steps),
                        THREADS="1", CHECKPOINT_EVERY="1000000", ETJOB_CHECKPOINT_DIR=os.path.join(dir_, "ckpt"))
        self.env.pop("ETJOB_AGENT_ADDR", None)
        self.services, self.ranks, self.logs, self.started = [], {}, [], 0
        os.makedirs(dir_, exist_ok=True)
        if mode == "ddp":
            self.env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.ranks))
        elif mode == "etjob":
            port = free_port()
            # the store and the ranks authenticate with a job secret, as a launcher's and its workers' do
            self.env["ETJOB_STORE_SECRET_FILE"] = storeauth.write_secret(os.path.join(dir_, "store-secret"))
            self.service([self.py, "-m", "etjob.rdzv", "--host", "127.0.0.1", "--port", str(port)], "store")
            self.env.update(ETJOB_RDZV_ENDPOINT="127.0.0.1:%d" % port, PET_NNODES="1:%d" % args.ranks,
                            PET_RDZV_ID="bench", ETJOB_HEARTBEAT_TIMEOUT=str(args.detect))
        elif mode in ("torchft", "torchft-pure"):
            port = free_port()
            lighthouse = os.path.join(os.path.dirname(self.py), "torchft_lighthouse")
            self.service([lighthouse, "--bind", "[::]:%d" % port, "--min_replicas", "1", "--quorum_tick_ms", "100",
                          "--join_timeout_ms", str(int(args.join_ms)), "--heartbeat_timeout_ms", str(int(args.detect * 1000))], "lighthouse")
            self.env.update(TORCHFT_LIGHTHOUSE="http://localhost:%d" % port, NUM_REPLICA_GROUPS=str(args.ranks),
                            TORCHFT_MIN_REPLICAS="1")
            # torchft's Manager reads these itself (its defaults: 60 s each)
            for name, seconds in (("TIMEOUT", args.detect), ("QUORUM_TIMEOUT", args.detect * 6),
                                  ("CONNECT_TIMEOUT", args.detect * 2)):
                self.env["TORCHFT_%s_SEC" % name] = str(seconds)
            if mode == "torchft-pure":
                self.env["TORCHFT_DDP"] = "pure"
            self.env.update(kv.split("=", 1) for kv in args.torchft_env.split(",") if kv)
        time.sleep(2)

    def service(self, cmd, name):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        self.services.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def start(self, i):
        """start runs rank i (a new process, a new log)."""
        self.started += 1
        name = "r%d-%d" % (i, self.started)
        env = dict(self.env)
        script = {"ddp": "train.py", "etjob": "train_elastic.py"}.get(self.mode, "train_torchft.py")
        if self.mode == "ddp":
            env.update(RANK=str(i), LOCAL_RANK=str(i))
        elif self.mode == "etjob":
            env.update(ETJOB_POD_NAME=name)
        else:
            env.update(REPLICA_GROUP_ID=str(i), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                       RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        path = os.path.join(self.dir, name)
        out, err = open(path + ".out", "w"), open(path + ".err", "w")
        self.ranks[i] = subprocess.Popen([self.py, os.path.join(REPO, "examples/gpt", script)], env=env,
                                         stdout=out, stderr=err)
        self.logs.append(path + ".out")

    def kill(self, i):
        p = self.ranks.get(i)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()

    def wait(self, timeout):
        end = time.monotonic() + timeout
        for p in self.ranks.values():
            try:
                p.wait(max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                return False
        return True

    def close(self):
        for p in list(self.ranks.values()) + self.services:
            if p.poll() is None:
                p.kill()
                p.wait()

    def steps(self):
        """(t, step) of every step line of every rank, by time."""
        got = []
        for path in self.logs:
            with open(path) as f:
                for line in f:
                    m = STEP.match(line.strip())
                    if m:
                        got.append((float(m.group(3)), int(m.group(1))))
        return sorted(got)


def firsts(lines):
    """The time each step was first logged, by step."""
    seen = {}
    for t, s in lines:
        seen.setdefault(s, t)
    return sorted(seen.items())


def median_step(lines, skip=20):
    f = [t for s, t in firsts(lines) if s > skip]
    gaps = [b - a for a, b in zip(f, f[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def redone(lines):
    """Steps logged after the job had gone past them (distinct steps)."""
    top, again = 0, set()
    for _, s in lines:
        if s < top:
            again.add(s)
        top = max(top, s)
    return len(again)


def steady(args, mode, round_, root):
    run = Run(mode, args, args.steady_steps, os.path.join(root, "steady-%s-%d" % (mode, round_)))
    try:
        for i in range(args.ranks):
            run.start(i)
        if not run.wait(args.steady_steps * 5 + 120):
            raise SystemExit("%s did not finish %d steps (logs: %s)" % (mode, args.steady_steps, run.dir))
        return median_step(run.steps())
    finally:
        run.close()


def faults(args, mode, root, step_time):
    run = Run(mode, args, 10**7, os.path.join(root, "faults-%s" % mode))
    kills = []
    try:
        for i in range(args.ranks):
            run.start(i)
        began = time.time()
        time.sleep(args.every)
        victim, end = 1 % args.ranks, began + args.fault_minutes * 60
        while time.time() + args.restart_delay < end:
            kills.append(time.time())
            run.kill(victim)
            time.sleep(args.restart_delay)
            run.start(victim)
            victim = (victim + 1) % args.ranks
            time.sleep(max(args.every - args.restart_delay, 0))
        wall = time.time() - began
    finally:
        run.close()
    lines = [(t, s) for t, s in run.steps() if t >= began]
    f = [t for _, t in firsts(lines)]
    # a gap between new steps longer than 3 steps is paused time (less one
    # step); a fault's pause is the longest such gap from its kill to the
    # next kill (the loss, then the replacement's join)
    gaps = [(a, b - a - step_time) for a, b in zip(f, f[1:]) if b - a > 3 * step_time]
    pauses = []
    for k, nxt in zip(kills, kills[1:] + [float("inf")]):
        pauses.append(max([g for a, g in gaps if k - 3 * step_time <= a < nxt] or [0.0]))
    trained = 1 - sum(g for _, g in gaps) / wall
    return {"wall": wall, "faults": len(kills), "pauses": pauses, "trained": trained, "redone": redone(lines),
            "steps": max((s for _, s in lines), default=0) - min((s for _, s in lines), default=0), "dir": run.dir}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--steady-steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--fault-minutes", type=float, default=10)
    p.add_argument("--every", type=float, default=30)
    p.add_argument("--restart-delay", type=float, default=5)
    p.add_argument("--detect", type=float, default=5, help="the failure detection deadline (s) both get")
    p.add_argument("--join-ms", type=float, default=1000, help="torchft lighthouse's join timeout (ms)")
    p.add_argument("--modes", default="ddp,etjob,torchft,torchft-pure")
    p.add_argument("--torchft-env", default="", help="more env for torchft's ranks, e.g. TORCHFT_DDP=pure,TORCHFT_PG=baby")
    p.add_argument("--python", help="the torch 2.x interpreter (default: the venv hack/install-torch2.sh makes, or finds in its cache)")
    args = p.parse_args()
    if not args.python:
        # the one place that knows the venv's version and path
        venv = subprocess.run([os.path.join(REPO, "hack", "install-torch2.sh")], cwd=REPO, check=True,
                              stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
        args.python = os.path.join(venv, "bin", "python3")
    modes = args.modes.split(",")
    root = tempfile.mkdtemp(prefix="etjob-bench-torchft-")
    print("logs under %s" % root, file=sys.stderr)
    medians = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes:
            medians[m].append(steady(args, m, r, root))
            print("round %d %s: median step %.4f s" % (r, m, medians[m][-1]), file=sys.stderr, flush=True)
    print("| mode | median step (s), per round | vs plain DDP (same round) |")
    print("|---|---|---|")
    for m in modes:
        ratio = [a / b for a, b in zip(medians[m], medians.get("ddp", medians[m]))]
        print("| %s | %s | %s |" % (m, ", ".join("%.4f" % v for v in medians[m]), ", ".join("%.3f" % v for v in ratio)))
    if args.fault_minutes <= 0:
        return
    print()
    print("| mode | faults | wall (s) | share training | pause p50 (s) | pause max (s) | steps done again | steps |")
    print("|---|---|---|---|---|---|---|---|")
    for m in modes:
        if m == "ddp":
            continue
        got = faults(args, m, root, statistics.median(medians[m]))
        ps = got["pauses"] or [float("nan")]
        print("| %s | %d | %.0f | %.3f | %.2f | %.2f | %d | %d |" % (
            m, got["faults"], got["wall"], got["trained"], statistics.median(ps), max(ps), got["redone"], got["steps"]),
            flush=True)


if __name__ == "__main__":
    main()
