"""Script shapes users bring to etjob.elastic (issue #41), each against an
undisturbed run of the same shape: every rank's final weights, learning
rate and GradScaler scale equal to it, or the library refuses the script by
name. The same worker as test_elastic (elastic_worker.py), the same real
gloo groups and authenticated store: an LR scheduler and a GradScaler
registered after the optimizer, an unregistered scheduler, gradients zeroed
after the step with a failed bucket, Horovod's State(epoch=, batch=), the
replica check, and the first generation at init_process_group."""

import tempfile
import unittest

import test_elastic as te


def joiner_at_step_31(test):
    """Three members, a fourth held until they trained 30 steps, then let
    join: every rank ends with the undisturbed run's model and extras."""
    job = test.job(3, "2:4", env={"STEP_SLEEP": "0.1"})
    name = job.start(held=True)
    job.wait_step(30, names=["w0", "w1", "w2"])
    job.release(name)
    job.wait_step(1, names=[name])
    codes = job.wait_exit(list(job.procs))
    test.assertEqual(set(codes.values()), {0}, job.dump())
    test.assertGreater(job.steps(name)[0][0], 30, "the joiner did not start from the others' state")
    test.assert_finished_like_undisturbed(job, list(job.procs))
    return job


@unittest.skipIf(te.dist is None, "needs torch")
class SchedulerTest(te.Undisturbed, unittest.TestCase):
    """A StepLR over the etjob Optimizer, registered (opt.register), stepped
    when opt.step() returns True: a joiner gets its state; one that steps
    with the optimizer unregistered is refused by name. Before: the joiner's
    learning rate and weights differed, every rank exited 0."""

    ENV = {"API": "vote", "SCHED": "1"}

    def test_a_joiner_gets_the_schedulers_state(self):
        joiner_at_step_31(self)

    def test_an_unregistered_scheduler_is_refused_by_name(self):
        job = self.job(2, "2:4", env={"SCHED": "unregistered"})
        codes = job.wait_exit(["w0", "w1"])
        self.assertEqual(codes, {"w0": 1, "w1": 1}, job.dump())
        for n in ("w0", "w1"):
            self.assertIn("StepLR (torch.optim.lr_scheduler.StepLR) steps with the optimizer but is not part of the "
                          "state", "\n".join(job.lines(n, "err")))


@unittest.skipIf(te.dist is None, "needs torch")
class ScalerTest(te.Undisturbed, unittest.TestCase):
    """A GradScaler (torch.amp's on the CPU on torch 2.x; on torch 1.13,
    which has none for the CPU, the worker's FakeGradScaler: a named fake),
    registered, its scale growing every 10 steps: a joiner gets it."""

    ENV = {"API": "vote", "SCALER": "1"}

    def test_a_joiner_gets_the_scalers_state(self):
        joiner_at_step_31(self)


@unittest.skipIf(te.dist is None, "needs torch")
class SkippedStepTest(te.Undisturbed, unittest.TestCase):
    """Gradients zeroed after a step that stepped (not before each), two
    buckets a step: at step 20 every rank's last bucket fails, the first
    having completed. The retried step must not add the failed step's
    gradients to its own. Before: the replicas ended with another model."""

    ENV = {"API": "vote", "ZERO_AFTER": "1"}

    def test_a_skipped_step_leaves_no_gradient(self):
        job = self.job(2, "2:4", env={"FAIL_LAST_BUCKET_AT": "20"})
        codes = job.wait_exit(["w0", "w1"])
        self.assertEqual(codes, {"w0": 0, "w1": 0}, job.dump())
        for n in ("w0", "w1"):
            self.assertIn("fault: last bucket failed at step 20", job.lines(n, "err"), job.dump())
        self.assert_finished_like_undisturbed(job, ["w0", "w1"])


@unittest.skipIf(te.dist is None, "needs torch")
class DropoutSkipTest(te.Undisturbed, unittest.TestCase):
    """A step that draws from torch's random stream (a dropout of the
    inputs), on the DDP API: a skipped step draws again what it drew the
    first time, so the model is the undisturbed run's. Before: the retried
    step drew other masks, and the ranks ended with another model, every
    rank exiting 0."""

    ENV = {"DROPOUT": "1", "API": "vote", "ZERO_AFTER": "1"}

    def test_a_skipped_step_draws_its_own_masks_again(self):
        job = self.job(2, "2:4", env={"FAIL_LAST_BUCKET_AT": "20"})
        codes = job.wait_exit(["w0", "w1"])
        self.assertEqual(codes, {"w0": 0, "w1": 0}, job.dump())
        for n in ("w0", "w1"):
            self.assertIn("fault: last bucket failed at step 20", job.lines(n, "err"), job.dump())
        self.assert_finished_like_undisturbed(job, ["w0", "w1"])


