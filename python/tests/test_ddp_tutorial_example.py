"""examples/ddp_tutorial: a plain DDP script shaped like PyTorch's DDP
tutorial (an epoch loop over a DataLoader with a DistributedSampler,
set_epoch, the tutorial's peek at a batch, rank 0's snapshot) adopts
etjob.elastic in at most 10 changed lines with no re-indent, and trains the
same model: 2 ranks of the plain script, 2 of the elastic one, and 3 of the
elastic one with the global batch made for 2 (each step's 32 samples split
11, 11, 10): the same held-out loss up to float rounding. The example under
a hard kill and a join on the local cluster: test/e2e's
TestTutorialStory."""

import difflib
import os
import re
import socket
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(REPO, "examples", "ddp_tutorial")

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None


def code(path):
    """The file's lines after its module docstring."""
    with open(path) as f:
        return f.read().split('"""', 2)[2].splitlines()


class AdoptionTest(unittest.TestCase):
    def test_the_elastic_script_changes_at_most_10_lines_and_reindents_none(self):
        plain, elastic = code(os.path.join(EXAMPLE, "train.py")), code(os.path.join(EXAMPLE, "train_elastic.py"))
        changed, diff = 0, "\n".join(difflib.unified_diff(plain, elastic, lineterm=""))
        indent = lambda line: len(line) - len(line.lstrip())  # noqa: E731
        for op, a1, a2, b1, b2 in difflib.SequenceMatcher(None, plain, elastic, autojunk=False).get_opcodes():
            if op != "equal":
                changed += max(a2 - a1, b2 - b1)
            if op == "replace":  # a line changed in place keeps its indentation
                for old, new in zip(plain[a1:a2], elastic[b1:b2]):
                    if old.strip() and new.strip() and not new.lstrip().startswith("return"):
                        self.assertEqual(indent(old), indent(new), "re-indented:\n%s\n%s" % (old, new))
        self.assertLessEqual(changed, 10, diff)


@unittest.skipIf(torch is None, "needs torch")
class SameModelTest(unittest.TestCase):
    ARGS = ["--epochs", "3", "--loader-workers", "1"]

    def loss(self, stdout):
        m = re.search(r"^final loss=([\d.]+)$", stdout, re.M)
        self.assertIsNotNone(m, stdout[-2000:])
        return float(m.group(1))

    def env(self, **kw):
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        for k in ("ETJOB_AGENT_ADDR", "workers"):
            env.pop(k, None)
        return dict(env, **kw)

    def plain_ddp(self, n):
        """The plain script's n ranks, started as torchrun would (env://;
        Debian's torchrun 1.13 does not start on Python 3.11)."""
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        env = self.env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n))
        snap = os.path.join(tempfile.mkdtemp(), "snapshot.pt")
        procs = [subprocess.Popen([sys.executable, os.path.join(EXAMPLE, "train.py"), "--snapshot", snap] + self.ARGS,
                                  env=dict(env, RANK=str(i), LOCAL_RANK=str(i)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
        outs = [p.communicate(timeout=300) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, out[-2000:] + err[-4000:])
        return self.loss(outs[0][0])

    def elastic(self, n, **env):
        snap = os.path.join(tempfile.mkdtemp(), "snapshot.pt")
        out = subprocess.run([sys.executable, os.path.join(REPO, "hack", "elastic-local.py"), str(n),
                              os.path.join(EXAMPLE, "train_elastic.py"), "--snapshot", snap] + self.ARGS,
                             env=self.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-4000:])
        self.assertIn("ledger ok", out.stdout)
        return self.loss(out.stdout)

    def test_elastic_trains_what_plain_ddp_trains_at_any_world(self):
        plain = self.plain_ddp(2)
        two = self.elastic(2)
        three = self.elastic(3, workers="2")  # the global batch made for 2 ranks, trained by 3
        self.assertAlmostEqual(two, plain, delta=1e-5)
        self.assertAlmostEqual(three, plain, delta=1e-5)
        print("\nheld-out loss after 3 epochs: plain DDP %.6f, etjob.elastic %.6f (2 ranks), %.6f (3 ranks)" % (
            plain, two, three))


if __name__ == "__main__":
    unittest.main()
