"""examples/gpt: the etjob.elastic version of the plain DDP script differs
from it in at most 8 lines of code, and trains the same model: 2 ranks, 20
steps each way, the same held-out loss (up to float rounding)."""

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
GPT = os.path.join(REPO, "examples", "gpt")

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None


def code(path):
    """The file's lines after its module docstring."""
    with open(path) as f:
        text = f.read()
    return text.split('"""', 2)[2].splitlines()


class AdoptionTest(unittest.TestCase):
    def test_the_elastic_script_changes_at_most_8_lines(self):
        plain, elastic = code(os.path.join(GPT, "train.py")), code(os.path.join(GPT, "train_elastic.py"))
        changed = 0
        for op, a1, a2, b1, b2 in difflib.SequenceMatcher(None, plain, elastic, autojunk=False).get_opcodes():
            if op != "equal":
                changed += max(a2 - a1, b2 - b1)
        self.assertLessEqual(changed, 8, "\n".join(difflib.unified_diff(plain, elastic, lineterm="")))


@unittest.skipIf(torch is None, "needs torch")
class SameModelTest(unittest.TestCase):
    def final_loss(self, cmd, env):
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-4000:])
        return self.loss(out.stdout)

    def loss(self, stdout):
        m = re.search(r"^final loss=([\d.]+) steps=20$", stdout, re.M)
        self.assertIsNotNone(m, stdout[-2000:])
        return float(m.group(1))

    def plain_ddp(self, env, n):
        """The plain script's n ranks, started as torchrun would (env://;
        Debian's torchrun 1.13 does not start on Python 3.11)."""
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n))
        procs = [subprocess.Popen([sys.executable, os.path.join(GPT, "train.py")], env=dict(env, RANK=str(i), LOCAL_RANK=str(i)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
        outs = [p.communicate(timeout=300) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, out[-2000:] + err[-4000:])
        return self.loss(outs[0][0])

    def test_elastic_trains_what_plain_ddp_trains(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), STEPS="20", LAYERS="2", EMBD="64",
                   BLOCK="64", CHECKPOINT_EVERY="1000")
        env.pop("ETJOB_AGENT_ADDR", None)
        plain = self.plain_ddp(dict(env, ETJOB_CHECKPOINT_DIR=tempfile.mkdtemp()), 2)
        elastic = self.final_loss([sys.executable, os.path.join(REPO, "hack", "elastic-local.py"), "2",
                                   os.path.join(GPT, "train_elastic.py")], dict(env, ETJOB_CHECKPOINT_DIR=tempfile.mkdtemp()))
        self.assertAlmostEqual(plain, elastic, delta=2e-3)
        print("\nheld-out loss after 20 steps: plain DDP %.4f, etjob.elastic %.4f" % (plain, elastic))


if __name__ == "__main__":
    unittest.main()
