"""GPU checks of etjob.elastic's data path, for a machine with one GPU (run
by hack/gpu-check.sh; no test depends on it: the project's CI machines have
no GPU).

    python3 hack/gpu_check.py nccl-abort [N]    # N world-1 NCCL groups, each aborted and made again
    python3 hack/gpu_check.py gloo-cuda         # 4 ranks, DDP on CUDA tensors over gloo, a hard kill

nccl-abort: a world-1 NCCL communicator (NCCL refuses two ranks of one
communicator on one GPU) is made, runs an all-reduce whose completion is
polled (is_completed: NCCL's wait() returns at enqueue), and is aborted, N
times; torch.cuda.memory_allocated and the device's used memory (NVML via
torch.cuda.mem_get_info) are printed every 10 and must stay flat (within
64 MiB of the first after warm-up). Exit 0 when they do.

gloo-cuda: 4 processes train a small model with etjob.elastic's
DistributedDataParallel on CUDA tensors through gloo (the model on the GPU;
the buckets cross gloo), one is SIGKILLed at step 30, the others go on in
process to the end. Exit 0 when the three survivors finish with equal
weights.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def used():
    free, total = torch.cuda.mem_get_info()
    return torch.cuda.memory_allocated(), total - free


def nccl_abort(n):
    torch.cuda.set_device(0)
    store = dist.HashStore()
    first = None
    for i in range(n):
        opts = dist.ProcessGroupNCCL.Options()
        if hasattr(opts, "config"):
            opts.config.blocking = False
        pg = dist.ProcessGroupNCCL(dist.PrefixStore("g%d/" % i, store), 0, 1, opts)
        t = torch.ones(1 << 20, device="cuda")
        work = pg.allreduce([t])
        end = time.monotonic() + 30
        while not work.is_completed():
            if time.monotonic() > end:
                sys.exit("nccl-abort: all-reduce %d not completed in 30 s" % i)
            time.sleep(0.001)
        pg.abort()
        del pg, t, work
        if i == 10:
            first = used()
        if i % 10 == 0 or i == n - 1:
            alloc, dev = used()
            print("nccl-abort %d: allocated %.1f MiB, device used %.1f MiB" % (i, alloc / 2**20, dev / 2**20), flush=True)
    alloc, dev = used()
    grew = (dev - first[1]) / 2**20
    print("nccl-abort: device memory grew %.1f MiB from group 10 to group %d" % (grew, n), flush=True)
    if grew > 64:
        sys.exit("nccl-abort: GPU memory leaked (%.1f MiB over %d groups)" % (grew, n - 10))


def gloo_cuda():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))  # noqa: F841
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), ETJOB_RDZV_ENDPOINT="127.0.0.1:%d" % port,
               PET_NNODES="2:4", PET_RDZV_ID="gpu", GPU_WORKER="1")
    env.pop("ETJOB_AGENT_ADDR", None)
    procs = [subprocess.Popen([sys.executable, __file__, "worker"], env=dict(env, ETJOB_POD_NAME="w%d" % i),
                              stdout=subprocess.PIPE, text=True) for i in range(4)]
    # rank 0's lines are read as they come; w3 is killed at step 30
    outs = {i: [] for i in range(4)}
    killed = False
    for line in procs[0].stdout:
        outs[0].append(line.strip())
        if not killed and line.startswith("step=30 "):
            procs[3].send_signal(signal.SIGKILL)
            killed = True
    end = time.monotonic() + 120
    for i, p in enumerate(procs):
        out, _ = p.communicate(timeout=max(end - time.monotonic(), 1))
        outs[i] += out.splitlines()
    finals = [next((l for l in outs[i] if l.startswith("done ")), None) for i in range(3)]
    print("\n".join(str(f) for f in finals), flush=True)
    if not killed or None in finals or len({f.split("weight=")[1] for f in finals}) != 1:
        sys.exit("gloo-cuda: the survivors did not finish alike (killed=%s)" % killed)


def worker():
    import etjob.elastic as elastic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
    ddp = elastic.DistributedDataParallel(model)
    opt = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.01), ddp)
    for step in opt.steps(200):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(24, 64, generator=g).cuda()
        rank, world = elastic.rank(), elastic.size()
        share = 24 // world
        loss = ddp(x[rank * share:(rank + 1) * share]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        time.sleep(0.02)
        if opt.step():
            print("step=%d rank=%d world=%d" % (step + 1, rank, world), flush=True)
    w = model[2].weight.detach().cpu().reshape(-1)[:4].tolist()
    print("done weight=%s" % ",".join("%.5f" % v for v in w), flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available() and sys.argv[1:2] != ["worker"]:
        sys.exit("gpu_check.py: no GPU here (torch.cuda.is_available() is False)")
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "nccl-abort":
        nccl_abort(int(sys.argv[2]) if len(sys.argv) > 2 else 100)
    elif what == "gloo-cuda":
        gloo_cuda()
    elif what == "worker":
        worker()
    else:
        sys.exit("usage: gpu_check.py nccl-abort [N] | gloo-cuda")