@unittest.skipIf(te.dist is None, "needs torch")
class DropoutRollbackTest(te.Undisturbed, unittest.TestCase):
    """The same on the `run` API: a rollback to the last commit puts torch's
    random stream back too (rank 0 ends the generation every 40 steps, as a
    failure would)."""

    ENV = {"DROPOUT": "1"}

    def test_a_rollback_draws_its_own_masks_again(self):
        job = self.job(2, "2:4", env={"END_EVERY": "40"})
        codes = job.wait_exit(["w0", "w1"])
        self.assertEqual(codes, {"w0": 0, "w1": 0}, job.dump())
        self.assertTrue(any("rolling back" in l for l in job.lines("w1", "err")), job.dump())
        self.assert_finished_like_undisturbed(job, ["w0", "w1"])


@unittest.skipIf(te.dist is None, "needs torch")
class HorovodStateTest(te.Undisturbed, unittest.TestCase):
    """Horovod's state shape on the run API, State(model, optimizer,
    sampler, epoch=0, batch=0) with no step: a joiner that built its model
    from another seed gets the members' state (the library counts the
    commits). Before: it trained on its own weights."""

    ENV = {"HVD_STATE": "1"}

    def test_a_joiner_without_a_step_is_synced(self):
        job = self.job(2, "2:4", env={"STEP_SLEEP": "0.1"})
        job.env["SEED"] = "7"
        name = job.start(held=True)
        job.wait_step(30, names=["w0", "w1"])
        job.release(name)
        job.wait_step(1, names=[name])
        codes = job.wait_exit(list(job.procs))
        self.assertEqual(set(codes.values()), {0}, job.dump())
        self.assert_finished_like_undisturbed(job, list(job.procs))

    def test_ranks_that_start_apart_take_rank_0s_state(self):
        # every rank seeds its model differently: the first sync makes rank
        # 0's everyone's (Horovod's broadcast at the start)
        job = self.job(2, "2:4", env={"SEED": "11"})
        job.env["SEED"] = "12"
        job.start()
        codes = job.wait_exit(list(job.procs))
        self.assertEqual(set(codes.values()), {0}, job.dump())
        weights = {job.done(n)[1] for n in job.procs}
        self.assertEqual(len(weights), 1, "the replicas differ at the end: %s" % weights)


@unittest.skipIf(te.dist is None, "needs torch")
class ReplicaCheckTest(te.Undisturbed, unittest.TestCase):
    """The vote carries a digest of each rank's model every
    ETJOB_REPLICA_CHECK_STEPS steps (10 here). Rank 1 adds 1e-6 to its
    weights after step 23 (a divergence no loss shows): found at step 30,
    said by name, and rank 0's state is everyone's again; with
    ETJOB_REPLICA_MISMATCH=fail the job fails. A buffer that rank 1 alone
    changes every step (BatchNorm's running statistics are each rank's own)
    is no divergence: no generation ends for it."""

    ENV = {"API": "vote", "PLANT": "1", "ETJOB_REPLICA_CHECK_STEPS": "10"}

    def test_a_planted_divergence_is_found_within_k_steps(self):
        job = self.job(2, "2:4", env={"PLANT_AT": "23"})
        codes = job.wait_exit(["w0", "w1"])
        self.assertEqual(codes, {"w0": 0, "w1": 0}, job.dump())
        err = "\n".join(job.lines("w0", "err") + job.lines("w1", "err"))
        self.assertIn("planted a divergence after step 23", err, job.dump())
        self.assertIn("replica check at step 30: the ranks' models differ", err, job.dump())
        self.assertRegex(err, r"replica check: after \d+ commits the ranks' model differ", job.dump())
        self.assert_finished_like_undisturbed(job, ["w0", "w1"])

    def test_buffers_of_each_ranks_own_are_no_divergence(self):
        job = self.job(2, "2:4")
        codes = job.wait_exit(["w0", "w1"])
        self.assertEqual(codes, {"w0": 0, "w1": 0}, job.dump())
        err = "\n".join(job.lines("w0", "err") + job.lines("w1", "err"))
        self.assertNotIn("replica check", err, job.dump())
        self.assert_finished_like_undisturbed(job, ["w0", "w1"])

    def test_a_divergence_fails_the_job_when_asked(self):
        job = self.job(2, "2:4", env={"PLANT_AT": "23", "ETJOB_REPLICA_MISMATCH": "fail"})
        codes = job.wait_exit(["w0", "w1"])
        self.assertNotIn(0, codes.values(), job.dump())
        err = "\n".join(job.lines("w0", "err") + job.lines("w1", "err"))
        self.assertIn("the job fails ($ETJOB_REPLICA_MISMATCH=fail)", err, job.dump())


