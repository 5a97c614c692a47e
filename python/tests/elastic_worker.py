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
FAIL_PART_ONCE=NAME: the worker of that ETJOB_POD_NAME fails its first part of a
sharded checkpoint (a disk that was full for a moment).
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
the same step lines, the same final model.
Script shapes users bring (the vote API): SCHED=1 a StepLR over the etjob
Optimizer, registered, stepped when opt.step() returns True
(SCHED=unregistered: over the wrapped optimizer, not registered);
SCALER=1 a GradScaler (torch.amp's on CPU; on torch 1.13, which has none
for the CPU, FakeGradScaler below: a named fake), registered;
ZERO_AFTER=1 gradients zeroed after a step that stepped, not before each
(with FAIL_LAST_BUCKET_AT=S every rank's last DDP bucket fails once at step
S, the others completing: two buckets a step, one parameter each). These
print `extras lr=... scale=...` before `done`. PLANT_AT=S makes rank 1 add
1e-6 to its weights after step S, once: a divergence for the replica check
to find (small enough that the averaged gradients it shapes until then
leave the model within the tests' tolerance). PLANT=1 gives the model a
buffer that only rank 1 changes, every step (as BatchNorm's running
statistics differ between ranks): no divergence. EAGER=1
calls init_process_group before anything else and prints `setup rank=R
world=W`: what rank-0-only setup would see. HVD_STATE=1 (the `run` API):
Horovod's state shape, State(model, optimizer, sampler, epoch=0, batch=0)
with no step; SEED seeds this rank's model (a joiner with another seed
starts from other weights). DROPOUT=1 drops 30 % of the inputs (both APIs):
a step that depends on torch's random stream."""

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


def dropout(t):
    """DROPOUT=1: a dropout of the inputs (the step then depends on torch's
    random stream, which a retried step must draw again as it was)."""
    return torch.nn.functional.dropout(t, 0.3) if os.environ.get("DROPOUT") == "1" else t


def run_step(model, opt, state, x, y, batch, pause):
    """One step of the `run` API's loop: this rank's share of the global
    batch, the gradients summed over the generation, the step, the batch
    committed to the sampler's ledger."""
    idx = state.sampler.batch(state.rank, state.world)
    opt.zero_grad()
    loss = ((model(dropout(x[idx])).squeeze(1) - y[idx]) ** 2).sum() / batch
    loss.backward()
    time.sleep(pause)
    elastic.allreduce_gradients(model)
    opt.step()
    state.sampler.commit()


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
    torch.manual_seed(int(os.environ.get("SEED", "0")))
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
    if os.environ.get("FAIL_PART_ONCE") == os.environ.get("ETJOB_POD_NAME"):
        save_part = etorch.save_part
        failed = []

        def failing(directory, name, state):
            if not failed:
                failed.append(name)
                raise etorch.CheckpointError(28, "no space left (FAIL_PART_ONCE)")
            return save_part(directory, name, state)

        etorch.save_part = failing
    end_every = int(os.environ.get("END_EVERY", "0"))  # rank 0 ends its generation every that many steps
    gens = {"last": 0}
    background = os.environ.get("CHECKPOINT_ASYNC") == "1"
    every = int(os.environ.get("CHECKPOINT_EVERY", "25"))  # 0: only the library's own (a stop below min)
    if os.environ.get("API") == "vote":
        return vote(model, opt, sampler, x, y, batch, total, pause, ckdir, every, background)
    if os.environ.get("HVD_STATE") == "1":
        return horovod_state(model, opt, sampler, x, y, batch, total, pause)
    if ckdir:
        state.load_checkpoint(ckdir)
    plant = {"at": int(os.environ.get("PLANT_AT", "-1"))}

    @elastic.run
    def train(state):
        while state.step < total:
            run_step(model, opt, state, x, y, batch, pause)
            state.step += 1
            # logged before the commit: a commit at which the membership
            # changes does not return
            sys.stdout.write("step=%d rank=%d world=%d gen=%d pid=%d t=%.3f\n" % (
                state.step, state.rank, state.world, state.generation, os.getpid(), time.time()))
            sys.stdout.flush()
            state.commit()
            if state.step == plant["at"] and state.rank == 1:
                plant["at"] = -1
                with torch.no_grad():
                    model.weight.add_(1e-6)
                sys.stderr.write("planted a divergence after step %d\n" % state.step)
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


class FakeGradScaler:
    """A named fake of torch.amp.GradScaler for torch 1.13, which has no
    GradScaler for the CPU: the same surface and the same state (a scale
    that grows by 2 every growth_interval steps without an overflow), and
    step() calls the optimizer's step() as torch's does (from a method of
    the scaler, which is how etjob.elastic finds a scaler that steps it)."""

    def __init__(self, init_scale=2.0 ** 10, growth_interval=10):
        self.scale_, self.growth_interval, self.tracker = init_scale, growth_interval, 0

    def scale(self, loss):
        return loss * self.scale_

    def unscale_(self, optimizer):
        for g in optimizer.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad.div_(self.scale_)

    def step(self, optimizer):
        self.unscale_(optimizer)
        return self._maybe_opt_step(optimizer)

    def _maybe_opt_step(self, optimizer):
        return optimizer.step()

    def update(self):
        self.tracker += 1
        if self.tracker == self.growth_interval:
            self.scale_, self.tracker = self.scale_ * 2, 0

    def get_scale(self):
        return self.scale_

    def state_dict(self):
        return {"scale": self.scale_, "growth_tracker": self.tracker}

    def load_state_dict(self, sd):
        self.scale_, self.tracker = sd["scale"], sd["growth_tracker"]


