#!/usr/bin/python3
"""Run an etjob.elastic training script with N local processes and no cluster.

    hack/elastic-local.py N SCRIPT [ARGS...]

It hosts the rendezvous store that a job's launcher would (a TCPStore on
127.0.0.1, a free port), starts N processes of SCRIPT as ranks of a job of
exactly N (PET_NNODES=N:N, one ETJOB_POD_NAME each), passes their output
through, and exits with the worst exit code. No node agent is reached. The
e2e uses it for the undisturbed run that TestInProcessStory's accuracy is
compared with; it is also the quickest way to try an etjob.elastic script.
"""

import datetime
import os
import socket
import subprocess
import sys

import torch.distributed as dist


def main(argv):
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        sys.exit("usage: elastic-local.py N SCRIPT [ARGS...] (N: the number of ranks, at least 1)")
    n, cmd = int(argv[0]), argv[1:]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,  # noqa: F841 (serves the ranks)
                          timeout=datetime.timedelta(seconds=60))
    env = dict(os.environ, ETJOB_RDZV_ENDPOINT="127.0.0.1:%d" % port, PET_NNODES="%d:%d" % (n, n),
               PET_RDZV_ID="local")
    env.pop("ETJOB_AGENT_ADDR", None)
    procs = [subprocess.Popen([sys.executable] + cmd, env=dict(env, ETJOB_POD_NAME="local-%d" % i)) for i in range(n)]
    codes = [p.wait() for p in procs]
    worst = max(codes, key=abs)
    sys.exit(worst if worst >= 0 else 128 - worst)


if __name__ == "__main__":
    main(sys.argv[1:])
