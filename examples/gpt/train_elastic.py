"""A small GPT trained with etjob.elastic: train.py (plain torch DDP) with
7 lines changed (docs/worker-library.md shows the diff). One rank per pod,
run as the worker command itself, without torchrun; survivors never restart.
The model and data are in gpt.py."""

import os
import sys

import torch
import etjob.elastic as dist  # torch.distributed's names, in-process recovery
from etjob.elastic import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT, args, batch, corpus, evaluate, load, log, lr_at, save  # noqa: E402


def main():
    a = args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    data = corpus()
    dist.init_process_group("gloo")
    model = DDP(GPT(a))
    opt = dist.Optimizer(torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1), model)
    opt.load_checkpoint(a.checkpoint_dir)
    for step in opt.steps(a.steps):
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = batch(data, a, step, rank, world)
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        if not opt.step():  # the ranks did not all agree: this step comes again
            continue
        log(step + 1, rank, world, loss)
        if rank == 0 and (step + 1) % a.checkpoint_every == 0:
            opt.checkpoint_async(a.checkpoint_dir)
    if dist.get_rank() == 0:
        print("final loss=%.4f steps=%d" % (evaluate(model.module, data, a), a.steps), flush=True)


if __name__ == "__main__":
    main()
