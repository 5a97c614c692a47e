"""GPU checks of etjob.elastic's data path, for a machine with one GPU (run
by hack/gpu-check.sh; no test depends on it: the project's CI machines have
no GPU).

    python3 hack/gpu_check.py nccl-abort [N]    # etjob's NCCL transport: N world-1 communicators, each aborted
    python3 hack/gpu_check.py gloo-cuda         # 4 ranks, DDP on CUDA tensors over gloo, a hard kill
    python3 hack/gpu_check.py nccl-ddp          # etjob.elastic's DDP with init_process_group("nccl"), world 1
    python3 hack/gpu_check.py state-gb [GB]     # a GB-sized CUDA state: commit, async checkpoint, load

nccl-abort: etjob.ddp's NCCL transport makes a world-1 communicator (NCCL
refuses two ranks of one communicator on one GPU) the way a generation does,
runs an all-reduce whose completion is polled (is_completed: NCCL's wait()
returns at enqueue), and releases it (abort), N times;
torch.cuda.memory_allocated and the device's used memory
(torch.cuda.mem_get_info) are printed every 10 and must stay flat (within
64 MiB of group 10's).

gloo-cuda: 4 processes train a small model with etjob.elastic's
DistributedDataParallel on CUDA tensors through gloo (the model on the GPU;
the buckets cross gloo), one is SIGKILLed once the four train together (from step 30), the others go on in
process to the end. Passes when the three survivors finish with equal
weights.

nccl-ddp: one process trains the same model with the buckets on NCCL, then
on gloo: both reach the end, with the same weights.

state-gb: an etjob.elastic State holding a model of GB gigabytes on the
GPU: commit() (a copy on the GPU), checkpoint_async (how long the training
loop is held, and the save's own seconds), load_checkpoint into the zeroed
model; passes when the weights come back bit for bit.

GPU_CHECK_DEVICE=cpu runs gloo-cuda, nccl-ddp (gloo only) and state-gb on
the CPU: the harness's own check, on a machine without a GPU.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")


def used():
    free, total = torch.cuda.mem_get_info()
    return torch.cuda.memory_allocated(), total - free


class _Gen:
    """the parts of a generation etjob.ddp's transport reads"""

    def __init__(self, gen):
        self.gen, self.rank, self.size = gen, 0, 1


class _Ctx:
    """the parts of etjob.generations.Context the transport reads: a key
    prefix, a store client and the collective timeout"""

    collective_timeout = 300

    def __init__(self, store):
        self.store = store

    def _k(self, key):
        return "gpu-check/" + key

    def _client(self):
        return self.store


def nccl_abort(n):
    from etjob import ddp

    torch.cuda.set_device(0)
    ddp.use("nccl")
    transport = ddp._transport["now"]
    ctx = _Ctx(dist.HashStore())
    first = None
    began = time.monotonic()
    for i in range(n):
        pg = transport.group(ctx, _Gen(i))
        t = torch.full((1 << 20,), float(i), device="cuda")
        work = pg.allreduce([t])
        end = time.monotonic() + 30
        while not work.is_completed():
            if time.monotonic() > end:
                sys.exit("nccl-abort: all-reduce %d not completed in 30 s" % i)
            time.sleep(0.001)
        if float(t[0]) != float(i):
            sys.exit("nccl-abort: all-reduce %d gave %s" % (i, float(t[0])))
        transport.release(pg, i)
        del pg, t, work
        if i == 10:
            first = used()
        if i % 10 == 0 or i == n - 1:
            alloc, dev = used()
            print("nccl-abort %d: allocated %.1f MiB, device used %.1f MiB" % (i, alloc / 2**20, dev / 2**20), flush=True)
    alloc, dev = used()
    grew = (dev - first[1]) / 2**20
    print("nccl-abort: %d communicators in %.1f s; device memory grew %.1f MiB from group 10 to group %d" % (
        n, time.monotonic() - began, grew, n), flush=True)
    if grew > 64:
        sys.exit("nccl-abort: GPU memory leaked (%.1f MiB over %d groups)" % (grew, n - 10))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(n, backend="gloo", nnodes=None):
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), ETJOB_RDZV_ENDPOINT="127.0.0.1:%d" % port,
               PET_NNODES=nnodes or "%d:%d" % (n, n), PET_RDZV_ID="gpu", GPU_CHECK_BACKEND=backend)
    env.pop("ETJOB_AGENT_ADDR", None)
    procs = [subprocess.Popen([sys.executable, __file__, "worker"], env=dict(env, ETJOB_POD_NAME="w%d" % i),
                              stdout=subprocess.PIPE, text=True) for i in range(n)]
    return store, procs


