"""bench_generations: what each generation of etjob.elastic leaves behind.

Runs tests/elastic_worker.py as 2 ranks against a TCPStore of its own; rank 0
ends its generation every 2 steps, as a failure would (the other's next
collective fails, both roll back and meet in the next generation), --gens
times. Rank 0 prints its threads, open file descriptors and resident memory
at each new generation; this prints them at generations 10, 50, 100 and the
last, and the growth per generation from 10 on. Usage (either torch):

    PYTHONPATH=python:python/tests /usr/bin/python3 python/tests/bench_generations.py --gens 200
"""

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_elastic  # noqa: E402

LINE = re.compile(r"^resources gen=(\d+) threads=(\d+) fds=(\d+) rss_mb=([\d.]+)$")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gens", type=int, default=200, help="generations to go through")
    args = p.parse_args()

    began = time.monotonic()
    job = test_elastic.standalone_job(2, "2:2", steps=2 * args.gens + 4,
                                      env={"END_EVERY": "2", "STEP_SLEEP": "0", "ETJOB_SETTLE_SECONDS": "0.05"})
    try:
        codes = job.wait_exit(["w0", "w1"], timeout=60 + 3 * args.gens)
    finally:
        job.close()
    rows = sorted(tuple(float(v) for v in m.groups()) for m in (LINE.match(l) for l in job.lines("w0") + job.lines("w1")) if m)
    import torch
    print("torch %s, 2 ranks, %d generations in %.0f s, exit codes %s" % (
        torch.__version__, len(rows), time.monotonic() - began, codes))
    if not rows:
        print(job.dump())
        return 1
    print("%6s %8s %6s %8s" % ("gen", "threads", "fds", "rss MB"))
    marks = {10, 50, 100, int(rows[-1][0])}
    for r in rows:
        if int(r[0]) in marks:
            print("%6d %8d %6d %8.1f" % r)
    base = next((r for r in rows if r[0] >= 10), rows[0])
    last = rows[-1]
    n = max(last[0] - base[0], 1)
    print("per generation from %d to %d: %+.2f threads, %+.2f fds, %+.2f MB" % (
        base[0], last[0], (last[1] - base[1]) / n, (last[2] - base[2]) / n, (last[3] - base[3]) / n))
    return 0 if set(codes.values()) == {0} else 1


if __name__ == "__main__":
    sys.exit(main())
