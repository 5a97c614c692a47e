"""Standalone torchrun rendezvous store, hosted by an ElasticJob's launcher.

torch's c10d rendezvous keeps its state in a TCPStore. By default the first
elastic agent to bind the endpoint hosts it, and when that worker's node is
reclaimed the whole job dies (measured). etjob runs the store here instead, on
reliable capacity, and every worker agent joins with is_host=false.

A store that replaces one (a job with spec.recovery InProcess, whose workers
outlive their launcher) is told so by the controller ($ETJOB_RDZV_REPLACEMENT,
the attempt's launcher replacements) and says so to the workers under the key
`etjob/store/replacement`: an etjob.elastic newcomer then waits for the
members to tell it their generation before it opens one of its own.

With a job secret ($ETJOB_STORE_SECRET_FILE, which the controller mounts
from the job's Secret `<job>-store`) the store listens on loopback only and
etjob's authenticating front (etjob.storeauth) serves the port: a client
that does not prove the secret is closed before it reads or writes a key.
Without one the store serves the port itself, unauthenticated, as c10d's
does, and says so.

Usage: python3 -m etjob.rdzv [--host 0.0.0.0] [--port 29400]
"""

import argparse
import os
import signal
import sys
import threading

from etjob import contract


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m etjob.rdzv", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get(contract.ENV_POD_IP) or "0.0.0.0",
                        help="address to listen on (default: $ETJOB_POD_IP, else all)")
    parser.add_argument("--port", type=int, default=29400, help="port to listen on (ETJOB_RDZV_ENDPOINT's)")
    args = parser.parse_args(argv)

    from datetime import timedelta

    import torch
    from torch.distributed import TCPStore

    from etjob import storeauth

    try:
        replacement = int(os.environ.get(contract.ENV_RENDEZVOUS_REPLACEMENT) or "0")
    except ValueError:
        sys.exit("etjob.rdzv: %s=%r is not a whole number" % (contract.ENV_RENDEZVOUS_REPLACEMENT, os.environ[contract.ENV_RENDEZVOUS_REPLACEMENT]))
    try:
        key = storeauth.load_secret()
    except storeauth.SecretError as e:
        sys.exit("etjob.rdzv: %s" % e)
    timeout = timedelta(days=365)
    if key is None:
        store = TCPStore(args.host, args.port, is_master=True, wait_for_workers=False, timeout=timeout)
        # Set as the store starts to listen: a worker whose first calls came
        # in the microseconds before it would read 0 (one rendezvous round
        # trip after its handshake's: not seen in practice, and not excluded).
        store.add("etjob/store/replacement", replacement)
        how = "unauthenticated: no $%s" % storeauth.ENV
    else:
        try:
            store, inner = storeauth.loopback_store(timeout)
        except RuntimeError as e:
            sys.exit("etjob.rdzv: %s" % e)
        store.add("etjob/store/replacement", replacement)  # before any client can connect
        try:
            front = storeauth.Front(args.host, args.port, ("127.0.0.1", inner), key)
        except OSError as e:
            sys.exit("etjob.rdzv: cannot listen on %s:%d: %s" % (args.host, args.port, e))
        how = "clients authenticated with the job's secret; the store itself on 127.0.0.1:%d" % inner
    print("etjob rendezvous store listening on %s:%d%s (torch %s; %s)" % (
        args.host, args.port, " (replacement %d)" % replacement if replacement else "", torch.__version__, how), flush=True)

    stop = threading.Event()

    def on_signal(signum, _frame):
        print("etjob rendezvous store: signal %d, exiting" % signum, flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(3600):
        pass
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
