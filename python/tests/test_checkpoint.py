"""etjob.checkpoint: a checkpoint etjob.elastic wrote (a model, its
optimizer, a scheduler, the sampler, plain values) leaves in torch's formats
and comes back, through the command users run (python3 -m
etjob.checkpoint), on real torch."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    import torch
    from etjob import elastic
    from etjob import torch as etorch
except ImportError:  # pragma: no cover
    torch = None
try:
    import torch.distributed.checkpoint as dcp
except ImportError:  # pragma: no cover
    dcp = None


def cli(*args):
    return subprocess.run([sys.executable, "-m", "etjob.checkpoint"] + list(args), capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "python")))


@unittest.skipIf(torch is None, "needs torch")
class CheckpointTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.01)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2)
        for _ in range(3):  # optimizer state, scheduler steps, running stats
            self.opt.zero_grad()
            self.model(torch.randn(16, 4)).sum().backward()
            self.opt.step()
            self.sched.step()
        self.sampler = etorch.ElasticSampler(96, 8, seed=3)
        state = elastic.State(model=self.model, optimizer=self.opt, scheduler=self.sched, sampler=self.sampler,
                              step=7, epoch=1)
        state.commit()  # outside a job: counted and kept
        self.dir = tempfile.mkdtemp(prefix="etjob-ckpt-")
        state.checkpoint(self.dir)

    def fresh(self):
        torch.manual_seed(1)
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        return m, torch.optim.AdamW(m.parameters(), lr=0.01)

    def assert_same_model(self, m):
        for (k, a), (_, b) in zip(self.model.state_dict().items(), m.state_dict().items()):
            self.assertTrue(torch.equal(a, b), k)

    def test_export_to_torch_loads_with_torch_load(self):
        out = os.path.join(self.dir, "model.pt")
        got = cli("export", self.dir, out, "--object", "model")
        self.assertEqual(got.returncode, 0, got.stderr)
        m, _ = self.fresh()
        m.load_state_dict(torch.load(out))
        self.assert_same_model(m)
        whole = os.path.join(self.dir, "whole.pt")
        self.assertEqual(cli("export", self.dir, whole).returncode, 0)
        state = torch.load(whole, weights_only=False) if "weights_only" in torch.load.__code__.co_varnames else torch.load(whole)
        self.assertEqual((state["step"], state["values"]["epoch"]), (7, 1))
        _, opt = self.fresh()
        opt.load_state_dict(state["objects"]["optimizer"])
        self.assertEqual(opt.state_dict()["param_groups"][0]["lr"], self.opt.state_dict()["param_groups"][0]["lr"])

    def test_a_trusted_torch_file_comes_back_and_resumes(self):
        whole = os.path.join(self.dir, "whole.pt")
        self.assertEqual(cli("export", self.dir, whole).returncode, 0)
        back = tempfile.mkdtemp(prefix="etjob-back-")
        refused = cli("import", whole, back)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("--trusted", refused.stderr)
        self.assertIsNone(etorch.latest_step(back), "nothing written without --trusted")
        got = cli("import", whole, back, "--trusted")
        self.assertEqual(got.returncode, 0, got.stderr)
        m, opt = self.fresh()
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
        state = elastic.State(model=m, optimizer=opt, scheduler=sched, sampler=etorch.ElasticSampler(96, 8, seed=3),
                              step=0, epoch=0)
        self.assertTrue(state.load_checkpoint(back))
        self.assertEqual((state.step, state.epoch, state.commits), (7, 1, 1))
        self.assert_same_model(m)
        self.assertEqual(sched.last_epoch, self.sched.last_epoch)

    def test_a_plain_torch_checkpoint_is_imported(self):
        # a user's own torch.save({"model": ..., "optimizer": ..., "epoch": 3})
        mine = os.path.join(self.dir, "mine.pt")
        torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "epoch": 3}, mine)
        back = tempfile.mkdtemp(prefix="etjob-mine-")
        got = cli("import", mine, back, "--trusted", "--step", "40")
        self.assertEqual(got.returncode, 0, got.stderr)
        m, opt = self.fresh()
        state = elastic.State(model=m, optimizer=opt, step=0, epoch=0)
        self.assertTrue(state.load_checkpoint(back))
        self.assertEqual((state.step, state.epoch), (40, 3))
        self.assert_same_model(m)

    @unittest.skipIf(dcp is None or not hasattr(dcp, "save"), "torch's distributed checkpoint has save() from torch 2.2")
    def test_export_to_dcp_loads_with_dcp(self):
        out = os.path.join(self.dir, "dcp")
        got = cli("export", self.dir, out, "--to", "dcp", "--object", "model")
        self.assertEqual(got.returncode, 0, got.stderr)
        m, _ = self.fresh()
        sd = m.state_dict()
        dcp.load(sd, checkpoint_id=out, no_dist=True)
        m.load_state_dict(sd)
        self.assert_same_model(m)

    def test_a_wrong_object_is_named(self):
        got = cli("export", self.dir, os.path.join(self.dir, "x.pt"), "--object", "nope")
        self.assertNotEqual(got.returncode, 0)
        self.assertIn("--object nope: the checkpoint holds _rng, model, optimizer, sampler, scheduler", got.stderr)


if __name__ == "__main__":
    unittest.main()
