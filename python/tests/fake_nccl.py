"""A fake NCCL transport for etjob.elastic's DistributedDataParallel, on CPU
(named a fake: no machine of the tests has a GPU). It behaves as NCCL does
where the library's code must differ from gloo's: each generation gets a
communicator of its own (a gloo group here), aborted when the generation
ends; a work's wait() and its future return at once (NCCL's complete at
enqueue: the stream waits, not the host), and only is_completed() says when
the reduction is done; a failed work is completed too, its wait() does not
raise, and only its exception() says it failed. A library that trusted
wait() would hand DDP its buckets before they were reduced, or cut short by
a peer's death, and the model would not be the undisturbed run's. Each abort
is logged (`fake-nccl: aborted G`)."""

import sys

import torch

from etjob import ddp


class _Work:
    def __init__(self, work):
        self.work = work

    def wait(self, timeout=None):
        return True  # NCCL: at enqueue, not at completion, and never raises (async error handling off)

    def is_completed(self):
        return self.work.is_completed()  # done, or failed: as NCCL's

    def exception(self):
        # NCCL's says why a completed work failed (wait() does not raise);
        # gloo's on torch 2.x, or its is_success() on 1.13
        try:
            return self.work.exception()
        except TypeError:  # torch 1.13 cannot hand the error to Python
            return None if self.work.is_success() else RuntimeError("fake-nccl: the all-reduce failed")

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result([])  # NCCL's too completes at enqueue
        return fut


class _Group:
    def __init__(self, pg, gen):
        self.pg, self.gen, self.aborted = pg, gen, False

    def allreduce(self, tensors, opts=None):
        return _Work(self.pg.allreduce(tensors) if opts is None else self.pg.allreduce(tensors, opts))

    def abort(self):
        self.aborted = True
        sys.stderr.write("fake-nccl: aborted %d\n" % self.gen)
        sys.stderr.flush()
        if hasattr(self.pg, "abort"):
            self.pg.abort()


class Transport(ddp._NCCLTransport):
    name = "fake-nccl"

    def group(self, ctx, g):
        pg, _ = ctx._make_pg("g%d/data/" % g.gen, g.rank, g.size)
        return _Group(pg, g.gen)


def install():
    ddp.TRANSPORTS["fake-nccl"] = Transport
