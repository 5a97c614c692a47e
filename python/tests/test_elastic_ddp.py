"""etjob.elastic's DDP and vote-then-step Optimizer (etjob.ddp) under the
faults of test_elastic: the same worker (elastic_worker.py with API=vote:
torch's DDP, its buckets through bounded all-reduces, the optimizer stepped
only once every rank agreed), the same real gloo groups and TCPStore, the
same checks (no survivor restarted, the ledger exact, every rank ends with
the undisturbed run's model)."""

import os
import subprocess
import sys
import threading
import time
import unittest

import test_elastic as te


@unittest.skipIf(te.dist is None, "needs torch")
class VoteRecoveryTest(te.Undisturbed, unittest.TestCase):
    ENV = {"API": "vote"}  # the undisturbed run too: its extras line is the vote API's

    def job(self, n, nnodes, **kw):
        kw["env"] = dict(kw.get("env") or {}, API="vote")
        return te.Job(self, n, nnodes, **kw)

    test_hard_kill_survivors_go_on_in_process = te.InProcessRecoveryTest.test_hard_kill_survivors_go_on_in_process
    test_frozen_rank_is_left_behind_then_fenced = te.InProcessRecoveryTest.test_frozen_rank_is_left_behind_then_fenced
    test_joiner_takes_the_state_by_broadcast = te.InProcessRecoveryTest.test_joiner_takes_the_state_by_broadcast
    test_sigterm_leaves_at_a_commit = te.InProcessRecoveryTest.test_sigterm_leaves_at_a_commit
    test_a_newcomer_that_comes_after_the_end_exits_0 = te.InProcessRecoveryTest.test_a_newcomer_that_comes_after_the_end_exits_0
    test_a_newcomer_beyond_max_waits_as_a_spare_until_a_member_leaves = \
        te.InProcessRecoveryTest.test_a_newcomer_beyond_max_waits_as_a_spare_until_a_member_leaves
    test_below_min_everyone_stops_at_one_step_and_resumes_from_disk = \
        te.InProcessRecoveryTest.test_below_min_everyone_stops_at_one_step_and_resumes_from_disk
    test_below_min_after_a_hard_loss_the_newest_commit_is_saved = \
        te.InProcessRecoveryTest.test_below_min_after_a_hard_loss_the_newest_commit_is_saved
    stop_below_min_and_resume = te.InProcessRecoveryTest.stop_below_min_and_resume
    resume_from_disk = te.InProcessRecoveryTest.resume_from_disk

    def test_the_vote_goes_with_the_last_bucket(self):
        """Each step's vote is launched beside the last bucket's all-reduce
        (step() makes none of its own); with two backward passes a step
        (gradient accumulation) step() votes once more, over both, and the
        model ends like the undisturbed run's."""
        for accum, late in (("1", 0), ("2", self.STEPS)):
            job = self.job(2, "2:4", steps=self.STEPS, env={"ACCUM": accum})
            codes = job.wait_exit(["w0", "w1"])
            self.assertEqual(codes, {"w0": 0, "w1": 0}, job.dump())
            for n in ("w0", "w1"):
                self.assertIn("votes late=%d" % late, job.lines(n), job.dump("ACCUM=%s %s:" % (accum, n)))
            self.assert_finished_like_undisturbed(job, ["w0", "w1"])
            job.close()


@unittest.skipIf(te.dist is None, "needs torch")
class FakeNCCLTest(te.Undisturbed, unittest.TestCase):
    """The buckets through tests/fake_nccl.py's transport (a fake NCCL on
    CPU: a communicator a generation, aborted when it ends; wait() returns
    at enqueue, only is_completed() tells): the replicas end equal to the
    undisturbed run (they diverge when the library trusts wait()), and a
    hard kill aborts the old communicator and makes a new one, in the same
    processes."""

    ENV = {"API": "vote"}

    def job(self, n, nnodes, **kw):
        kw["env"] = dict(kw.get("env") or {}, API="vote", FAKE_NCCL="1")
        self.last = te.Job(self, n, nnodes, **kw)
        return self.last

    def test_hard_kill_aborts_the_communicator_and_goes_on(self):
        te.InProcessRecoveryTest.test_hard_kill_survivors_go_on_in_process(self)
        job = self.last
        for n in ("w0", "w1", "w2"):
            # the communicator of the generation the kill ended
            self.assertIn("fake-nccl: aborted %d" % self.g4, job.lines(n, "err"), job.dump("%s:" % n))

    test_joiner_takes_the_state_by_broadcast = te.InProcessRecoveryTest.test_joiner_takes_the_state_by_broadcast


