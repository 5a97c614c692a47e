"""make bench-scale-elastic: etjob.elastic's rendezvous at N ranks (scale_harness:
the ranks are threads of this process with a FAKE process group, against
the real etjob.rdzv store behind its authenticating front). For each N of
$SCALE_NS (16,64,256): the store calls of a generation change after a hard
kill and after a join, the seconds from the fault to every rank training
again, and the steady store traffic per rank and second while training.

Usage: python3 bench_scale_elastic.py [N ...]

The tunnel's check of who connected is off here (scale_harness.install):
with every rank in one process it reads one network namespace holding all
ranks' sockets."""

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import scale_harness  # noqa: E402
from etjob import storeauth  # noqa: E402


def run(n, steady_s=10.0):
    d = tempfile.mkdtemp(prefix="etjob-scale-")
    secret = storeauth.write_secret(os.path.join(d, "store-secret"))
    port = scale_harness.free_port()
    with open(os.path.join(d, "store.err"), "w") as log:
        store = scale_harness.start_store(port, secret, log)
    os.environ.update(ETJOB_RDZV_ENDPOINT="127.0.0.1:%d" % port, ETJOB_STORE_SECRET_FILE=secret)
    h = scale_harness.Harness(min_size=max(2, n // 2), max_size=n)
    h.install()
    try:
        t0 = time.time()
        ranks = h.start(n)
        formed = h.wait_all_at(ranks, n, timeout=600)
        first = {"formed_s": formed - t0, "rdzv_calls": h.counts.total("rdzv")}
        time.sleep(2)  # past the first beats
        before, t = h.counts.snapshot(), time.time()
        time.sleep(steady_s)
        diff = h.counts.snapshot() - before
        el = time.time() - t
        steady = {k: sum(v for (_, kk), v in diff.items() if kk == k) / el / n for k in ("train", "watch", "rdzv")}
        per = sum(steady.values())
        victim = ranks[-1]
        kill = scale_harness.change(h, ranks[:-1], n - 1, victim=victim, timeout=300, steady=per)
        time.sleep(2)
        join = scale_harness.change(h, ranks[:-1], n, joiners=1, timeout=300, steady=per)
        return {"n": n, "first": first, "steady_per_rank_s": steady, "kill": kill, "join": join}
    finally:
        h.close()
        h.uninstall()
        store.kill()
        store.wait()


_LOAD = r"""
import json, os, sys, threading, time
from datetime import timedelta
sys.path.insert(0, os.environ["ETJOB_PY"])
from etjob import storeauth, storeclient
storeauth.peer_is_ours = lambda sock: True  # one process, many clients: see the module docstring
port, n, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
clients = [storeclient.new_client("127.0.0.1", port, timedelta(seconds=60)) for _ in range(n)]
lat, lock, go = [], threading.Lock(), threading.Event()
def run(c, i):
    mine = []
    go.wait()
    end = time.monotonic() + secs
    while time.monotonic() < end:
        t = time.monotonic()
        c.add("load/%d" % i, 1)
        mine.append(time.monotonic() - t)
    with lock:
        lat.extend(mine)
ts = [threading.Thread(target=run, args=(c, i)) for i, c in enumerate(clients)]
for t in ts: t.start()
go.set()
for t in ts: t.join()
print(json.dumps({"calls": len(lat), "lat": sorted(lat)[::max(1, len(lat) // 2000)]}))
"""


def store_load(clients, procs=4, secs=5.0):
    """store_load: clients store clients in procs processes, each asking
    add() in a loop for secs, against one etjob.rdzv store behind its front
    (each process's own tunnel): calls a second at the store and the
    latency of one call (median, p99)."""
    import json
    import subprocess

    d = tempfile.mkdtemp(prefix="etjob-load-")
    secret = storeauth.write_secret(os.path.join(d, "store-secret"))
    port = scale_harness.free_port()
    with open(os.path.join(d, "store.err"), "w") as log:
        store = scale_harness.start_store(port, secret, log)
    env = dict(os.environ, ETJOB_STORE_SECRET_FILE=secret, ETJOB_PY=os.path.join(scale_harness.REPO, "python"))
    try:
        ps = [subprocess.Popen([sys.executable, "-c", _LOAD, str(port), str(clients // procs), str(secs)], env=env,
                               stdout=subprocess.PIPE, text=True) for _ in range(procs)]
        outs = [json.loads(p.communicate(timeout=300)[0]) for p in ps]
        calls = sum(o["calls"] for o in outs)
        lat = sorted(x for o in outs for x in o["lat"])
        return calls / secs, lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
    finally:
        store.kill()
        store.wait()


def main(argv):
    ns = [int(x) for x in (argv or os.environ.get("SCALE_NS", "16,64,256").split(","))]
    print("etjob.elastic rendezvous at scale (FAKE process group, real store and front); torch %s" % __import__("torch").__version__)
    print("%6s %9s | %-44s | %-33s | %s" % ("", "", "hard kill of one rank", "one rank joins", "steady"))
    print("%6s %9s | %10s %10s %11s %10s | %10s %10s %11s | %s" % (
        "N", "formed s", "rdzv calls", "all extra", "to train s", "change s", "rdzv calls", "all extra", "to train s",
        "calls/rank/s"))
    for n in ns:
        r = run(n)
        k, j, s = r["kill"], r["join"], r["steady_per_rank_s"]
        print("%6d %9.2f | %10d %10d %11.2f %10.2f | %10d %10d %11.2f | %.2f" % (
            n, r["first"]["formed_s"], k["rdzv_calls"], k["extra_calls"], k["fault_to_training_s"], k["change_s"],
            j["rdzv_calls"], j["extra_calls"], j["fault_to_training_s"], sum(s.values())), flush=True)
    print("\nthe store under load (4 client processes asking add() in a loop, 5 s)")
    print("%8s %10s %12s %12s" % ("clients", "calls/s", "median ms", "p99 ms"))
    for clients in (16, 64, 256):
        rate, p50, p99 = store_load(clients)
        print("%8d %10.0f %12.2f %12.2f" % (clients, rate, p50 * 1e3, p99 * 1e3), flush=True)


if __name__ == "__main__":
    main([a for a in sys.argv[1:]])