@unittest.skipIf(te.dist is None, "needs torch")
class ReplicaCheckRunTest(te.Undisturbed, unittest.TestCase):
    """The `run` API's commits carry the same digest every
    ETJOB_REPLICA_CHECK_STEPS commits (10 here): rank 1's planted 1e-6 after
    step 23 is found at step 30, said by name, rolled back to that commit
    and rank 0's state made everyone's. Before: only the DDP API's vote
    checked, and the `run` API's replicas trained apart to the end."""

    ENV = {"ETJOB_REPLICA_CHECK_STEPS": "10"}

    def test_a_planted_divergence_is_found_within_k_steps(self):
        job = self.job(2, "2:4", env={"PLANT_AT": "23"})
        codes = job.wait_exit(["w0", "w1"])
        self.assertEqual(codes, {"w0": 0, "w1": 0}, job.dump())
        err = "\n".join(job.lines("w0", "err") + job.lines("w1", "err"))
        self.assertIn("planted a divergence after step 23", err, job.dump())
        self.assertIn("replica check at step 30: the ranks' models differ", err, job.dump())
        self.assertRegex(err, r"replica check: after \d+ commits the ranks' model differ", job.dump())
        self.assert_finished_like_undisturbed(job, ["w0", "w1"])


@unittest.skipIf(te.dist is None, "needs torch")
class EagerTest(te.Undisturbed, unittest.TestCase):
    """init_process_group forms the first generation: rank and size are
    right before the first step (the members' and a joiner's), and a
    checkpoint is read by rank 0 and sent to the others. Before: every rank
    saw rank 0 of a world of 1 until its first step."""

    ENV = {"API": "vote", "EAGER": "1"}

    def setups(self, job, name):
        return [l for l in job.lines(name) if l.startswith("setup")]

    def test_rank_and_size_are_right_before_the_first_step(self):
        # what each rank saw before its first step is the rank and world of
        # that step (the members', and the joiner's, admitted at step 31+)
        job = joiner_at_step_31(self)
        for n in job.procs:
            first = job.steps(n)[0]
            self.assertEqual(self.setups(job, n), ["setup rank=%d world=%d" % (first[1], first[2])], job.dump())
        self.assertEqual(job.steps("w3")[0][2], 4)

    def test_a_checkpoint_is_read_once_and_sent(self):
        ckpt = tempfile.mkdtemp(prefix="etjob-eager-")
        first = self.job(2, "2:4", steps=50, env={"ETJOB_CHECKPOINT_DIR": ckpt, "CHECKPOINT_EVERY": "25"})
        self.assertEqual(first.wait_exit(["w0", "w1"]), {"w0": 0, "w1": 0}, first.dump())
        again = self.job(2, "2:4", env={"ETJOB_CHECKPOINT_DIR": ckpt})
        self.assertEqual(again.wait_exit(["w0", "w1"]), {"w0": 0, "w1": 0}, again.dump())
        self.assertEqual(self.resumes(again)[0][1], 50, again.dump())
        read = {n: "\n".join(again.lines(n, "err")) for n in ("w0", "w1")}
        others = [n for n, err in read.items() if "read by rank 0, sent to this rank at the first sync" in err]
        self.assertEqual(len(others), 1, again.dump("one rank read the checkpoint, the other took it at the sync:"))
        self.assertRegex(read[others[0]], r"step 50 \(state from rank 0: [\d.]+ MB", again.dump())
        self.assert_finished_like_undisturbed(again, ["w0", "w1"])



