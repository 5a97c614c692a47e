"""torchrun for Debian's torch 1.13 on Python 3.11: `python3 -m etjob.torchrun ARGS...`.

Stock /usr/bin/torchrun crashes at launch on Python 3.11 (FACTS.md): IntFlag
iteration changed, so `Std.from_str("0")` returns None and multiprocessing/api.py
fails with "'NoneType' object has no attribute 'get'". This wrapper fixes
Std.from_str and then runs torch.distributed.run.main() unchanged; every torchrun
flag (and its PET_* environment variable) works as documented.
"""

import sys


def _patch_std():
    from torch.distributed.elastic.multiprocessing import api

    std = api.Std
    original = std.from_str

    def from_str(vm):
        got = original(vm)
        if got is not None:
            return got
        # Python 3.11: a plain "0".."3" no longer maps through the IntFlag loop.
        if isinstance(vm, str) and vm.strip().isdigit():
            return std(int(vm))
        if isinstance(vm, str) and ":" in vm:
            return {int(k): std(int(v)) for k, v in (kv.split(":") for kv in vm.split(","))}
        return got

    std.from_str = staticmethod(from_str)


def main(argv=None):
    _patch_std()
    from torch.distributed import run

    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    run.main()


if __name__ == "__main__":
    main()
