"""A small GPT trained with plain torch DDP (gloo), one rank per process
under torchrun: the script etjob.elastic's version (train_elastic.py) and
torchft's (train_torchft.py) are compared with. The model and data are in
gpt.py."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT, args, batch, corpus, evaluate, load, log, lr_at, save  # noqa: E402


def main():
    a = args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    data = corpus()
    dist.init_process_group("gloo")
    model = DDP(GPT(a))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    start = load(a.checkpoint_dir, model.module, opt)
    for step in range(start, a.steps):
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = batch(data, a, step, rank, world)
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log(step + 1, rank, world, loss)
        if rank == 0 and (step + 1) % a.checkpoint_every == 0:
            save(a.checkpoint_dir, model.module, opt, step + 1)
    if dist.get_rank() == 0:
        print("final loss=%.4f steps=%d" % (evaluate(model.module, data, a), a.steps), flush=True)


if __name__ == "__main__":
    main()