@unittest.skipIf(te.dist is None, "needs torch")
class DataLoaderTest(te.Undisturbed, unittest.TestCase):
    """The DDP tutorial's data path (loader_worker.py): an epoch loop over
    etjob.elastic.DataLoader with 2 worker processes, set_epoch and the
    tutorial's peek at a batch. Two members, a joiner let in at step 31
    (a world of 3: a global batch of 8 splits 3, 3, 2), then a member's
    hard kill: each sample is trained once an epoch, the joiner's loop
    reaches the others' epoch by its number, every rank ends with the
    undisturbed run's model. Before: no such loader (ElasticSampler could
    not feed a DataLoader)."""

    # workers: what etjob sets in every pod (spec.replicas), the global
    # batch's world (a joiner would otherwise make it for its own)
    ENV = {"WORKER_SCRIPT": "loader_worker.py", "LOADER_WORKERS": "2", "workers": "2"}
    STEPS = 120

    def seen(self, job, names):
        """(epoch, step, rank, world, samples, loading workers) of each
        committed step of names."""
        out = []
        for n in names:
            for line in job.lines(n):
                if line.startswith("seen "):
                    f = dict(kv.split("=", 1) for kv in line.split()[1:])
                    out.append((int(f["epoch"]), int(f["step"]), int(f["rank"]), int(f["world"]),
                                [int(v) for v in f["idx"].split(",")], [int(v) for v in f["workers"].split(",")]))
        return out

    def test_a_resize_trains_each_sample_once_an_epoch(self):
        job = self.job(2, "2:4", steps=self.STEPS, env={"STEP_SLEEP": "0.05"})
        name = job.start(held=True)
        job.wait_step(30, names=["w0", "w1"])
        job.release(name)
        job.wait_step(1, names=[name])
        at = job.steps(name)[-1][0]
        job.wait_step(at + 10, names=[name])
        job.procs["w1"].kill()
        codes = job.wait_exit(["w0", name])
        self.assertEqual(codes, {"w0": 0, name: 0}, job.dump())
        self.assertGreater(job.steps(name)[0][0], 30, "the joiner did not start from the others' state")
        worlds = {s[2] for n in job.procs for s in job.steps(n)}
        self.assertEqual(worlds, {2, 3}, job.dump())
        # each logged share is its rank's rows of the step's global batch
        # (the epoch's order, 8 samples a step), and every step of every
        # epoch was logged: each sample once an epoch, whatever the world
        from etjob.data import DistributedSampler

        order = DistributedSampler(range(96), seed=3)
        seen = self.seen(job, list(job.procs))
        steps = set()
        for epoch, step, rank, world, idx, _ in seen:
            self.assertEqual(epoch, (step - 1) // 12, "step %d was trained in the loop's epoch %d" % (step, epoch))
            at = (step - 1) % 12 * 8
            want = order.order(epoch)[at:at + 8][rank::world].tolist()
            self.assertEqual(idx, want, "step %d rank %d/%d trained other samples" % (step, rank, world))
            steps.add(step)
        self.assertEqual(steps, set(range(1, self.STEPS + 1)), "steps not trained: %s" % (set(range(1, self.STEPS + 1)) - steps))
        self.assertTrue(any(w >= 0 for s in seen for w in s[5]), "no batch came from a DataLoader worker process")
        self.assert_finished_like_undisturbed(job, ["w0", name])
        joined = "\n".join(job.lines(name, "err"))
        self.assertIn("epoch 0 batch", joined)


class _Sharded(te.Undisturbed):
    """A background checkpoint is written by every rank: rank 0's request
    rides the next vote, each of the 3 ranks writes its part of that
    commit, and once every part landed rank 0 writes the manifest and
    `latest`. A job of 2 resumes from it and ends with the undisturbed
    run's model. Before: rank 0 wrote the whole state alone."""

    def written(self, api):
        ckpt = tempfile.mkdtemp(prefix="etjob-sharded-")
        env = {"ETJOB_CHECKPOINT_DIR": ckpt, "CHECKPOINT_EVERY": "25", "CHECKPOINT_ASYNC": "1"}
        first = self.job(3, "2:4", steps=60, env=env)
        self.assertEqual(first.wait_exit(["w0", "w1", "w2"]), {"w0": 0, "w1": 0, "w2": 0}, first.dump())
        return ckpt, first

    def check(self, api):
        import os

        from etjob import sharded
        from etjob import torch as etorch

        ckpt, first = self.written(api)
        step = etorch.latest_step(ckpt)
        self.assertIsNotNone(step, first.dump())
        manifest = etorch._read_file(os.path.join(ckpt, "ckpt-%08d.etjob" % step))
        self.assertTrue(sharded.is_manifest(manifest), "latest is not a sharded checkpoint's manifest")
        self.assertEqual(manifest["sharded"]["world"], 3)
        for r in range(3):
            self.assertTrue(os.path.exists(os.path.join(ckpt, sharded.part_name(step, r, 3))), os.listdir(ckpt))
        # rank 0 (whichever worker it is) says each checkpoint that landed
        landed = [l for w in ("w0", "w1", "w2") for l in first.lines(w) if l.startswith("checkpoint ")]
        self.assertIn("checkpoint ckpt-%08d.etjob" % step, "\n".join(landed), first.dump())
        env = {"ETJOB_CHECKPOINT_DIR": ckpt, "CHECKPOINT_EVERY": "0"}
        again = self.job(2, "2:4", env=env)
        self.assertEqual(again.wait_exit(["w0", "w1"]), {"w0": 0, "w1": 0}, again.dump())
        self.assertGreaterEqual(self.resumes(again)[0][1], 50, again.dump())
        self.assert_finished_like_undisturbed(again, ["w0", "w1"])



@unittest.skipIf(te.dist is None, "needs torch")
class ShardedCheckpointTest(_Sharded, unittest.TestCase):
    def test_the_run_api_writes_a_part_a_rank(self):
        self.check(None)

    def test_a_part_that_fails_drops_that_save_not_the_later_ones(self):
        """w1's first part fails (a full disk for a moment): that save is
        dropped on every rank, said by rank 0, and the next one lands.
        Before: the save stayed pending until the generation ended, and no
        checkpoint was written again."""
        import os

        from etjob import sharded
        from etjob import torch as etorch

        ckpt = tempfile.mkdtemp(prefix="etjob-sharded-")
        env = {"ETJOB_CHECKPOINT_DIR": ckpt, "CHECKPOINT_EVERY": "20", "CHECKPOINT_ASYNC": "1", "FAIL_PART_ONCE": "w1"}
        job = self.job(3, "2:4", steps=60, env=env)
        self.assertEqual(job.wait_exit(["w0", "w1", "w2"]), {"w0": 0, "w1": 0, "w2": 0}, job.dump())
        errs = "\n".join(l for w in ("w0", "w1", "w2") for l in job.lines(w, "err"))
        self.assertIn("no space left (FAIL_PART_ONCE)", errs, job.dump())
        self.assertIn("checkpoint ckpt-00000041.etjob", "\n".join(job.lines("w0") + job.lines("w1") + job.lines("w2")), job.dump())
        self.assertIn("dropped: a rank's part was not written", errs, job.dump())
        step = etorch.latest_step(ckpt)
        self.assertIsNotNone(step, job.dump())
        self.assertGreater(step, 25, "no checkpoint after the failed one:\n%s" % job.dump())
        # step 41's: sharded, its parts read back whole
        self.assertTrue(sharded.is_manifest(etorch._read_file(os.path.join(ckpt, "ckpt-%08d.etjob" % 41))))
        self.assertEqual(etorch.read_checkpoint(os.path.join(ckpt, "ckpt-%08d.etjob" % 41))["step"], 41)


@unittest.skipIf(te.dist is None, "needs torch")
class ShardedCheckpointVoteTest(_Sharded, unittest.TestCase):
    """The DDP API's; and with ETJOB_SHARDED_CHECKPOINTS=0 rank 0 writes
    the whole file, as before."""

    ENV = {"API": "vote"}

    def test_the_ddp_api_writes_a_part_a_rank(self):
        self.check("vote")

    def test_rank_0_alone_when_sharding_is_off(self):
        import os

        from etjob import sharded
        from etjob import torch as etorch

        os.environ["ETJOB_SHARDED_CHECKPOINTS"] = "0"
        try:
            ckpt, first = self.written("vote")
        finally:
            del os.environ["ETJOB_SHARDED_CHECKPOINTS"]
        step = etorch.latest_step(ckpt)
        self.assertFalse(sharded.is_manifest(etorch._read_file(os.path.join(ckpt, "ckpt-%08d.etjob" % step))))
        self.assertFalse([n for n in os.listdir(ckpt) if n.startswith("part-")])


if __name__ == "__main__":
    unittest.main()
