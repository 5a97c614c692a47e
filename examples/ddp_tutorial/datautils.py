"""What examples/ddp_tutorial's two scripts share: the data set, the model,
the command line and the lines they print. train.py is a plain DDP script
shaped like PyTorch's DDP tutorial (an epoch loop over a DataLoader with a
DistributedSampler, set_epoch, a snapshot saved by rank 0 and loaded at
start); train_elastic.py is the same script on etjob.elastic."""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


class Blobs(Dataset):
    """n points of 20 features in 4 classes, each class a noisy centre: a
    fixed set (the training set, or the held-out one, drawn apart)."""

    def __init__(self, n, held_out=False):
        centres = torch.randn(4, 20, generator=torch.Generator().manual_seed(1)) * 0.5
        g = torch.Generator().manual_seed(3 if held_out else 2)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.x = centres[self.y] + 1.5 * torch.randn(n, 20, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if STEP_SLEEP[0]:
            time.sleep(STEP_SLEEP[0])  # a slower input pipeline (a test's pace), paid in the DataLoader's workers
        return self.x[i], self.y[i]


STEP_SLEEP = [0.0]


def load_train_objs(a):
    """The data set, the model and its optimizer (the tutorial's)."""
    torch.manual_seed(a.seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return Blobs(a.samples), model, torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)


def args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", "6")))
    p.add_argument("--batch-size", type=int, default=16, help="a rank's batch at the job's size (the DataLoader's)")
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=1, help="epochs between two snapshots")
    p.add_argument("--snapshot", default=os.path.join(os.environ.get("ETJOB_CHECKPOINT_DIR", "."), "snapshot.pt"))
    p.add_argument("--loader-workers", type=int, default=2)
    p.add_argument("--sample-sleep", type=float, default=float(os.environ.get("SAMPLE_SLEEP", "0")),
                   help="seconds each sample takes to load (a test's pace)")
    p.add_argument("--float64", action="store_true",
                   help="train in float64: a run whose world size changed then ends with the same model as an "
                        "undisturbed one to ~1e-12 (in float32 a ReLU whose input rounds to either side of 0 can "
                        "send the two apart by ~1e-4)")
    a = p.parse_args(argv)
    STEP_SLEEP[0] = a.sample_sleep
    torch.set_num_threads(1)
    if a.float64:
        torch.set_default_dtype(torch.float64)  # the data set and the model made after this
    return a


def log(step, epoch, rank, world, loss):
    """One line a step, as the e2e tests read them (with the process and,
    on etjob.elastic, the generation)."""
    elastic = sys.modules.get("etjob.elastic")
    gen = elastic._ctx.group.gen if elastic is not None and elastic._ctx is not None and elastic._ctx.group else 0
    print("step=%d epoch=%d rank=%d world=%d loss=%.4f pid=%d gen=%d t=%.3f" % (
        step, epoch, rank, world, loss, os.getpid(), gen, time.time()), flush=True)


def save(snapshot, path):
    """The tutorial's snapshot, written whole or not at all (a rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(snapshot, path + ".tmp")
    os.replace(path + ".tmp", path)


def report(model, steps, sampler):
    """Rank 0's last lines: the sampler's ledger (etjob.elastic's has one),
    the held-out accuracy and loss."""
    if hasattr(sampler, "problems"):
        problems = sampler.problems()
        print("ledger %s t=%.3f" % ("ok" if not problems else "problems=" + "; ".join(problems), time.time()), flush=True)
    held = Blobs(1024, held_out=True)
    with torch.no_grad():
        out = model(held.x)
        acc = (out.argmax(1) == held.y).float().mean().item()
        loss = F.cross_entropy(out, held.y).item()
    print("final accuracy=%.4f steps=%d t=%.3f" % (acc, steps, time.time()), flush=True)
    print("final loss=%.6f" % loss, flush=True)
