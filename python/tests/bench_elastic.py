"""bench_elastic: etjob.elastic's recovery on this machine, without a cluster.

Runs tests/elastic_worker.py as 4 ranks against a TCPStore of its own and
disturbs them on a schedule: in turn a hard kill (SIGKILL of one rank) and a
join (a new rank started in its place), every --every seconds, --events in
all, then one freeze (SIGSTOP) and its thaw. For each event it prints the
pause: the last step line of any rank before it to the first after it, and at
the end the median and maximum per kind, the steps done again and the share
of the wall time training was paused (gaps between step lines longer than
four times the median step). Usage:

    PYTHONPATH=python:python/tests /usr/bin/python3 python/tests/bench_elastic.py --events 10
"""

import argparse
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_elastic  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=10, help="hard kills (each followed by a join)")
    p.add_argument("--every", type=float, default=3.0, help="seconds between events")
    args = p.parse_args()

    job = test_elastic.standalone_job(4, "2:4", steps=100000, env={"STEP_SLEEP": "0.02", "ETJOB_COLLECTIVE_TIMEOUT": "5"})
    try:
        job.wait_step(20)
        began = time.time()
        events = []
        alive = list(job.procs)
        for i in range(args.events):
            time.sleep(args.every)
            victim = alive.pop(0)
            events.append(("hard kill", time.time()))
            job.procs[victim].kill()
            time.sleep(args.every)
            events.append(("join", time.time()))
            alive.append(job.start())
        time.sleep(args.every)
        victim = alive[0]
        events.append(("freeze", time.time()))
        job.procs[victim].send_signal(signal.SIGSTOP)
        time.sleep(args.every + 5)
        events.append(("thaw", time.time()))
        job.procs[victim].send_signal(signal.SIGCONT)
        time.sleep(args.every)
        ended = time.time()
        steps = sorted(s[5] for n in job.procs for s in job.steps(n))
        resumes = []
        for n in job.procs:
            for line in job.lines(n):
                if line.startswith("resume step="):
                    resumes.append(float(line.rsplit("t=", 1)[1]))
        resumes.sort()
        by_kind = {}
        for r in resumes[1:]:
            kind = max((e for e in events if e[1] <= r), key=lambda e: e[1], default=("start", 0))[0]
            before = max((x for x in steps if x < r), default=r)
            after = min((x for x in steps if x > r), default=float("nan"))
            by_kind.setdefault(kind, []).append(after - before)
            print("generation at %7.2f s after a %-9s: no step for %.2f s" % (r - began, kind, after - before))
        # the time each step was first logged, in order: the step's pace and the pauses
        first = {}
        for n in job.procs:
            for s in job.steps(n):
                first[s[0]] = min(first.get(s[0], s[5]), s[5])
        times = sorted(t for t in first.values() if began <= t <= ended)
        gaps = [b - a for a, b in zip(times, times[1:])]
        step = statistics.median(gaps)
        paused = sum(g for g in gaps if g > 4 * step)
        print()
        for kind, v in by_kind.items():
            print("%-9s %2d events: pause p50 %.2f s, max %.2f s" % (kind, len(v), statistics.median(v), max(v)))
        gens = test_elastic.resumes(job)
        print("generations %d; steps done again per generation: max %d" % (len(gens), max((g[2] for g in gens), default=0)))
        print("wall %.1f s, median step %.3f s, paused %.1f s (%.1f %%) over %d events" % (
            ended - began, step, paused, 100 * paused / (ended - began), len(events)))
    finally:
        job.close()


if __name__ == "__main__":
    main()
