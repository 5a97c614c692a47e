"""The digits example with in-process recovery (etjob.elastic): survivors
never restart.

Runs as the worker command itself, one rank per pod, without torchrun:
`python3 /opt/etjob/examples/digits/train_elastic.py`. The model, data,
augmentation and learning-rate schedule are train.py's, so both compute the
same model; what differs is how a membership change is survived
(docs/worker-library.md):

* the state (model, optimizer, sampler ledger, step) is committed in memory
  after every step (`state.commit()`);
* a dead or frozen peer fails the step's gradient all-reduce: every rank rolls
  back to its last commit and the survivors go on in a new process group,
  in the same processes;
* a leave (a notice, a scale-in) and a join take effect at a commit; a joiner
  gets the state by broadcast;
* rank 0 still checkpoints to $ETJOB_CHECKPOINT_DIR every --checkpoint-every
  steps, for a stop below min and the loss of the whole job.

Lines as train.py's (`step=S epoch=E rank=R world=W loss=L t=T`, with the pid
and generation after them), so that the tests read both alike.
"""

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import etjob.elastic as elastic  # noqa: E402
import etjob.torch as etorch  # noqa: E402
from train import Net, augment, dataset, evaluate, log, lr_schedule, parse_args  # noqa: E402


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    (xtr, ytr), test = dataset(args.seed)
    sampler = etorch.ElasticSampler(len(ytr), args.global_batch, seed=args.seed)
    total = sampler.steps_per_epoch * args.epochs
    lr_at = lr_schedule(args.lr, total)
    model = Net(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, step=0)
    state.load_checkpoint(args.checkpoint_dir)
    # The throughput since the last checkpoint at one world size.
    pace = {"since": time.time(), "steps": 0, "world": 0}

    def checkpoint(final=False):
        # Rank 0 saves the last commit in the background (training goes on;
        # a save is skipped while the previous one is still being written)
        # and reports it once it landed; the last one is written before the
        # run ends.
        step, world = state.step, pace["world"]
        took = time.time() - pace["since"]
        sps = pace["steps"] * args.global_batch / took if took > 0 else 0.0

        def landed(path, seconds):
            log("checkpoint step=%d" % step)
            elastic.supervisor().report_progress(step, step, os.path.relpath(path, args.checkpoint_dir), seconds, sps, world)

        if final:
            state.flush()
            began = time.time()
            path = state.checkpoint(args.checkpoint_dir)
            if path is not None:
                landed(path, time.time() - began)
        elif not state.checkpoint_async(args.checkpoint_dir, done=landed):
            return
        pace.update(since=time.time(), steps=0)

    @elastic.run
    def train(state):
        while state.step < total:
            rank, world, step = state.rank, state.world, state.step
            if world != pace["world"]:
                pace.update(since=time.time(), steps=0, world=world)
            gen = torch.Generator().manual_seed(args.seed * 1000003 + step)
            whole = state.sampler.global_batch_indices()
            x, y = etorch.shard(augment(xtr[whole], gen), rank, world), etorch.shard(ytr[whole], rank, world)
            loss_sum = F.cross_entropy(model(x), y, reduction="sum")
            opt.zero_grad()
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            # the gradients summed over the ranks are the global batch's mean
            (loss_sum / args.global_batch).backward()
            elastic.allreduce_gradients(model)
            opt.step()
            state.sampler.commit()
            state.step = step + 1
            pace["steps"] += 1
            log("step=%d epoch=%d rank=%d world=%d loss=%.4f pid=%d gen=%d" % (
                state.step, state.sampler.epoch, rank, world, loss_sum.item() / max(len(y), 1), os.getpid(), state.generation))
            state.commit()
            if rank == 0 and (state.step % args.checkpoint_every == 0 or state.step == total or state.checkpoint_wanted):
                checkpoint(final=state.step == total)

    train(state)
    if state.rank == 0:
        problems = etorch.check_ledger(state.sampler.ledger, len(ytr), args.global_batch)
        log("ledger ok" if not problems else "ledger problems=%s" % "; ".join(problems))
        log("final accuracy=%.4f steps=%d" % (evaluate(model, test), state.step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
