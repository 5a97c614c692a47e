"""Stock torchrun for `make bench-faults`: torch.distributed.run with nothing
of etjob's but the one fix without which Debian's torch 1.13 does not start on
Python 3.11 (Std.from_str("0") returns None there). Usage, in a worker:
python3 /opt/etjob/hack/stock-torchrun.py SCRIPT ARGS..."""

import sys

from etjob.torchrun import _patch_std

if __name__ == "__main__":
    _patch_std()
    from torch.distributed import run

    sys.argv[0] = "torchrun"
    run.main()
