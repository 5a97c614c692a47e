"""bench_checkpoint: sharded checkpoints against rank 0's whole file.

Runs the same job twice a round, side by side: RANKS real gloo ranks of
etjob.elastic's DDP API (DistributedDataParallel + Optimizer) training a
model of LAYERS linear layers (--mb MB of parameters, as much again of SGD
momentum), a background checkpoint every --every steps, once with
ETJOB_SHARDED_CHECKPOINTS=0 (rank 0 copies the whole state, then writes
it) and once sharded (each rank copies and writes its part, rank 0 the
manifest). Prints, per mode, the medians over the rounds of: the step time
with no checkpoint requested (rank 0's), the training time a checkpoint
costs (the extra time of the steps from its request to its landing, over
that median), and the time from the request to `latest`. Usage (either
torch):

    PYTHONPATH=python:python/tests /usr/bin/python3 python/tests/bench_checkpoint.py --mb 512 --rounds 2

With --worker it is one rank (the bench starts them).
"""

import argparse
import datetime
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def worker(mb, steps, every, directory):
    import torch

    from etjob import elastic

    torch.manual_seed(0)
    torch.set_num_threads(1)
    d = 512
    layers = max(3, mb * 2**20 // (4 * d * d))
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(layers)])
    ddp = elastic.DistributedDataParallel(model)
    opt = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), ddp)
    x = torch.randn(4, d)
    for step in opt.steps(steps):
        began = time.time()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        if elastic.rank() == 0:
            print("step=%d t=%.4f took=%.4f" % (step + 1, time.time(), time.time() - began), flush=True)
            if every and (step + 1) % every == 0:
                t = time.time()
                opt.checkpoint_async(directory, done=lambda path, took, t=t: print(
                    "landed %s requested=%.4f t=%.4f" % (os.path.basename(path), t, time.time()), flush=True))


def run(ranks, mb, steps, every, sharded):
    directory = tempfile.mkdtemp(prefix="etjob-bench-ckpt-")
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    env = dict(os.environ, ETJOB_RDZV_ENDPOINT="127.0.0.1:%d" % port, PET_NNODES="%d:%d" % (ranks, ranks),
               PET_RDZV_ID="bench", ETJOB_SHARDED_CHECKPOINTS="1" if sharded else "0")
    env.pop("ETJOB_AGENT_ADDR", None)
    procs = []
    for i in range(ranks):
        with open(os.path.join(directory, "%d.out" % i), "w") as o:
            procs.append(subprocess.Popen(
                [sys.executable, HERE, "--worker", "--mb", str(mb), "--steps", str(steps), "--every", str(every),
                 "--dir", os.path.join(directory, "ckpt")], env=dict(env, ETJOB_POD_NAME="bench-%d" % i), stdout=o))
    codes = [p.wait() for p in procs]
    del store
    lines = []
    for i in range(ranks):  # rank 0 prints (whichever process it is)
        with open(os.path.join(directory, "%d.out" % i)) as f:
            lines += f.read().splitlines()
    shutil.rmtree(directory, ignore_errors=True)
    if any(codes):
        sys.exit("a rank failed: %s\n%s" % (codes, "\n".join(lines[-20:])))
    steps_at = [(int(m.group(1)), float(m.group(2)), float(m.group(3)))
                for m in (re.match(r"step=(\d+) t=([\d.]+) took=([\d.]+)", l) for l in lines) if m]
    landed = [(float(m.group(1)), float(m.group(2)))
              for m in (re.match(r"landed \S+ requested=([\d.]+) t=([\d.]+)", l) for l in lines) if m]
    if not landed:
        sys.exit("no checkpoint landed:\n%s" % "\n".join(lines[-20:]))
    # the gaps between rank 0's step lines: a step's whole time, its vote
    # and whatever the copy of a checkpoint held it up by
    gaps = [(t1, t1 - t0) for (_, t0, _), (_, t1, _) in zip(steps_at, steps_at[1:])]
    busy = lambda t: any(a < t <= b + 0.5 for a, b in landed)  # noqa: E731
    clean = statistics.median(g for t, g in gaps if not busy(t))
    cost = [sum(g - clean for t, g in gaps if a < t <= b + 0.5) for a, b in landed]
    return clean, statistics.median(cost), statistics.median(b - a for a, b in landed), len(landed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--mb", type=int, default=512, help="MB of parameters (as much again of momentum)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir")
    a = ap.parse_args()
    if a.worker:
        return worker(a.mb, a.steps, a.every, a.dir)
    import torch

    got = {False: [], True: []}
    for r in range(a.rounds):
        for sharded in (False, True):
            got[sharded].append(run(a.ranks, a.mb, a.steps, a.every, sharded))
            print("round %d %-7s step %.3f s, a checkpoint costs training %.3f s, lands in %.2f s (%d landed)" % (
                (r + 1, "sharded" if sharded else "whole") + got[sharded][-1]), flush=True)
    print("\ntorch %s, %d ranks, %d MB of parameters + %d MB of momentum, a checkpoint every %d steps; medians of %d rounds"
          % (torch.__version__, a.ranks, a.mb, a.mb, a.every, a.rounds))
    for sharded in (False, True):
        rows = got[sharded]
        print("%-36s step %.3f s   training lost per checkpoint %.3f s   request to latest %.2f s" % (
            "sharded (every rank its part)" if sharded else "whole (rank 0, ETJOB_SHARDED_CHECKPOINTS=0)",
            statistics.median(x[0] for x in rows), statistics.median(x[1] for x in rows),
            statistics.median(x[2] for x in rows)))


if __name__ == "__main__":
    main()
