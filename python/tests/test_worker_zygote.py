"""The tests' worker zygote (worker_zygote.py): a forked worker is a process
with its own environment and output files that exits through the
interpreter's normal exit, and its handle answers as subprocess.Popen's."""

import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
import threading
import time
import unittest

import worker_zygote

try:
    import torch  # noqa: F401 - the zygote imports it
except ImportError:  # pragma: no cover
    torch = None

SCRIPT = textwrap.dedent("""\
    import atexit, os, sys
    atexit.register(lambda: print("atexit ran", flush=True))
    print("env", os.environ.get("ZYGOTE_TEST"), "torch" in sys.modules, flush=True)
    if os.environ.get("ZYGOTE_TEST") == "sleep":
        import time
        time.sleep(60)
    sys.exit(int(os.environ.get("CODE", "0")))
""")


@unittest.skipIf(torch is None, "torch is not installed")
class ZygoteTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="etjob-zygote-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.script = os.path.join(self.dir, "w.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)
        self.zygote = worker_zygote.Zygote(dict(os.environ))
        self.addCleanup(self.zygote.close)

    def start(self, name, **env):
        out, err = (os.path.join(self.dir, name + ext) for ext in (".out", ".err"))
        return self.zygote.start(self.script, dict(os.environ, **env), out, err), out

    def test_exit_code_env_and_atexit(self):
        w, out = self.start("a", ZYGOTE_TEST="a", CODE="3")
        self.assertEqual(w.wait(60), 3)
        with open(out) as f:
            self.assertEqual(f.read().splitlines(), ["env a True", "atexit ran"])

    def test_kill_and_timeout(self):
        w, _ = self.start("b", ZYGOTE_TEST="sleep")
        self.assertIsNone(w.poll())
        with self.assertRaises(subprocess.TimeoutExpired):
            w.wait(0.2)
        w.kill()
        self.assertEqual(w.wait(30), -signal.SIGKILL)
        w.kill()  # a second kill of an ended worker is a no-op, as Popen's

    def test_a_dead_zygote_does_not_hang_a_wait(self):
        w, _ = self.start("c", ZYGOTE_TEST="sleep")
        self.zygote.proc.kill()
        os.kill(w.pid, signal.SIGKILL)
        end = time.monotonic() + 30
        while time.monotonic() < end and not self.zygote.gone:
            time.sleep(0.05)
        self.assertEqual(w.wait(30), -signal.SIGKILL)

    def test_a_worker_that_ends_after_its_zygote_is_seen(self):
        # nothing notifies a wait once the zygote is gone: it looks again at
        # least every second instead of sitting out its timeout (asserted on
        # what it asks of its condition, not on the clock)
        w, _ = self.start("d", ZYGOTE_TEST="sleep")
        self.zygote.proc.kill()
        end = time.monotonic() + 30
        while time.monotonic() < end and not self.zygote.gone:
            time.sleep(0.05)
        asked = []
        real_wait = self.zygote.ended.wait

        def recording_wait(timeout=None):
            asked.append(timeout)
            return real_wait(timeout)

        self.zygote.ended.wait = recording_wait
        killer = threading.Timer(1.5, os.kill, (w.pid, signal.SIGKILL))  # it ends while the test waits
        killer.start()
        self.addCleanup(killer.cancel)
        self.assertEqual(w.wait(60), -signal.SIGKILL)
        self.assertTrue(asked, "the wait never waited: the worker ended before it")
        self.assertTrue(all(t is not None and t <= 1.0 for t in asked), "the wait asked its condition for %s" % asked)

if __name__ == "__main__":
    unittest.main()
