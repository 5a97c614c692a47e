"""A worker of the etjob.elastic tests: a small linear model trained on a
fixed synthetic set with ElasticSampler, one line per committed step:
`step=S rank=R world=W gen=G pid=P t=T`, and at the end `ledger ok` (or its
problems) and `done step=S weight=...`. STEP_SLEEP adds seconds of "work"
per step so that the tests can hit a step at will; SAVE_SECONDS paces every
checkpoint write (storage slower than a collective may take), SAVE_MBPS
paces it to that many MB/s of the state's bytes (network storage; the bytes
are written for real as well),
CHECKPOINT_EVERY (25; 0: none) spaces rank 0's periodic checkpoints, and
CHECKPOINT_ASYNC=1 saves them in the background; STATE_MB adds that many MB
of state (a buffer of the model) to every commit, sync and checkpoint.
HOLD_FILE=PATH: print `held` once torch is imported and wait until PATH
exists before anything else (a joiner that arrives when the test says).
FAULT_AT=ACTION:REGEX[:add] (the rendezvous' crash-point tests) kills
(ACTION kill) or freezes (stop) this rank right after a rendezvous store call
on a key matching REGEX (with a non-zero delta, with :add) returns, once in the
whole job, once the test armed it (the store's `fault-armed` above 0).
END_EVERY=K: rank 0 ends its generation every K steps (as a failure would)
and prints `resources gen=G threads=T fds=F rss_mb=M` at each new one.
API=vote (FAKE_NCCL=1: with tests/fake_nccl.py's transport) trains the same model through etjob.elastic.DistributedDataParallel
and Optimizer (torch's DDP, vote then step) instead of `run` and State:
the same step lines, the same final model."""

import faulthandler
import os
import re
import signal
import sys
import time

import torch

import etjob.elastic as elastic
import etjob.torch as etorch
from etjob import stateio


def inject_fault(spec):
    """inject_fault wraps the rendezvous' store calls (Context._count) so
    that the first rank of the job whose call matches spec dies or freezes
    between that call and the next."""
    action, pattern, *rest = spec.split(":")
    rx, adds_only = re.compile(pattern), "add" in rest
    count = elastic.Context._count

    def faulty(self, key, delta=0):
        got = count(self, key, delta)
        if rx.search(key) and (delta or not adds_only) and int(self.store.add("fault-armed", 0)) > 0 and \
                int(self.store.add("fault-fired", 1)) == 1:
            sys.stderr.write("fault: %s after %s %+d t=%.3f\n" % (action, key, delta, time.time()))
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        return got

    elastic.Context._count = faulty


def resources():
    """This process's threads, open file descriptors and resident MB."""
    with open("/proc/self/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd")), rss / 1024.0