def grad_scaler():
    """torch.amp's GradScaler on the CPU where this torch has one (2.x),
    else the named fake."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=10)
    return FakeGradScaler()


def fail_last_bucket_at(step):
    """Every rank's last DDP bucket fails once, at the step `step` (the
    first completed: its gradients are in), as a lost peer would make it."""
    from etjob import ddp

    hook, fired = ddp._Buckets.hook, []

    def failing(self, state, bucket):
        if bucket.is_last() and not fired and _step["now"] == step:
            fired.append(1)
            end = time.monotonic() + 10
            while self._pending and time.monotonic() < end:  # the first bucket's all-reduce completed
                time.sleep(0.001)
            self._fail("FAIL_LAST_BUCKET_AT=%d" % step, end=True)
            sys.stderr.write("fault: last bucket failed at step %d\n" % step)
        return hook(self, state, bucket)

    ddp._Buckets.hook = failing


_step = {"now": -1}


def vote(model, opt, sampler, x, y, batch, total, pause, ckdir, every, background):
    """The same training through DDP and the vote-then-step Optimizer
    (FAKE_NCCL=1: its buckets through the fake NCCL transport)."""
    if os.environ.get("FAKE_NCCL") == "1":
        import fake_nccl

        fake_nccl.install()
        elastic.init_process_group("fake-nccl")
    elif os.environ.get("EAGER") == "1":
        elastic.init_process_group("gloo")
    if os.environ.get("EAGER") == "1":
        print("setup rank=%d world=%d" % (elastic.get_rank(), elastic.get_world_size()), flush=True)
    zero_after = os.environ.get("ZERO_AFTER") == "1"
    kw = {}
    if zero_after:  # a bucket a parameter: the first completes, the last may fail
        import torch.distributed as dist

        dist._DEFAULT_FIRST_BUCKET_BYTES = 1
        kw["bucket_cap_mb"] = 1e-6
        if os.environ.get("FAIL_LAST_BUCKET_AT"):
            fail_last_bucket_at(int(os.environ["FAIL_LAST_BUCKET_AT"]))
    if os.environ.get("PLANT") == "1":
        model.register_buffer("planted", torch.zeros(4))
    plant_at = int(os.environ.get("PLANT_AT", "-1"))
    ddp = elastic.DistributedDataParallel(model, **kw)
    inner = opt
    opt = elastic.Optimizer(opt, ddp, sampler=sampler)
    sched = scaler = None
    if os.environ.get("SCHED") == "1":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
        opt.register(scheduler=sched)
    elif os.environ.get("SCHED") == "unregistered":
        sched = torch.optim.lr_scheduler.StepLR(inner, step_size=20, gamma=0.5)
    if os.environ.get("SCALER") == "1":
        scaler = grad_scaler()
        opt.register(scaler=scaler)
    if ckdir:
        opt.load_checkpoint(ckdir)
    for step in opt.steps(total):
        _step["now"] = step
        rank, world = elastic.rank(), elastic.size()
        idx = sampler.batch(rank, world)
        if not zero_after:
            opt.zero_grad()
        # DDP averages over the ranks: each rank's share of the global
        # batch's sum, times the world, is the run API's gradient
        # ACCUM=k: k backward passes a step, on parts of the batch (the
        # vote then goes with the last part's buckets and once more in step())
        for part in torch.as_tensor(idx).chunk(int(os.environ.get("ACCUM", "1"))):
            loss = ((ddp(dropout(x[part])).squeeze(1) - y[part]) ** 2).sum() * world / batch
            (scaler.scale(loss) if scaler is not None else loss).backward()
        time.sleep(pause)
        if scaler is not None:
            stepped = scaler.step(opt)
            scaler.update()
        else:
            stepped = opt.step()
        if not stepped:
            continue
        if sched is not None:
            sched.step()
        if zero_after:
            opt.zero_grad()
        if rank == 1 and os.environ.get("PLANT") == "1":
            model.planted += 1  # a buffer of this rank's own
        if step + 1 == plant_at and rank == 1:
            plant_at = -1
            with torch.no_grad():
                model.weight.add_(1e-6)
            sys.stderr.write("planted a divergence after step %d\n" % (step + 1))
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
    print("extras lr=%.8f scale=%s" % (opt.param_groups[0]["lr"], scaler.get_scale() if scaler is not None else "-"), flush=True)
    print("done step=%d pid=%d weight=%s" % (opt.step_count, os.getpid(), ",".join("%.6f" % v for v in w)), flush=True)


def horovod_state(model, opt, sampler, x, y, batch, total, pause):
    """Horovod's state shape on the run API: epoch and batch, no step (the
    library counts the commits). The same updates as main's loop."""
    per_epoch = 12
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, epoch=0, batch=0)

    @elastic.run
    def train(state):
        while state.epoch * per_epoch + state.batch < total:
            run_step(model, opt, state, x, y, batch, pause)
            state.batch += 1
            if state.batch == per_epoch:
                state.epoch, state.batch = state.epoch + 1, 0
            sys.stdout.write("step=%d rank=%d world=%d gen=%d pid=%d t=%.3f\n" % (
                state.epoch * per_epoch + state.batch, state.rank, state.world, state.generation, os.getpid(), time.time()))
            sys.stdout.flush()
            state.commit()

    train(state)
    problems = etorch.check_ledger(state.sampler.ledger, len(y), batch)
    print("ledger ok" if not problems else "ledger problems=%s" % "; ".join(problems), flush=True)
    w = model.weight.detach().reshape(-1).tolist()
    print("done step=%d pid=%d weight=%s" % (state.epoch * per_epoch + state.batch, os.getpid(), ",".join("%.6f" % v for v in w)), flush=True)


if __name__ == "__main__":
    main()
