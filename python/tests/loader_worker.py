"""A worker of the etjob.elastic tests shaped like PyTorch's DDP tutorial:
an epoch loop over etjob.elastic.DataLoader (a map-style dataset, an
etjob.elastic.DistributedSampler, set_epoch, LOADER_WORKERS worker
processes, 2 by default), a peek at one batch before set_epoch as the
tutorial does to print its size, one opt.step() a batch, and the loss the
mean over the rank's batch. The same lines as elastic_worker.py: `step=S
rank=R world=W gen=G pid=P t=T` for each committed step, then `ledger ok`
and `done step=S weight=...`; and for each committed step `seen epoch=E
step=S rank=R world=W idx=I,... workers=K,...`: the samples this rank
trained and the DataLoader workers that loaded them (-1: the main
process). STEPS (a multiple of 12) is the run's length: 96 samples, a
batch of 4 a rank made for 2 ranks (a global batch of 8, 12 steps an
epoch). STEP_SLEEP, SEED, HOLD_FILE as elastic_worker.py's. A joiner's
loop starts at epoch 0 and catches up with the others' epoch."""

import faulthandler
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import etjob.elastic as elastic
from etjob.elastic import DataLoader, DistributedSampler


class Samples(torch.utils.data.Dataset):
    """A fixed synthetic regression set: (x, y, index, the loading worker)."""

    def __init__(self, n):
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return self.x[i], self.y[i], i, -1 if info is None else info.id


def main():
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1)
    hold = os.environ.get("HOLD_FILE")
    if hold:
        print("held", flush=True)
        while not os.path.exists(hold):
            time.sleep(0.02)
    pause = float(os.environ.get("STEP_SLEEP", "0.02"))
    torch.manual_seed(int(os.environ.get("SEED", "0")))
    torch.set_num_threads(1)
    elastic.init_process_group("gloo")
    data = Samples(96)
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, seed=3),
                        num_workers=int(os.environ.get("LOADER_WORKERS", "2")))
    epochs = int(os.environ.get("STEPS", "120")) // len(loader)
    model = elastic.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = elastic.Optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
    for epoch in range(epochs):
        size = len(next(iter(loader))[0])  # the tutorial's peek at a batch, before set_epoch
        sys.stderr.write("epoch %d batch %d steps %d\n" % (epoch, size, len(loader)))
        loader.sampler.set_epoch(epoch)
        for x, y, idx, wid in loader:
            opt.zero_grad()
            loss = F.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            time.sleep(pause)
            if not opt.step():
                continue
            rank, world, gen = elastic.get_rank(), elastic.get_world_size(), elastic._ctx.group.gen
            print("seen epoch=%d step=%d rank=%d world=%d idx=%s workers=%s" % (
                epoch, opt.step_count, rank, world, ",".join(map(str, idx.tolist())),
                ",".join(map(str, wid.tolist()))), flush=True)
            print("step=%d rank=%d world=%d gen=%d pid=%d t=%.3f" % (
                opt.step_count, rank, world, gen, os.getpid(), time.time()), flush=True)
    elastic.destroy_process_group()
    problems = loader.sampler.problems()
    print("ledger ok" if not problems else "ledger problems=%s" % "; ".join(problems), flush=True)
    w = model.module.weight.detach().reshape(-1).tolist() + model.module.bias.detach().tolist()
    print("done step=%d pid=%d weight=%s" % (opt.step_count, os.getpid(), ",".join("%.6f" % v for v in w)), flush=True)


if __name__ == "__main__":
    main()