@unittest.skipIf(te.dist is None, "needs torch")
class ImportAndDeviceTest(unittest.TestCase):
    """Two faults hack/gpu-check.sh found on a GPU, kept found on CPU."""

    def test_either_module_may_be_imported_first(self):
        # etjob.ddp imported before etjob.elastic was a circular import
        for first in ("etjob.ddp", "etjob.elastic"):
            got = subprocess.run([sys.executable, "-c", "import %s; from etjob.elastic import DistributedDataParallel, "
                                  "Optimizer; from etjob.elastic import *; print(Optimizer.__module__)" % first],
                                 env=dict(os.environ, PYTHONPATH=os.path.join(te.REPO, "python")), capture_output=True, text=True,
                                 timeout=60)
            self.assertEqual(got.stdout.strip(), "etjob.ddp", "importing %s first:\n%s" % (first, got.stderr))

    @unittest.skipIf(not hasattr(te.dist.ProcessGroup, "_register_backend"), "torch 1.13: gloo groups take CUDA tensors")
    def test_ddp_own_group_takes_cuda_tensors(self):
        # torch 2.x: DDP checks a GPU model's shapes on its own group, which
        # had a backend for the CPU alone ("No backend type associated with
        # device type cuda")
        import torch

        from etjob import ddp

        pg = ddp._local_group()
        self.assertIs(pg._get_backend(torch.device("cuda")), pg._get_backend(torch.device("cpu")))


@unittest.skipIf(te.dist is None, "needs torch")
class RefusalTest(unittest.TestCase):
    """What would make the ranks step apart is refused by name, at once."""

    def test_unused_parameters_refused(self):
        import torch

        from etjob import ddp

        for name in ("find_unused_parameters", "static_graph"):
            with self.assertRaisesRegex(TypeError, name + "=True is not supported"):
                ddp.DistributedDataParallel(torch.nn.Linear(2, 2), **{name: True})
        ddp.DistributedDataParallel(torch.nn.Linear(2, 2), find_unused_parameters=False)

    def test_optimizer_needs_the_elastic_ddp(self):
        import torch

        from etjob import ddp

        model = torch.nn.Linear(2, 2)
        with self.assertRaisesRegex(TypeError, "model must be an etjob.elastic.DistributedDataParallel.*Linear"):
            ddp.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)

    def test_nccl_refused_where_torch_has_none(self):
        from etjob import ddp

        if te.dist.is_nccl_available() and hasattr(te.dist.ProcessGroupNCCL, "abort"):
            self.skipTest("this torch has NCCL")
        with self.assertRaisesRegex(ValueError, "backend 'nccl' needs a torch with NCCL"):
            ddp.use("nccl")

    def test_an_empty_checkpoint_directory_is_remembered(self):
        # the rank that saves a stop below min may be any: a fresh run's
        # ranks all know where (the directory had no checkpoint yet)
        import tempfile

        import torch

        d = tempfile.mkdtemp(prefix="etjob-ddp-")
        state = te.elastic.State(model=torch.nn.Linear(2, 2), step=0)
        self.assertFalse(state.load_checkpoint(d))
        self.assertEqual(state._dir, d)


@unittest.skipIf(te.dist is None, "needs torch")
class PolledFailureTest(unittest.TestCase):
    """NCCL's works complete at enqueue, so completion is polled; a work that
    failed (a peer died in the all-reduce) is completed too, and its wait()
    does not raise. Its buffer, a reduction cut short, must not reach DDP
    as the bucket's mean: seen once in CI, in FakeNCCLTest's hard kill, as
    replicas that ended with three different models. Fakes throughout (a
    work, a group, a bucket): no machine of the tests has NCCL."""

    class Work:
        def __init__(self, error):
            self.error = error

        def is_completed(self):
            return True

        def wait(self, timeout=None):
            return True

        def exception(self):
            return self.error

    def hook(self, error):
        import torch

        from etjob import ddp

        ended = []
        ctx = type("Ctx", (), {"timeout_for": lambda self, n: 60.0, "over": lambda self, gen: False,
                               "begin_flight": lambda self: 0, "end_flight": lambda self, token: None,
                               "progressed": lambda self, g: None,
                               "end": lambda self, gen, why: ended.append((gen, why))})()
        group = type("Group", (), {"gen": 3, "size": 2, "pg": object(), "work": None})()
        pg = type("PG", (), {"allreduce": lambda self, tensors, opts=None: PolledFailureTest.Work(error)})()
        transport = type("T", (), {"polled": True})()
        buckets = ddp._Buckets(ctx, group, pg, transport, {})
        self.addCleanup(self.close, buckets)
        bucket = type("Bucket", (), {"buffer": lambda self: torch.ones(4), "parameters": lambda self: [],
                                     "is_last": lambda self: True})()
        return buckets.hook(None, bucket).wait(), buckets, ended

    def close(self, buckets):
        buckets.close()
        for t in threading.enumerate():  # none left in torch's code when the interpreter exits
            if t.name.startswith("etjob-ddp-"):
                t.join(10)

    def test_a_failed_work_fails_the_bucket(self):
        got, buckets, ended = self.hook(RuntimeError("Connection closed by peer\nmore"))
        self.assertEqual(got.tolist(), [0.0] * 4, "a failed all-reduce's buffer reached DDP")
        self.assertEqual(buckets.failed, "bucket all-reduce failed: Connection closed by peer")
        for _ in range(100):  # the generation is ended after the buckets are completed
            if ended:
                break
            time.sleep(0.05)
        self.assertEqual(ended, [(3, "bucket all-reduce failed: Connection closed by peer")])

    def test_a_completed_work_is_the_mean(self):
        got, buckets, ended = self.hook(None)
        self.assertEqual(got.tolist(), [0.5] * 4)  # the buffer, divided by the world (the fake reduces nothing)
        self.assertIsNone(buckets.failed)
        self.assertEqual(ended, [])


if __name__ == "__main__":
    unittest.main()