def final(lines):
    return next((l for l in lines if l.startswith("done ")), None)


def gloo_cuda():
    store, procs = start(4, nnodes="2:4")  # noqa: F841 - the store lives as long as the ranks
    began = time.monotonic()
    outs = {i: [] for i in range(4)}
    killed = False
    for line in procs[0].stdout:  # rank 0's lines as they come; w3 killed from step 30, once the 4 train
        outs[0].append(line.strip())
        if not killed and line.startswith("step=") and line.split()[2] == "world=4" and int(line.split()[0][5:]) >= 30:
            procs[3].send_signal(signal.SIGKILL)
            killed = True
    end = time.monotonic() + 120
    for i, p in enumerate(procs):
        out, _ = p.communicate(timeout=max(end - time.monotonic(), 1))
        outs[i] += out.splitlines()
    finals = [final(outs[i]) for i in range(3)]
    worlds = sorted({l.split("world=")[1] for l in outs[0] if l.startswith("step=")})
    print("gloo-cuda: %.1f s, worlds seen %s" % (time.monotonic() - began, ",".join(worlds)))
    print("\n".join(str(f) for f in finals), flush=True)
    if not killed or not {"3", "4"} <= set(worlds) or None in finals or len({f.split("weight=")[1] for f in finals}) != 1:
        sys.exit("gloo-cuda: the survivors did not finish alike (killed=%s)" % killed)


def nccl_ddp():
    got = {}
    for backend in (("nccl", "gloo") if DEVICE == "cuda" else ("gloo",)):
        began = time.monotonic()
        store, procs = start(1, backend)  # noqa: F841
        out, _ = procs[0].communicate(timeout=240)
        got[backend] = final(out.splitlines())
        print("nccl-ddp %s: %.1f s, %s" % (backend, time.monotonic() - began, got[backend]), flush=True)
        if procs[0].returncode != 0 or got[backend] is None:
            sys.exit("nccl-ddp: the %s run failed (exit %s)" % (backend, procs[0].returncode))
    if len(set(got.values())) != 1:
        sys.exit("nccl-ddp: nccl and gloo ended apart")


def worker():
    import etjob.elastic as elastic

    elastic.init_process_group(os.environ.get("GPU_CHECK_BACKEND", "gloo"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(DEVICE)
    ddp = elastic.DistributedDataParallel(model)
    opt = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.01), ddp)
    for step in opt.steps(200):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(24, 64, generator=g).to(DEVICE)
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


def state_gb(gb):
    from etjob.elastic import State

    n = 16
    per = int(gb * 2**30 / 4 / n)
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(per, device=DEVICE)) for _ in range(n)])
    sums = [float(p.detach().double().sum()) for p in model]
    d = tempfile.mkdtemp(prefix="gpu-check-state-")
    try:
        state = State(model=model, step=0)
        sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
        sync()
        t = time.monotonic()
        state.step = 1
        state.commit()
        sync()
        commit_s = time.monotonic() - t
        saved = {}
        t = time.monotonic()
        state.checkpoint_async(d, done=lambda path, s: saved.update(path=path, s=s))
        held_s = time.monotonic() - t
        state.flush()
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) / 2**30
        with torch.no_grad():
            for p in model:
                p.zero_()
        t = time.monotonic()
        state.load_checkpoint(d)
        sync()
        load_s = time.monotonic() - t
        ok = [float(p.detach().double().sum()) for p in model] == sums
        print("state-gb: %.2f GB on %s: commit %.3f s; checkpoint_async held the loop %.3f s, wrote %.2f GB in %.1f s; "
              "load_checkpoint %.1f s; weights back %s" % (gb, DEVICE, commit_s, held_s, size, saved.get("s", -1),
                                                           load_s, "bit for bit" if ok else "CHANGED"), flush=True)
        if not ok or "path" not in saved:
            sys.exit("state-gb: the checkpoint did not bring the weights back")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if DEVICE == "cuda" and not torch.cuda.is_available() and what != "worker":
        sys.exit("gpu_check.py: no GPU here (torch.cuda.is_available() is False; GPU_CHECK_DEVICE=cpu checks the harness)")
    if what == "nccl-abort":
        nccl_abort(int(sys.argv[2]) if len(sys.argv) > 2 else 100)
    elif what == "gloo-cuda":
        gloo_cuda()
    elif what == "nccl-ddp":
        nccl_ddp()
    elif what == "state-gb":
        state_gb(float(sys.argv[2]) if len(sys.argv) > 2 else 2)
    elif what == "worker":
        worker()
    else:
        sys.exit("usage: gpu_check.py nccl-abort [N] | gloo-cuda | nccl-ddp | state-gb [GB]")
