"""A plain DDP script shaped like PyTorch's DDP tutorial (an epoch loop,
a DataLoader over a DistributedSampler, set_epoch, rank 0's snapshot of
the model and the epochs run, loaded at start): run it with torchrun,
`torchrun --nproc_per_node 2 train.py`. train_elastic.py is this script on
etjob.elastic; docs/worker-library.md shows the diff."""

import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group, get_rank, get_world_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datautils import args, load_train_objs, log, report, save  # noqa: E402


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        self.steps = 0
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, path):
        snapshot = torch.load(path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run, self.steps = snapshot["EPOCHS_RUN"], snapshot["STEPS"]
        print("resuming from the snapshot at epoch %d" % self.epochs_run, flush=True)

    def _run_batch(self, epoch, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        log(self.steps, epoch, get_rank(), get_world_size(), loss.item())

    def _run_epoch(self, epoch):
        batch = len(next(iter(self.train_data))[0])
        print("[rank %d] epoch %d | batch %d | steps %d" % (get_rank(), epoch, batch, len(self.train_data)), flush=True)
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(epoch, source, targets)

    def _save_snapshot(self, epoch):
        save({"MODEL_STATE": self.model.module.state_dict(), "OPTIMIZER_STATE": self.optimizer.state_dict(),
              "EPOCHS_RUN": epoch + 1, "STEPS": self.steps}, self.snapshot_path)
        print("epoch %d | snapshot saved at %s" % (epoch, self.snapshot_path), flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if get_rank() == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch)


def prepare_dataloader(dataset, batch_size, workers):
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset),
                      num_workers=workers)


def main():
    a = args()
    init_process_group(backend="gloo")
    dataset, model, optimizer = load_train_objs(a)
    train_data = prepare_dataloader(dataset, a.batch_size, a.loader_workers)
    trainer = Trainer(model, train_data, optimizer, a.save_every, a.snapshot)
    trainer.train(a.epochs)
    if get_rank() == 0:
        report(trainer.model.module, trainer.steps, train_data.sampler)
    destroy_process_group()


if __name__ == "__main__":
    main()
