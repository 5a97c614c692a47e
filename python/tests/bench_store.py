"""bench_store: what the store's authentication costs a client.

Starts `etjob.rdzv` twice on this machine, without a secret (c10d's store
serves its port) and with one (the store on loopback behind etjob's front),
and times from a client process, side by side in rounds: a new client
(connect, and with the secret the handshake), and one `add` (a heartbeat's
operation). Prints the median of each over the rounds and the ratio.
Usage (either torch):

    PYTHONPATH=python:python/tests /usr/bin/python3 python/tests/bench_store.py --rounds 5 --ops 2000
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_store(env):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "etjob.rdzv", "--host", "127.0.0.1", "--port", str(port)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    assert "listening" in line, line
    return p, port


def measure(port, ops):
    """measure returns (seconds for a new client, seconds an add) against
    the store at port, through this process's tunnel when it has a secret."""
    from etjob import storeclient

    began = time.perf_counter()
    c = storeclient.new_client("127.0.0.1", port, timedelta(seconds=30))
    c.add("warm", 1)
    connect = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(ops):
        c.add("bench", 1)
    return connect, (time.perf_counter() - began) / ops


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=2000)
    args = p.parse_args()
    import torch

    from etjob import storeauth

    secret = storeauth.write_secret(os.path.join(tempfile.mkdtemp(prefix="etjob-bench-store-"), "secret"))
    base = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    base.pop("ETJOB_STORE_SECRET_FILE", None)
    plain, plain_port = start_store(base)
    authed, authed_port = start_store(dict(base, ETJOB_STORE_SECRET_FILE=secret))
    got = {"plain": [], "authenticated": []}
    try:
        for _ in range(args.rounds):
            for name, port, env in (("plain", plain_port, base), ("authenticated", authed_port,
                                                                   dict(base, ETJOB_STORE_SECRET_FILE=secret))):
                out = subprocess.run([sys.executable, __file__, "--child", str(port), str(args.ops)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
                got[name].append(tuple(float(v) for v in out.stdout.split()))
    finally:
        for s in (plain, authed):
            s.terminate()
            s.wait()
    med = {k: (statistics.median(c for c, _ in v), statistics.median(a for _, a in v)) for k, v in got.items()}
    print("torch %s, %d rounds of %d adds, medians:" % (torch.__version__, args.rounds, args.ops))
    for k, (c, a) in med.items():
        print("  %-14s new client %7.2f ms   add %7.1f us" % (k, c * 1e3, a * 1e6))
    print("  authenticated/plain: new client x%.2f, add x%.2f" % (
        med["authenticated"][0] / med["plain"][0], med["authenticated"][1] / med["plain"][1]))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        c, a = measure(int(sys.argv[2]), int(sys.argv[3]))
        print(c, a)
    else:
        main()