def main():
    faulthandler.enable()  # a crash prints its thread's stack first (the test's report shows it whole)
    faulthandler.register(signal.SIGUSR1)
    hold = os.environ.get("HOLD_FILE")
    if hold:  # torch imported: print `held` and wait for the test's go
        print("held", flush=True)
        while not os.path.exists(hold):
            time.sleep(0.02)
    if os.environ.get("FAULT_AT"):
        inject_fault(os.environ["FAULT_AT"])
    total = int(os.environ.get("STEPS", "120"))
    pause = float(os.environ.get("STEP_SLEEP", "0.02"))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n, batch = 96, 8
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
    model = torch.nn.Linear(4, 1)
    mb = int(os.environ.get("STATE_MB", "0"))
    if mb:  # state at a size users train (a buffer of the model: committed, synced, checkpointed)
        model.register_buffer("blob", torch.zeros(mb * 2**20 // 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = etorch.ElasticSampler(n, batch, seed=3)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, step=0)
    ckdir = os.environ.get("ETJOB_CHECKPOINT_DIR")
    slow = float(os.environ.get("SAVE_SECONDS", "0"))
    rate = float(os.environ.get("SAVE_MBPS", "0")) * 1e6
    if slow or rate:
        save = etorch.save_checkpoint

        def paced(directory, state, *args, **kwargs):
            nbytes = stateio.flatten(state)[0]["nbytes"] if rate else 0
            time.sleep(slow + (nbytes / rate if rate else 0))
            return save(directory, state, *args, **kwargs)

        etorch.save_checkpoint = paced
    end_every = int(os.environ.get("END_EVERY", "0"))  # rank 0 ends its generation every that many steps
    gens = {"last": 0}
    background = os.environ.get("CHECKPOINT_ASYNC") == "1"
    every = int(os.environ.get("CHECKPOINT_EVERY", "25"))  # 0: only the library's own (a stop below min)
    if os.environ.get("API") == "vote":
        return vote(model, opt, sampler, x, y, batch, total, pause, ckdir, every, background)
    if ckdir:
        state.load_checkpoint(ckdir)

    @elastic.run
    def train(state):
        while state.step < total:
            idx = state.sampler.batch(state.rank, state.world)
            opt.zero_grad()
            loss = ((model(x[idx]).squeeze(1) - y[idx]) ** 2).sum() / batch
            loss.backward()
            time.sleep(pause)
            elastic.allreduce_gradients(model)
            opt.step()
            state.sampler.commit()
            state.step += 1
            # logged before the commit: a commit at which the membership
            # changes does not return
            sys.stdout.write("step=%d rank=%d world=%d gen=%d pid=%d t=%.3f\n" % (
                state.step, state.rank, state.world, state.generation, os.getpid(), time.time()))
            sys.stdout.flush()
            state.commit()
            if end_every and state.rank == 0:
                if state.generation != gens["last"]:
                    gens["last"] = state.generation
                    print("resources gen=%d threads=%d fds=%d rss_mb=%.1f" % ((state.generation,) + resources()), flush=True)
                if state.step % end_every == 0:
                    # as a failure would: the others' next collective fails, all roll back
                    elastic._context().end(state.generation, "END_EVERY")
            if ckdir and every and state.rank == 0 and state.step % every == 0:
                if background:
                    state.checkpoint_async(ckdir, done=lambda path, took: print(
                        "checkpoint %s in %.1f s" % (os.path.basename(path), took), flush=True))
                else:
                    state.checkpoint(ckdir)

    train(state)
    problems = etorch.check_ledger(state.sampler.ledger, n, batch)
    print("ledger ok" if not problems else "ledger problems=%s" % "; ".join(problems), flush=True)
    w = model.weight.detach().reshape(-1).tolist()
    print("done step=%d pid=%d weight=%s" % (state.step, os.getpid(), ",".join("%.6f" % v for v in w)), flush=True)


def vote(model, opt, sampler, x, y, batch, total, pause, ckdir, every, background):
    """The same training through DDP and the vote-then-step Optimizer
    (FAKE_NCCL=1: its buckets through the fake NCCL transport)."""
    if os.environ.get("FAKE_NCCL") == "1":
        import fake_nccl

        fake_nccl.install()
        elastic.init_process_group("fake-nccl")
    ddp = elastic.DistributedDataParallel(model)
    opt = elastic.Optimizer(opt, ddp, sampler=sampler)
    if ckdir:
        opt.load_checkpoint(ckdir)
    for step in opt.steps(total):
        rank, world = elastic.rank(), elastic.size()
        idx = sampler.batch(rank, world)
        opt.zero_grad()
        # DDP averages over the ranks: each rank's share of the global
        # batch's sum, times the world, is the run API's gradient
        # ACCUM=k: k backward passes a step, on parts of the batch (the
        # vote then goes with the last part's buckets and once more in step())
        for part in torch.as_tensor(idx).chunk(int(os.environ.get("ACCUM", "1"))):
            loss = ((ddp(x[part]).squeeze(1) - y[part]) ** 2).sum() * world / batch
            loss.backward()
        time.sleep(pause)
        if not opt.step():
            continue
        sys.stdout.write("step=%d rank=%d world=%d gen=%d pid=%d t=%.3f\n" % (
            step + 1, rank, world, elastic._ctx.group.gen if elastic._ctx.group else 0, os.getpid(), time.time()))
        sys.stdout.flush()
        if ckdir and every and elastic.rank() == 0 and (step + 1) % every == 0:
            if background:
                opt.checkpoint_async(ckdir, done=lambda path, took: print(
                    "checkpoint %s in %.1f s" % (os.path.basename(path), took), flush=True))
            else:
                opt.checkpoint(ckdir)
    problems = etorch.check_ledger(sampler.ledger, len(y), batch)
    print("ledger ok" if not problems else "ledger problems=%s" % "; ".join(problems), flush=True)
    w = model.weight.detach().reshape(-1).tolist()
    print("votes late=%d" % opt._late_votes, flush=True)
    print("done step=%d pid=%d weight=%s" % (opt.step_count, os.getpid(), ",".join("%.6f" % v for v in w)), flush=True)


if __name__ == "__main__":
    main()
