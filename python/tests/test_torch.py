import errno
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import torch  # noqa: F401
    from etjob import torch as etorch
except ImportError:  # pragma: no cover
    etorch = None

from agentstub import AgentStub

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@unittest.skipIf(etorch is None, "needs torch")
class SamplerTest(unittest.TestCase):
    def test_exactly_once_per_epoch_across_world_sizes_and_restores(self):
        rng = random.Random(7)
        size, gb = 103, 8
        s = etorch.ElasticSampler(size, gb, seed=3)
        seen = {}  # epoch -> samples trained in committed steps
        saved = (s.state_dict(), {})
        while s.epoch < 4:
            world = rng.randint(1, 4)  # the membership changes between steps
            idx = torch.cat([s.batch(r, world) for r in range(world)]).tolist()
            self.assertEqual(len(idx), gb)
            seen.setdefault(s.epoch, []).extend(idx)
            s.commit()
            if rng.random() < 0.3:  # a checkpoint
                saved = (s.state_dict(), {e: list(v) for e, v in seen.items()})
            elif rng.random() < 0.1:  # a hard loss: back to the last checkpoint
                s.load_state_dict(saved[0])
                seen = {e: list(v) for e, v in saved[1].items()}
        for epoch in range(3):
            self.assertEqual(len(seen[epoch]), len(set(seen[epoch])), "epoch %d repeats a sample" % epoch)
            self.assertEqual(len(seen[epoch]), (size // gb) * gb)
        self.assertEqual(etorch.check_ledger(s.ledger, size, gb), [])
        # contiguous ranges merged: one range an epoch, however many steps
        self.assertEqual([r[0] for r in s.ledger], list(range(s.epoch + (1 if s.consumed else 0))))

    def test_one_permutation_an_epoch_the_same_batches(self):
        # the epoch's order is computed once (issue #41: it was computed at
        # every step), and the batches are what a fresh computation gives,
        # across epochs and a restore into another epoch; a batch handed
        # out is the caller's (changing it changes no later batch)
        s = etorch.ElasticSampler(50, 8, seed=5)
        fresh = lambda e, c: torch.randperm(50, generator=torch.Generator().manual_seed(5 * 1000003 + e))[c:c + 8]
        saved = None
        for step in range(20):
            got = s.global_batch_indices()
            self.assertEqual(got.tolist(), fresh(s.epoch, s.consumed).tolist(), "step %d" % step)
            got.fill_(-1)
            if step == 3:
                saved = s.state_dict()
            s.commit()
        self.assertGreater(s.epoch, 1)
        s.load_state_dict(saved)
        self.assertEqual(s.global_batch_indices().tolist(), fresh(saved["epoch"], saved["consumed"]).tolist())

    def test_ledger_stays_small_as_the_run_grows(self):
        s = etorch.ElasticSampler(1000, 10, seed=1)
        for _ in range(10_000):
            s.commit()
        self.assertEqual(s.epoch, 100)
        self.assertEqual(len(s.ledger), 100, s.ledger[:3])
        self.assertEqual(s.ledger[0], [0, 0, 1000])
        self.assertEqual(etorch.check_ledger(s.ledger, 1000, 10), [])

    def test_check_ledger_finds_repeats_and_gaps(self):
        self.assertTrue(etorch.check_ledger([[0, 0, 8], [0, 0, 8]], 16, 8))
        self.assertTrue(etorch.check_ledger([[0, 8, 16]], 16, 8))
        self.assertEqual(etorch.check_ledger([[0, 0, 8], [0, 8, 16], [1, 0, 8]], 16, 8), [])

    def test_checkpoint_is_atomic_and_latest_wins(self):
        d = tempfile.mkdtemp()
        self.assertIsNone(etorch.load_checkpoint(d))
        etorch.save_checkpoint(d, {"step": 3, "x": 1})
        etorch.save_checkpoint(d, {"step": 5, "x": 2})
        self.assertEqual(etorch.load_checkpoint(d)["step"], 5)
        self.assertFalse([f for f in os.listdir(d) if f.endswith(".tmp")])

    def test_torn_or_dangling_latest_falls_back(self):
        # Finding H4: a torn `latest` restarted training at step 0, silently;
        # one naming a missing file crash-looped.
        d = tempfile.mkdtemp()
        etorch.save_checkpoint(d, {"step": 3})
        etorch.save_checkpoint(d, {"step": 5})
        with open(os.path.join(d, "latest"), "w") as f:
            f.write('{"file": "ckpt-000')  # torn
        self.assertEqual(etorch.load_checkpoint(d)["step"], 5)
        with open(os.path.join(d, "latest"), "w") as f:
            json.dump({"file": "ckpt-00000009.pt", "step": 9}, f)  # gone
        self.assertEqual(etorch.load_checkpoint(d)["step"], 5)
        with open(os.path.join(d, "ckpt-00000005.etjob"), "r+b") as f:
            f.truncate(os.path.getsize(f.name) - 1)  # torn: the next newest
        self.assertEqual(etorch.load_checkpoint(d)["step"], 3)
        with open(os.path.join(d, "ckpt-00000003.etjob"), "wb") as f:
            f.write(b"junk")
        # checkpoints exist and none loads: an error naming each, not step 0
        with self.assertRaisesRegex(etorch.CheckpointError, r"no checkpoint in .* loads .*ckpt-00000005.etjob: .*a header of \d+ bytes in a file of .*ckpt-00000003.etjob is not an etjob state file"):
            etorch.load_checkpoint(d)

    def test_pickles_are_refused_and_tensors_come_back(self):
        import pickle
        d = tempfile.mkdtemp()
        model = torch.nn.Linear(3, 2)
        etorch.save_checkpoint(d, {"step": 100000000, "model": model.state_dict(), "lr": 0.1})
        etorch.save_checkpoint(d, {"step": 99999999})  # 9 digits: the numbers, not the names, decide
        self.assertEqual(etorch.latest_step(d), 99999999)
        moved = etorch.load_checkpoint(d, map_location=lambda t: t.double())  # a function of a tensor
        self.assertEqual(moved["step"], 99999999)
        etorch.save_checkpoint(d, {"step": 99999999, "t": torch.ones(2)})
        self.assertEqual(etorch.load_checkpoint(d, map_location=lambda t: t.double())["t"].dtype, torch.float64)
        self.assertEqual(etorch.load_checkpoint(d, map_location="cpu")["t"].device.type, "cpu")
        with open(os.path.join(d, "latest"), "w") as f:
            f.write("{")
        got = etorch.load_checkpoint(d)
        self.assertEqual(got["step"], 100000000)
        self.assertTrue(torch.equal(got["model"]["weight"], model.weight.detach()))
        model.load_state_dict(got["model"])
        # a torch.save pickle (what etjob wrote before, or what a rooted
        # worker puts on the shared volume) never loads
        evil = tempfile.mkdtemp()
        with open(os.path.join(evil, "ckpt-00000007.pt"), "wb") as f:
            pickle.dump({"step": 7}, f)
        with self.assertRaisesRegex(etorch.CheckpointError, "a torch.save pickle.*does not unpickle"):
            etorch.load_checkpoint(evil)
        # a header that claims more bytes than the file holds allocates nothing
        forged = tempfile.mkdtemp()
        etorch.save_checkpoint(forged, {"step": 1, "t": torch.zeros(4)})
        from etjob import stateio
        header, _ = stateio.flatten({"step": 1, "t": torch.zeros(4)})
        header["tensors"][0]["shape"] = [4 << 40]
        header["nbytes"] = 16 << 40
        raw = stateio.dumps(header)
        with open(os.path.join(forged, "ckpt-00000001.etjob"), "wb") as f:
            f.write(stateio.MAGIC + len(raw).to_bytes(8, "little") + raw + bytes(16))
        with self.assertRaisesRegex(etorch.CheckpointError, "the header says"):
            etorch.load_checkpoint(forged)

    def test_failed_save_cleans_up_and_says_why(self):
        # Finding H4: ENOSPC on the stop path exited 1 (a failure) and left
        # the temp file.
        d = tempfile.mkdtemp()
        etorch.save_checkpoint(d, {"step": 3})
        real = os.fsync
        def full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        os.fsync = full
        try:
            with self.assertRaises(etorch.CheckpointError) as ctx:
                etorch.save_checkpoint(d, {"step": 4})
            self.assertIn("No space left on device", str(ctx.exception))
            self.assertIn(d, str(ctx.exception))
            said = []
            self.assertIsNone(etorch.checkpoint_before_exit(d, {"step": 4}, log=said.append))
            self.assertIn("resumes from the previous one", said[0])
        finally:
            os.fsync = real
        self.assertFalse([f for f in os.listdir(d) if f.endswith(".tmp")])
        self.assertEqual(etorch.load_checkpoint(d)["step"], 3)

    def test_old_checkpoints_are_pruned(self):
        d = tempfile.mkdtemp()
        for step in range(1, 7):
            etorch.save_checkpoint(d, {"step": step}, keep=2)
        self.assertEqual(sorted(f for f in os.listdir(d) if f.startswith("ckpt-")), ["ckpt-00000005.etjob", "ckpt-00000006.etjob"])
        self.assertEqual(etorch.load_checkpoint(d)["step"], 6)

    def test_agree_without_a_process_group(self):
        self.assertTrue(etorch.agree(True))
        self.assertEqual(etorch.agree(False, True), (False, True))


@unittest.skipIf(etorch is None, "needs torch")
class AgreedStopTest(unittest.TestCase):
    """Real torchrun, two ranks: a leave signal stops both at one step, rank 0
    checkpoints that step, the run exits 75, and a restart resumes exactly
    after it: no committed step lost."""

    def run_train(self, agent, ckpt, epochs):
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), ETJOB_CHECKPOINT_DIR=ckpt,
                   ETJOB_NAMESPACE="ns", ETJOB_POD_NAME="w-0", WIDTH="8")
        if agent:
            env["ETJOB_AGENT_ADDR"] = agent.addr
        return subprocess.Popen(
            [sys.executable, "-m", "etjob.torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=2",
             os.path.join(REPO, "examples/digits/train.py"), "--epochs", str(epochs), "--checkpoint-every", "1000"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def test_leave_stops_all_ranks_at_one_step_with_zero_loss(self):
        agent = AgentStub()
        ckpt = tempfile.mkdtemp()
        try:
            p = self.run_train(agent, ckpt, epochs=30)
            lines = []
            for line in p.stdout:
                lines.append(line)
                if line.startswith("step=20 "):
                    agent.answer = {"action": "leave", "reason": "ReclaimNotice(test)"}
            code = p.wait(timeout=120)
            out = "".join(lines)
            self.assertEqual(code, 75, out[-2000:])
            stops = [l for l in lines if l.startswith("stop step=")]
            self.assertEqual(len(stops), 1, out[-2000:])
            stop_step = int(stops[0].split()[1].split("=")[1])
            self.assertTrue(any(l.startswith("checkpoint step=%d " % stop_step) for l in lines), out[-2000:])
            last = {}
            for st, rank in re.findall(r"step=(\d+) epoch=\d+ rank=(\d+) ", out):
                last[rank] = int(st)
            self.assertEqual(last, {"0": stop_step, "1": stop_step}, "both ranks stop at the agreed step")

            agent.answer = {"action": "none"}
            p = self.run_train(agent, ckpt, epochs=30)
            first_step = None
            resume = None
            for line in p.stdout:
                if line.startswith("resume step="):
                    resume = int(line.split()[1].split("=")[1])
                if line.startswith("step=") and first_step is None:
                    first_step = int(line.split()[0].split("=")[1])
                    p.kill()
            p.wait(timeout=60)
            self.assertEqual(resume, stop_step)
            self.assertEqual(first_step, stop_step + 1, "training resumes at the step after the agreed stop")
        finally:
            agent.close()


@unittest.skipIf(etorch is None, "needs torch")
class WorldInvariantTest(unittest.TestCase):
    """Real torchrun: the example's training computes the same model whatever
    the world size, so a run that was resized ends where an undisturbed one
    does (up to float rounding), and accuracy can be compared between them."""

    def train(self, procs, ckpt, epochs=1):
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), ETJOB_CHECKPOINT_DIR=ckpt, WIDTH="8",
                   ETJOB_AGENT_ADDR="")
        out = subprocess.run(
            [sys.executable, "-m", "etjob.torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=%d" % procs,
             os.path.join(REPO, "examples/digits/train.py"), "--epochs", str(epochs), "--checkpoint-every", "1000"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:])
        return etorch.load_checkpoint(ckpt)

    def test_same_model_for_one_two_and_three_ranks(self):
        one = self.train(1, tempfile.mkdtemp())
        for procs in (2, 3):
            other = self.train(procs, tempfile.mkdtemp())
            self.assertEqual(other["step"], one["step"])
            for name, p in one["model"].items():
                q = other["model"][name]
                self.assertTrue(torch.allclose(p, q, rtol=1e-4, atol=1e-5),
                                "%s differs between 1 and %d ranks by %g" % (name, procs, (p - q).abs().max().item()))


if __name__ == "__main__":
    unittest.main()
