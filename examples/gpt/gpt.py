"""A small GPT (a decoder-only transformer) and its data, shared by the
scripts beside it: train.py (plain torch DDP under torchrun),
train_elastic.py (the same script on etjob.elastic) and train_torchft.py
(the same on torchft), which `make bench-torchft` runs side by side.

The text is the Python standard library's own sources (a pinned list of
files, read from the running interpreter's library and checked by their
SHA-256, so that every machine and both torches train on the same bytes),
modelled byte by byte (a vocabulary of 256). The last tenth is held out.
Runs on torch 1.13 and 2.x, on CPU (gloo).

A step's global batch is a pure function of the step (the seed and the
step pick the sequences): each rank takes its share, so a run resized
between steps computes what an undisturbed one does, and no sampler state
has to survive a failure. The learning rate, too, is a function of the step.
"""

import argparse
import hashlib
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The corpus: these files of the standard library, in this order. Their
# SHA-256 is Debian 12's Python 3.11.2 (both torches here run on it); on
# another Python, CORPUS_SHA256= accepts other bytes (said in the log).
FILES = ["textwrap.py", "string.py", "shlex.py", "fnmatch.py", "glob.py", "heapq.py", "bisect.py", "colorsys.py",
         "difflib.py", "fractions.py", "statistics.py", "json/decoder.py", "json/encoder.py", "calendar.py",
         "argparse.py"]
SHA256 = "812bb7264f5df5c2e72108e5fdbeac69badcb1d38063264d2aaf10b9ae595553"


def args(argv=None):
    p = argparse.ArgumentParser(description="A small GPT on the Python standard library's sources")
    env = os.environ.get
    p.add_argument("--steps", type=int, default=int(env("STEPS", "300")))
    p.add_argument("--batch", type=int, default=int(env("GLOBAL_BATCH", "12")),
                   help="sequences per step over all ranks (divisible by every world size used: 12 for 1-4)")
    p.add_argument("--block", type=int, default=int(env("BLOCK", "128")), help="tokens (bytes) per sequence")
    p.add_argument("--layers", type=int, default=int(env("LAYERS", "4")))
    p.add_argument("--heads", type=int, default=int(env("HEADS", "4")))
    p.add_argument("--embd", type=int, default=int(env("EMBD", "192")))
    p.add_argument("--lr", type=float, default=float(env("LR", "3e-3")))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=int(env("THREADS", "1")), help="torch threads per rank")
    p.add_argument("--checkpoint-dir", default=env("ETJOB_CHECKPOINT_DIR", "/tmp/etjob-gpt"))
    p.add_argument("--checkpoint-every", type=int, default=int(env("CHECKPOINT_EVERY", "100")))
    p.add_argument("--step-sleep", type=float, default=float(env("STEP_SLEEP", "0")),
                   help="seconds of waiting added to each step (a slower accelerator)")
    return p.parse_args(argv)


def corpus():
    """The corpus as a tensor of bytes (int64)."""
    lib = os.path.dirname(os.__file__)
    raw = b""
    for name in FILES:
        with open(os.path.join(lib, name), "rb") as f:
            raw += f.read()
    got = hashlib.sha256(raw).hexdigest()
    want = os.environ.get("CORPUS_SHA256", SHA256)
    if got != want:
        sys.exit("examples/gpt: the corpus (%s under %s) has SHA-256 %s, not %s: another Python %s; "
                 "set CORPUS_SHA256=%s to train on these bytes" % (", ".join(FILES), lib, got, want,
                                                                   sys.version.split()[0], got))
    return torch.tensor(list(raw), dtype=torch.int64)


class Block(nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(embd), nn.LayerNorm(embd)
        self.qkv, self.proj = nn.Linear(embd, 3 * embd), nn.Linear(embd, embd)
        self.fc, self.out = nn.Linear(embd, 4 * embd), nn.Linear(4 * embd, embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        # causal, computed here: a buffer would be broadcast by DDP every step
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(256, a.embd)
        self.pos = nn.Embedding(a.block, a.embd)
        self.blocks = nn.ModuleList(Block(a.embd, a.heads) for _ in range(a.layers))
        self.ln = nn.LayerNorm(a.embd)
        self.head = nn.Linear(a.embd, 256, bias=False)

    def forward(self, x, y):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for blk in self.blocks:
            h = blk(h)
        logits = self.head(self.ln(h))
        return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))


def batch(data, a, step, rank, world):
    """This rank's share of step's global batch: (inputs, targets)."""
    train = data[: len(data) * 9 // 10]
    g = torch.Generator().manual_seed(a.seed * 1000003 + step)
    starts = torch.randint(0, len(train) - a.block - 1, (a.batch,), generator=g)
    if a.batch % world:  # --batch 12: 1, 2, 3, 4, 6 or 12 ranks (PET_NNODES' maximum at most 12, a divisor)
        sys.exit("examples/gpt: a global batch of %d does not split over %d ranks" % (a.batch, world))
    share = a.batch // world
    mine = starts[rank * share:(rank + 1) * share]
    x = torch.stack([train[s:s + a.block] for s in mine.tolist()])
    y = torch.stack([train[s + 1:s + 1 + a.block] for s in mine.tolist()])
    if a.step_sleep:
        time.sleep(a.step_sleep)
    return x, y


def lr_at(a, step):
    """Warm-up over 20 steps, then cosine decay to a tenth over the run."""
    if step < 20:
        return a.lr * (step + 1) / 20
    return a.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(step / a.steps, 1.0))))


def evaluate(model, data, a):
    """The mean loss over 16 fixed held-out sequences."""
    held = data[len(data) * 9 // 10:]
    g = torch.Generator().manual_seed(12345)
    starts = torch.randint(0, len(held) - a.block - 1, (16,), generator=g).tolist()
    x = torch.stack([held[s:s + a.block] for s in starts])
    y = torch.stack([held[s + 1:s + 1 + a.block] for s in starts])
    with torch.no_grad():
        return model(x, y).item()


def log(step, rank, world, loss):
    """One line per step and rank: `step=S rank=R world=W loss=L pid=P t=T`."""
    sys.stdout.write("step=%d rank=%d world=%d loss=%.4f pid=%d t=%.3f\n" % (step, rank, world, loss.item(), os.getpid(),
                                                                           time.time()))
    sys.stdout.flush()


def save(directory, model, opt, step):
    """The plain script's checkpoint (torch.save, written atomically)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "ckpt-%d.pt" % step)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path + ".tmp")
    os.replace(path + ".tmp", path)


def load(directory, model, opt):
    """The plain script's resume: the newest checkpoint's step, 0 without one."""
    steps = sorted(int(n[5:-3]) for n in os.listdir(directory) if n.startswith("ckpt-") and n.endswith(".pt")) \
        if os.path.isdir(directory) else []
    if not steps:
        return 0
    got = torch.load(os.path.join(directory, "ckpt-%d.pt" % steps[-1]))
    model.load_state_dict(got["model"])
    opt.load_state_dict(got["optimizer"])
    return got["step"]
