"""What a step of ElasticSampler costs at 10M samples (issue #41): the
epoch's permutation once, then each step's batch. Medians of the steps
after the epoch's first. Not a test: docs/benchmarks.md has the figures.

    PYTHONPATH=python python3 python/tests/bench_sampler.py [SIZE] [GLOBAL_BATCH] [STEPS]
"""

import statistics
import sys
import time

import torch

from etjob import torch as etorch


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    torch.set_num_threads(1)
    s = etorch.ElasticSampler(size, batch, seed=3)
    t0 = time.perf_counter()
    s.batch(0, 4)
    first = time.perf_counter() - t0
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        s.batch(i % 4, 4)
        s.commit()
        times.append(time.perf_counter() - t0)
    print("torch %s, %d samples, global batch %d: the epoch's first step %.3f s; the next %d steps (batch and commit) "
          "median %.1f us, max %.1f us" % (torch.__version__, size, batch, first, steps, statistics.median(times) * 1e6,
                                           max(times) * 1e6))


if __name__ == "__main__":
    main()
