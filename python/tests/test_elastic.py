"""etjob.elastic with real gloo process groups: worker processes on this
machine, a real TCPStore as the job's rendezvous store. Each test disturbs a
running job (a hard kill, a freeze, a join, a leave, a stop below min) and
checks what the issue asks: no survivor restarted, at most one step done
again, the sampler ledger exact, every rank ends with the same model as an
undisturbed run. Timings are printed, never asserted (docs/benchmarks.md)."""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    import torch.distributed as dist
    from etjob import elastic, storeauth
except ImportError:  # pragma: no cover
    dist = None


def store_secret(directory):
    """store_secret writes a job's store secret into directory, as the
    controller's Secret would be mounted, and returns its path."""
    return storeauth.write_secret(os.path.join(directory, "store-secret"))

_zygote = []


def zygote():
    """The test process's worker zygote (worker_zygote.py: workers forked
    from a process that imported torch once), started at its first use."""
    if not _zygote or _zygote[0].proc.poll() is not None:  # none yet, or it died: a new one
        import worker_zygote

        _zygote[:] = [worker_zygote.Zygote(dict(os.environ, PYTHONPATH=os.path.join(REPO, "python") + os.pathsep + HERE))]
    return _zygote[0]


STEP = re.compile(r"^step=(\d+) rank=(\d+) world=(\d+) gen=(\d+) pid=(\d+) t=([\d.]+)$")


class Job:
    """Job runs elastic_worker.py processes against a store of its own,
    which authenticates them with the job's secret as a launcher's does
    (etjob.storeauth): test.store is the store's own server object, the
    front of the test process serves the port."""

    def __init__(self, test, n, nnodes, steps=150, env=None, store_process=False, replacement=0, per_pod=1):
        self.per_pod = per_pod  # ranks a worker: etjob.launch starts them (w<i> is then a pod)
        self.dir = tempfile.mkdtemp(prefix="etjob-elastic-")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        self.port = port
        self.store_proc = None
        self.secret = store_secret(self.dir)
        if store_process:
            # the launcher's own store (etjob.rdzv), in a process that a
            # test kills and starts again (start_store)
            test.addCleanup(self.kill_store)
            self.start_store(replacement)
            self.store = None
        else:
            self.store, inner = storeauth.loopback_store(timedelta(seconds=300))
            # port 0: the front binds a free port itself (a port picked here
            # and bound later was taken in between by another shard's
            # process in a CI run: "Address already in use")
            self.front = storeauth.Front("127.0.0.1", 0, ("127.0.0.1", inner), storeauth.load_secret(self.secret),
                                         who="test store")
            self.port = self.front.port
        self.env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python") + os.pathsep + HERE,
                        ETJOB_RDZV_ENDPOINT="127.0.0.1:%d" % self.port, PET_NNODES=nnodes, PET_RDZV_ID="test",
                        STEPS=str(steps), ETJOB_COLLECTIVE_TIMEOUT="3", ETJOB_STORE_SECRET_FILE=self.secret)
        self.env.update(env or {})
        self.env.pop("ETJOB_AGENT_ADDR", None)
        self.procs = {}
        test.addCleanup(self.close)
        for i in range(n):
            self.start()

    def start(self, held=False):
        """start runs the next worker; held: it imports torch, then waits
        for release(name) before it touches etjob.elastic (a joiner's
        arrival is then the test's choice, not the import's pace on a
        loaded machine)."""
        i = len(self.procs)
        name = "w%d" % i
        env = dict(self.env, ETJOB_POD_NAME=name)
        if held:
            env["HOLD_FILE"] = os.path.join(self.dir, name + ".go")
        script = os.path.join(HERE, self.env.get("WORKER_SCRIPT", "elastic_worker.py"))  # loader_worker.py: the DataLoader's shape
        out, err = os.path.join(self.dir, name + ".out"), os.path.join(self.dir, name + ".err")
        if self.per_pod > 1:
            # a pod of several ranks: etjob.launch's processes, one output
            # file for the pod as its log is (each line names its rank)
            with open(out, "w") as o, open(err, "w") as e:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "etjob.launch", "--nproc-per-node", str(self.per_pod), script],
                    env=dict(env, ETJOB_SLOTS_PER_WORKER=str(self.per_pod)), stdout=o, stderr=e)
        elif os.environ.get("ETJOB_TEST_WORKER_START", "fork") == "exec":
            with open(out, "w") as o, open(err, "w") as e:
                self.procs[name] = subprocess.Popen([sys.executable, script], env=env, stdout=o, stderr=e)
        else:
            for path in (out, err):  # there before the worker is, as the test reads them at once
                open(path, "w").close()
            self.procs[name] = zygote().start(script, env, out, err)
        return name

    def release(self, name, timeout=120):
        """release lets a held worker go on, once it imported torch."""
        end = time.monotonic() + timeout
        while "held" not in self.lines(name):
            if time.monotonic() > end or self.procs[name].poll() is not None:
                raise AssertionError("%s never got ready to join:\n%s" % (name, self.dump()))
            time.sleep(0.05)
        open(os.path.join(self.dir, name + ".go"), "w").close()

    def start_store(self, replacement):
        """start_store runs etjob.rdzv on the job's port, as a launcher
        that replaces replacement others, and waits until it listens."""
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), ETJOB_RDZV_REPLACEMENT=str(replacement),
                   ETJOB_STORE_SECRET_FILE=self.secret)
        for attempt in range(3):
            with open(os.path.join(self.dir, "store.err"), "a") as err:
                self.store_proc = subprocess.Popen([sys.executable, "-m", "etjob.rdzv", "--host", "127.0.0.1", "--port", str(self.port)],
                                                   env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            line = self.store_proc.stdout.readline()
            if "listening" in line:
                return
            self.store_proc.wait()
            with open(os.path.join(self.dir, "store.err")) as f:
                said = f.read()
            # the free port this job picked was taken before the store bound
            # it (five shards of tests start processes at once): before any
            # worker knows the port, pick another
            if "in use" not in said or getattr(self, "procs", None) or replacement:
                break
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
            s.close()
        raise AssertionError("the store did not listen: %r\n%s" % (line, said))

    def store_proc_err(self):
        """store_proc_err is what the store processes wrote to stderr."""
        with open(os.path.join(self.dir, "store.err")) as f:
            return f.read()

    def kill_store(self):
        """kill_store SIGKILLs the store process (the launcher's loss)."""
        if self.store_proc is not None and self.store_proc.poll() is None:
            self.store_proc.kill()
            self.store_proc.wait()
            self.store_proc.stdout.close()

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if getattr(self, "front", None) is not None:
            self.front.close()

    def lines(self, name, ext="out"):
        with open(os.path.join(self.dir, name + "." + ext)) as f:
            return f.read().splitlines()

    def steps(self, name):
        return [tuple(float(v) if "." in v else int(v) for v in m.groups())
                for m in (STEP.match(line) for line in self.lines(name)) if m]

    def max_step(self):
        return max((s[0] for n in self.procs for s in self.steps(n)), default=0)

    def wait_step(self, k, names=None, timeout=60):
        """wait_step waits until a step line >= k is logged by one of names (all workers)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for n in names or self.procs:
                if any(s[0] >= k for s in self.steps(n)):
                    return
            time.sleep(0.02)
        raise AssertionError("no step %d in %.0f s:\n%s" % (k, timeout, self.dump()))

    def wait_line(self, name, text, ext="err", timeout=60):
        """wait_line waits until a line of name's output (err: stderr)
        holds text."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in line for line in self.lines(name, ext)):
                return
            time.sleep(0.02)
        raise AssertionError("%s wrote no %r in %.0f s:\n%s" % (name, text, timeout, self.dump()))

    def wait_world(self, n, name="w0", timeout=60):
        """wait_world waits until name logs a step in a world of n and
        returns (generation, step) of that step. Workers that start a few
        seconds apart (a loaded machine imports torch slowly) meet in more
        than one generation first: a test that disturbs "all n" waits for
        this, and counts generations from it."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = [s for s in self.steps(name) if s[2] == n]
            if got:
                return got[0][3], got[0][0]
            time.sleep(0.02)
        raise AssertionError("%s logged no step in a world of %d in %.0f s:\n%s" % (name, n, timeout, self.dump()))

    def wait_exit(self, names, timeout=90):
        codes = {}
        end = time.monotonic() + timeout
        for n in names:
            try:
                codes[n] = self.procs[n].wait(max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise AssertionError("%s still runs after %.0f s:\n%s" % (n, timeout, self.dump()))
        return codes

    def dump(self, head=None):
        """dump is the workers' report for a failure's message: computed only
        when it is read (str), so that a message built for an assertion that
        holds costs nothing and signals nobody. Reading it asks every
        running worker for its stacks (SIGUSR1, faulthandler), which can
        crash a Python process whose threads start or end at that moment
        (CPython dumps other threads' frames with no lock): a dump made on a
        passing path killed a worker with SIGSEGV in two CI runs."""
        return _Report(lambda: self._dump() if head is None else "%s\n%s" % (head, self._dump()))

    def _dump(self):
        for p in self.procs.values():  # the stacks of those still running (faulthandler)
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        out = []
        for n in self.procs:
            code = self.procs[n].poll()
            out.append("== %s (exit %s)" % (n, code))
            err = [l for l in self.lines(n, "err") if not l.startswith("step=")]
            fatal = [i for i, l in enumerate(err) if l.startswith("Fatal Python error")]
            if code is not None and code < 0 and fatal:
                # a crash: faulthandler's whole report, the crashing thread first
                out += err[:2] + ["..."] + err[fatal[-1]:][:80]
            else:
                out += err[-30:]
            out += self.lines(n)[-3:]
        store_err = os.path.join(self.dir, "store.err")
        if os.path.exists(store_err):  # the store's own process (store_process)
            with open(store_err) as f:
                out += ["== store (port %d)" % self.port] + f.read().splitlines()[-20:]
        return "\n".join(out)

    def done(self, name):
        """The final weights and ledger line of a worker that finished."""
        lines = self.lines(name)
        ledger = [l for l in lines if l.startswith("ledger")]
        done = [l for l in lines if l.startswith("done")]
        return (ledger[-1] if ledger else None), (done[-1].split("weight=")[1] if done else None)


class _Report:
    """_Report is a text computed when first read."""

    def __init__(self, make):
        self._make, self._text = make, None

    def __str__(self):
        if self._text is None:
            self._text = self._make()
        return self._text


def cpu_seconds(pid):
    """The CPU time (user + system) process pid used so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Script:
    """What Job asks of a test case, for a script (the benchmarks), which
    closes its job itself."""

    def addCleanup(self, fn):
        pass


def standalone_job(n, nnodes, **kw):
    """A Job outside a test case (the benchmarks): close it yourself."""
    return Job(_Script(), n, nnodes, **kw)


def resumes(job):
    """Each generation's `resume step=S` (rank 0) with the highest step
    logged by any rank before it: (generation, step, steps done again)."""
    lines = []
    for n in job.procs:
        for line in job.lines(n):
            m = re.match(r"^resume step=(\d+) world=(\d+) generation=(\d+) t=([\d.]+)$", line)
            if m:
                lines.append((float(m.group(4)), int(m.group(1)), int(m.group(3))))
    out = []
    for t, step, gen in sorted(lines):
        reached = max((s[0] for n in job.procs for s in job.steps(n) if s[5] < t), default=0)
        out.append((gen, step, reached - step))
    return out


class Undisturbed:
    """A test case whose disturbed jobs must end like the undisturbed run of
    STEPS steps, trained once for the class (2 ranks: the model does not
    depend on the world size)."""

    STEPS = 150
    ENV = {}  # the script's shape (elastic_worker.py), for the undisturbed run and every job of the class

    @classmethod
    def setUpClass(cls):
        job = Job(cls, 2, "2:4", steps=cls.STEPS, env=dict(cls.ENV))
        codes = job.wait_exit(["w0", "w1"])
        assert codes == {"w0": 0, "w1": 0}, job.dump()
        cls.want = job.done("w0")[1]
        cls.want_extras = [l for l in job.lines("w0") if l.startswith("extras")]
        job.close()

    @classmethod
    def addCleanup(cls, fn):  # setUpClass has no instance
        cls._cleanups_cls = getattr(cls, "_cleanups_cls", []) + [fn]

    @classmethod
    def tearDownClass(cls):
        for fn in getattr(cls, "_cleanups_cls", []):
            fn()

    def job(self, n, nnodes, **kw):
        kw["env"] = dict(self.ENV, **(kw.get("env") or {}))
        j = Job(self, n, nnodes, **kw)
        return j

    def assert_finished_like_undisturbed(self, job, names):
        weights = set()
        for n in names:
            ledger, weight = job.done(n)
            self.assertEqual(ledger, "ledger ok", job.dump("%s:" % n))
            got = [float(v) for v in weight.split(",")]
            want = [float(v) for v in self.want.split(",")]
            # the same model up to float rounding (the sums run over other world sizes)
            for g, w in zip(got, want):
                self.assertAlmostEqual(g, w, delta=1e-4, msg="%s ended with another model (%s) than the undisturbed run (%s)" % (n, weight, self.want))
            weights.add(weight)
        self.assertEqual(len(weights), 1, "the replicas differ at the end: %s" % weights)
        for n in names:  # what else shapes the update (the learning rate, a GradScaler's scale)
            got = [l for l in job.lines(n) if l.startswith("extras")]
            self.assertEqual(got, self.want_extras, "%s ended with other extras than the undisturbed run" % n)

    def assert_survivors_kept_their_process(self, job, names, pids):
        for n in names:
            seen = {s[4] for s in job.steps(n)}
            self.assertEqual(seen, {pids[n]}, "%s's steps came from pids %s, not only %d" % (n, seen, pids[n]))

    def pause(self, job, names, at):
        """The last step line before at and the first after, over names."""
        times = sorted(s[5] for n in names for s in job.steps(n))
        before = max((t for t in times if t <= at), default=at)
        after = min((t for t in times if t > at), default=float("nan"))
        return after - before

    def resumes(self, job):
        return resumes(job)


@unittest.skipIf(dist is None, "needs torch")
class InProcessRecoveryTest(Undisturbed, unittest.TestCase):
    def test_hard_kill_survivors_go_on_in_process(self):
        job = self.job(4, "2:4")
        g4, at_step = job.wait_world(4)
        self.g4 = g4  # the generation the kill ends (FakeNCCLTest)
        job.wait_step(max(40, at_step + 3))
        pids = {n: p.pid for n, p in job.procs.items()}
        at = time.time()
        job.procs["w3"].kill()
        codes = job.wait_exit(["w0", "w1", "w2"])
        self.assertEqual(codes, {"w0": 0, "w1": 0, "w2": 0}, job.dump())
        self.assert_survivors_kept_their_process(job, ["w0", "w1", "w2"], pids)
        for gen, step, again in self.resumes(job):
            self.assertLessEqual(again, 1, "generation %d resumed at %d, %d steps done again" % (gen, step, again))
        # one generation more than the one of four: the kill's
        self.assertEqual(max(g for g, _, _ in self.resumes(job)), g4 + 1, job.dump())
        self.assert_finished_like_undisturbed(job, ["w0", "w1", "w2"])
        print("\nhard kill: training again after %.2f s" % self.pause(job, ["w0", "w1", "w2"], at))

    def test_frozen_rank_is_left_behind_then_fenced(self):
        job = self.job(4, "2:4", env={"STEP_SLEEP": "0.03"})
        g4, at_step = job.wait_world(4)
        job.wait_step(max(30, at_step + 3))
        pids = {n: p.pid for n, p in job.procs.items()}
        at = time.time()
        job.procs["w2"].send_signal(signal.SIGSTOP)
        # the others go on without it (the next generation, world 3)
        end = time.monotonic() + 30
        while time.monotonic() < end and not any(s[3] > g4 for s in job.steps("w0")):
            time.sleep(0.05)
        self.assertTrue(any(s[3] == g4 + 1 and s[2] == 3 for s in job.steps("w0")), job.dump())
        went_on = self.pause(job, ["w0", "w1", "w3"], at)
        job.procs["w2"].send_signal(signal.SIGCONT)
        codes = job.wait_exit(list(job.procs))
        self.assertEqual(set(codes.values()), {0}, job.dump())
        self.assert_survivors_kept_their_process(job, list(job.procs), pids)
        # the woken rank did not go on in its old generation: it came back as
        # a newcomer in a later one, with the state by broadcast.
        err = "\n".join(job.lines("w2", "err"))
        self.assertRegex(err, r"generation [3-9]\d* rank \d/4 pid %d step \d+ \(state from rank" % pids["w2"], job.dump())
        # fenced: in its old generation it got no further than the step it
        # was in when it froze (whose line it may print once it woke: it may
        # have finished that step alone, which the others then do again)
        went = [st for g, st, _ in self.resumes(job) if g == g4 + 1]
        self.assertEqual(len(went), 1, job.dump())
        late = [s for s in job.steps("w2") if s[3] == g4 and s[0] > went[0] + 1]
        self.assertEqual(late, [], "w2 went on in its old generation past step %d" % went[0])
        for gen, step, again in self.resumes(job):
            self.assertLessEqual(again, 1, "generation %d resumed at %d, %d steps done again" % (gen, step, again))
        self.assert_finished_like_undisturbed(job, list(job.procs))
        print("\nfrozen rank: the others trained again after %.2f s (collective timeout 3 s, heartbeat timeout 5 s)" % went_on)

    def test_joiner_takes_the_state_by_broadcast(self):
        # Slower steps (the same model): the joiner must arrive while the
        # others still train. At 20 ms a step the others finished their
        # remaining 120 steps (5.6 s) before a joiner still importing torch
        # 2.15 on a loaded machine asked to join (a CI run).
        # 0.2 s a step: the joiner, released at step 30, took 15 s to ask
        # to join in a loaded CI run (2026-12-07, five shards on two
        # cores), and at 0.1 s the others had reached their 150th and last
        # step by then
        job = self.job(3, "2:4", env={"STEP_SLEEP": "0.2"})
        # held until the others trained a while: it imports torch first (up
        # to 20 s on a loaded machine, longer than the others' remaining
        # steps took in a CI run)
        name = job.start(held=True)
        job.wait_step(30, names=["w0", "w1", "w2"])
        pids = {n: p.pid for n, p in job.procs.items() if n != name}
        at = time.time()
        job.release(name)
        job.wait_step(1, names=[name])
        codes = job.wait_exit(list(job.procs))
        self.assertEqual(set(codes.values()), {0}, job.dump())
        self.assert_survivors_kept_their_process(job, ["w0", "w1", "w2"], pids)
        first = job.steps(name)[0]
        self.assertGreater(first[0], 30, "the joiner started at step %d, not from the others' state" % first[0])
        self.assertEqual(first[2], 4)
        for gen, step, again in self.resumes(job):
            self.assertEqual(again, 0, "generation %d resumed at %d, %d steps done again" % (gen, step, again))
        self.assert_finished_like_undisturbed(job, list(job.procs))
        # the state went to the joiner only: the members, current, took none of it
        for n in ("w0", "w1", "w2"):
            self.assertTrue(any("not needed here" in l for l in job.lines(n, "err")), job.dump("%s:" % n))
        self.assertTrue(any(re.search(r"state from rank \d: [\d.]+ MB in", l) for l in job.lines(name, "err")), job.dump())
        joined = job.steps(name)[0][5]
        times = [s[5] for s in job.steps("w0")]
        gap = max(b - a for a, b in zip(times, times[1:]) if a >= at)
        print("\njoin: the longest pause of w0 from the start of the joiner to the end: %.2f s (joined after %.2f s)" % (gap, joined - at))

    def test_sigterm_leaves_at_a_commit(self):
        job = self.job(4, "2:4")
        job.wait_step(30)
        pids = {n: p.pid for n, p in job.procs.items()}
        job.procs["w1"].send_signal(signal.SIGTERM)
        self.assertEqual(job.wait_exit(["w1"]), {"w1": 75}, job.dump())
        codes = job.wait_exit(["w0", "w2", "w3"])
        self.assertEqual(set(codes.values()), {0}, job.dump())
        self.assert_survivors_kept_their_process(job, ["w0", "w2", "w3"], pids)
        for gen, step, again in self.resumes(job):
            self.assertEqual(again, 0, "generation %d resumed at %d, %d steps done again" % (gen, step, again))
        self.assert_finished_like_undisturbed(job, ["w0", "w2", "w3"])

    def test_a_newcomer_that_comes_after_the_end_exits_0(self):
        # A replacement pod that starts as the members finish: it used to
        # wait for a generation that never came (on the local cluster the
        # job stayed Completing for the controller's 60-s grace period)
        job = self.job(2, "2:4", steps=60)
        self.assertEqual(job.wait_exit(["w0", "w1"]), {"w0": 0, "w1": 0}, job.dump())
        began = time.monotonic()
        name = job.start()
        self.assertEqual(job.wait_exit([name], timeout=30), {name: 0}, job.dump())
        self.assertTrue(any("the job finished" in l for l in job.lines(name, "err")), job.dump())
        self.assertEqual(job.steps(name), [], "it trained nothing")
        print("\na newcomer after the end: exit 0 after %.2f s" % (time.monotonic() - began))

    def test_a_newcomer_beyond_max_waits_as_a_spare_until_a_member_leaves(self):
        # A job at its maximum: a newcomer must not end the members'
        # generation at every commit (the next one closes at the maximum
        # again, and whoever comes last asks again); it waits, and takes the
        # place of the first member that leaves.
        job = self.job(2, "1:2", env={"STEP_SLEEP": "0.1"})
        # it imports torch beside the members and waits to be released: the
        # members' 150 steps must not run out while a loaded machine imports
        name = job.start(held=True)
        job.wait_world(2)
        job.release(name)
        job.wait_line(name, "waits to join", timeout=60)
        at = time.time()
        # 30 commits (a step each) with the spare waiting, however slow the
        # machine: rank 0 voted its join at each of them before
        job.wait_step(job.max_step() + 30, names=["w0"])
        # (with min 1, w0 may have trained alone before w1 came: only the
        # steps since the spare waits count)
        gens = {s[3] for n in ("w0", "w1") for s in job.steps(n) if s[5] >= at}
        self.assertEqual(len(gens), 1, "the members' generations went %s while a spare waited:\n%s" % (sorted(gens), job.dump()))
        self.assertEqual(job.steps(name), [], "the spare trained beyond the maximum")
        job.procs["w1"].send_signal(signal.SIGTERM)
        self.assertEqual(job.wait_exit(["w1"]), {"w1": 75}, job.dump())
        job.wait_step(1, names=[name])
        self.assertEqual(job.steps(name)[0][2], 2, "the spare joined a world of %d, not 2" % job.steps(name)[0][2])
        self.assertEqual(job.wait_exit(["w0", name]), {"w0": 0, name: 0}, job.dump())
        self.assert_finished_like_undisturbed(job, ["w0", name])

    def test_below_min_everyone_stops_at_one_step_and_resumes_from_disk(self):
        self.stop_below_min_and_resume({})

    def test_below_min_with_a_save_slower_than_a_collective(self):
        # Rank 0's stop checkpoint takes 3 s, a collective may take 1: the
        # others used to wait for it in a barrier that timed out, ended the
        # generation, and the fence then refused the checkpoint.
        self.stop_below_min_and_resume({"SAVE_SECONDS": "3", "ETJOB_COLLECTIVE_TIMEOUT": "1", "CHECKPOINT_EVERY": "0"})

    def test_a_save_slower_than_a_collective_never_stops_training(self):
        # Every 25 steps rank 0 saves in the background, 3 s a save, while a
        # collective may take 1 s: training goes on in one generation, the
        # checkpoints land, every rank exits 0. (A synchronous save there
        # made the others time out in the next all-reduce; the fence refused
        # the rename and rank 0 exited 1.)
        ckpt = tempfile.mkdtemp(prefix="etjob-elastic-ckpt-")
        job = self.job(3, "2:4", env={"ETJOB_CHECKPOINT_DIR": ckpt, "SAVE_SECONDS": "3", "ETJOB_COLLECTIVE_TIMEOUT": "1",
                                      "CHECKPOINT_ASYNC": "1", "STEP_SLEEP": "0.05"})
        codes = job.wait_exit(list(job.procs), timeout=120)
        self.assertEqual(set(codes.values()), {0}, job.dump())
        for n in job.procs:
            rolled = [l for l in job.lines(n, "err") if "rolling back" in l or "took more than" in l]
            self.assertFalse(rolled, job.dump("%s: a collective gave up behind the save: %s" % (n, rolled)))
        landed = [l for n in job.procs for l in job.lines(n) if l.startswith("checkpoint ")]
        self.assertTrue(landed, job.dump("no background checkpoint landed:"))
        import etjob.torch as etorch
        self.assertGreaterEqual(etorch.latest_step(ckpt), 25)
        self.assert_finished_like_undisturbed(job, list(job.procs))

    def test_below_min_after_a_hard_loss_the_newest_commit_is_saved(self):
        # 3 ranks, min 3: a hard kill leaves 2, no replacement comes. The
        # survivors used to wait for the rendezvous' 600 s and exit 1 with
        # their commits lost; now, after ETJOB_BELOW_MIN_SECONDS, the one
        # with the newest commit saves it and both exit 75.
        ckpt = tempfile.mkdtemp(prefix="etjob-elastic-ckpt-")
        job = self.job(3, "3:4", env={"ETJOB_CHECKPOINT_DIR": ckpt, "ETJOB_BELOW_MIN_SECONDS": "3", "CHECKPOINT_EVERY": "0"})
        job.wait_step(30)
        job.procs["w2"].kill()
        codes = job.wait_exit(["w0", "w1"], timeout=60)
        self.assertEqual(codes, {"w0": 75, "w1": 75}, job.dump())
        stops = [l for n in ("w0", "w1") for l in job.lines(n) if l.startswith("stop step=")]
        self.assertEqual(len(stops), 1, job.dump())
        stopped = int(stops[0].split()[1].split("=")[1])
        reached = max(s[0] for n in ("w0", "w1") for s in job.steps(n))
        self.assertIn(stopped, (reached - 1, reached), "stopped at %d, step %d was logged" % (stopped, reached))
        import etjob.torch as etorch
        self.assertEqual(etorch.latest_step(ckpt), stopped)
        job.close()
        self.resume_from_disk(ckpt, stopped)

    def test_below_min_a_late_survivor_stops_too(self):
        # As above, but w1 is frozen through the wait: w0 alone stops the
        # generation and saves; w1, woken, comes to a generation stopped
        # below min after it closed, and stops too (exit 75) instead of
        # waiting alone as a newcomer for the 600 s join timeout (exit 1).
        ckpt = tempfile.mkdtemp(prefix="etjob-elastic-ckpt-")
        job = self.job(3, "3:4", env={"ETJOB_CHECKPOINT_DIR": ckpt, "ETJOB_BELOW_MIN_SECONDS": "3", "CHECKPOINT_EVERY": "0"})
        job.wait_step(30)
        job.procs["w1"].send_signal(signal.SIGSTOP)
        job.procs["w2"].kill()
        self.assertEqual(job.wait_exit(["w0"], timeout=60), {"w0": 75}, job.dump())
        job.procs["w1"].send_signal(signal.SIGCONT)
        self.assertEqual(job.wait_exit(["w1"], timeout=60), {"w1": 75}, job.dump())
        stops = [l for n in ("w0", "w1") for l in job.lines(n) if l.startswith("stop step=")]
        self.assertEqual(len(stops), 1, job.dump())
        import etjob.torch as etorch
        self.assertEqual(etorch.latest_step(ckpt), int(stops[0].split()[1].split("=")[1]))

    def stop_below_min_and_resume(self, env):
        ckpt = tempfile.mkdtemp(prefix="etjob-elastic-ckpt-")
        job = self.job(3, "3:4", env=dict(env, ETJOB_CHECKPOINT_DIR=ckpt))
        job.wait_step(30)
        job.procs["w2"].send_signal(signal.SIGTERM)
        codes = job.wait_exit(list(job.procs))
        self.assertEqual(set(codes.values()), {75}, job.dump())
        stops = [l for n in job.procs for l in job.lines(n) if l.startswith("stop step=")]
        self.assertEqual(len(stops), 1, job.dump())
        stopped = int(stops[0].split()[1].split("=")[1])
        self.assertEqual(stopped, job.max_step(), "stopped at %d, but step %d was reached" % (stopped, job.max_step()))
        job.close()
        self.resume_from_disk(ckpt, stopped)

    def resume_from_disk(self, ckpt, stopped):
        """A new job of 3 resumes from the stop's checkpoint at its step and
        ends like the undisturbed run."""
        again = self.job(3, "3:4", env={"ETJOB_CHECKPOINT_DIR": ckpt})
        codes = again.wait_exit(list(again.procs))
        self.assertEqual(set(codes.values()), {0}, again.dump())
        self.assertEqual(self.resumes(again)[0][1], stopped)
        self.assert_finished_like_undisturbed(again, list(again.procs))


class DumpTest(unittest.TestCase):
    """The workers' report is made when a failure's message is read, never
    when an assertion that holds is called: making it signals every running
    worker (SIGUSR1, for faulthandler's stacks), which crashed a worker
    whose threads were ending at that moment (SIGSEGV, two CI runs, on a
    passing path: `assertEqual(..., job.dump())`)."""

    def test_a_report_signals_nobody_until_read(self):
        job = Job(self, 0, "1:1")

        class Worker:
            signals = []

            def poll(self):
                return None

            def send_signal(self, sig):
                self.signals.append(sig)

        job.procs["w0"] = Worker()
        for ext in ("out", "err"):
            with open(os.path.join(job.dir, "w0." + ext), "w") as f:
                f.write("a line\n")
        self.addCleanup(job.procs.clear)
        report = job.dump("w0 failed:")
        self.assertEqual(Worker.signals, [], "a report signalled the workers before anyone read it")
        text = str(report)
        self.assertIn(signal.SIGUSR1, Worker.signals)
        self.assertTrue(text.startswith("w0 failed:\n== w0 (exit None)"), text)
        self.assertEqual(str(report), text)


@unittest.skipIf(dist is None or not getattr(elastic, "_ABORTABLE", False), "needs a torch whose gloo groups abort (2.x)")
class GenerationsTest(unittest.TestCase):
    def test_threads_and_fds_stay_bounded_over_generations(self):
        # rank 0 ends its generation every 2 steps (as a failure would):
        # each generation left behind is aborted and let go. On torch 1.13
        # (no abort) each one keeps +4 threads and +6 fds (bench_generations).
        job = Job(self, 2, "2:2", steps=124, env={"END_EVERY": "2", "STEP_SLEEP": "0", "ETJOB_SETTLE_SECONDS": "0.05"})
        codes = job.wait_exit(["w0", "w1"], timeout=300)
        self.assertEqual(codes, {"w0": 0, "w1": 0}, job.dump())
        rows = [tuple(int(float(v)) for v in m.groups()) for m in
                (re.match(r"^resources gen=(\d+) threads=(\d+) fds=(\d+) rss_mb=([\d.]+)$", l)
                 for l in job.lines("w0") + job.lines("w1")) if m]
        rows.sort()
        self.assertGreaterEqual(rows[-1][0], 50, rows[-3:])
        at10 = next(r for r in rows if r[0] >= 10)
        last = rows[-1]
        # slack for what is in flight at the moment of the count (a group's
        # setup thread, an aborted group parked until its work ends): a leak
        # of one group a generation is +200 threads and +300 fds here
        self.assertLessEqual(last[1], at10[1] + 6, "threads grew from %d (generation %d) to %d (%d)" % (at10[1], at10[0], last[1], last[0]))
        self.assertLessEqual(last[2], at10[2] + 12, "fds grew from %d (generation %d) to %d (%d)" % (at10[2], at10[0], last[2], last[0]))
        self.assertLessEqual(last[3], at10[3] + 50, "RSS grew from %d MB (generation %d) to %d MB (%d)" % (at10[3], at10[0], last[3], last[0]))


def local_context(prefix):
    """A Context of one rank (w0, sizes 1 to 2) on a TCPStore of its own, and
    the store's port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    return elastic.Context(store=store, prefix=prefix, ident="w0", min_size=1, max_size=2), port


@unittest.skipIf(dist is None, "needs torch")
class FenceTest(unittest.TestCase):
    def test_checkpoint_of_an_ended_generation_is_not_renamed_into_place(self):
        import torch
        import etjob.torch as etorch

        ctx, _ = local_context("fence/")
        ctx.group = elastic.Group(1, 0, 1, None, [1])
        model = torch.nn.Linear(2, 1)
        state = elastic.State(model=model, step=7)
        object.__setattr__(state, "_ctx", ctx)
        d = tempfile.mkdtemp(prefix="etjob-fence-")
        state.checkpoint(d)
        state.step = 9
        state._keep()
        ctx.end(1, "another rank went on")
        with self.assertRaises(etorch.CheckpointError):
            state.checkpoint(d)
        self.assertEqual(etorch.load_checkpoint(d)["step"], 7)
        self.assertFalse([n for n in os.listdir(d) if n.endswith(".tmp")])


@unittest.skipIf(dist is None, "needs torch")
class WatcherPaceTest(unittest.TestCase):
    """The heartbeat watcher asks the store whether the generation ended once
    a beat while the rank trains, and every tick (0.1 s) once a collective
    has waited longer than a moment: a rank stuck in a collective hears at
    once that another rank ended the generation, and a job's store is not
    asked ten times a second by every rank (before: every tick, always)."""

    def test_the_end_is_asked_once_a_beat_unless_a_collective_waits(self):
        # Counted against the watcher's own beats, not the clock: a loaded
        # machine's late ticks change how many fall in a second, not how
        # many fall between two beats.
        from etjob import generations

        ctx, port = local_context("pace/")
        seen = []  # "end" (an ask whether the generation ended) and "beat", in order

        class Counting(generations.StoreClient):
            def add(self, key, n):
                if key.endswith("/end") and n == 0:
                    seen.append("end")
                elif "/hb" in key and n == 1:
                    seen.append("beat")
                return super().add(key, n)

        def asks_between_beats(events):
            """The asks in each whole gap between two beats."""
            out, count, began = [], 0, False
            for e in events:
                if e == "beat":
                    if began:
                        out.append(count)
                    began, count = True, 0
                else:
                    count += 1
            return out

        real = generations.StoreClient
        generations.StoreClient = Counting
        self.addCleanup(setattr, generations, "StoreClient", real)
        ctx.heartbeat_timeout = 5.0  # a beat a second
        g = elastic.Group(1, 0, 1, None, [1])
        ctx.group = g
        ctx._watch(g)

        time.sleep(3.5)  # training: no collective in flight
        idle = asks_between_beats(list(seen))
        self.assertGreaterEqual(len(idle), 2, "fewer than 3 beats in 3.5 s: %s" % seen)
        self.assertTrue(all(n <= 1 for n in idle), "asks between beats with no collective in flight: %s" % idle)

        token = ctx.begin_flight()  # a collective that does not answer
        mark = len(seen)
        time.sleep(2.5)
        waiting = asks_between_beats(seen[mark:])
        # every tick (0.1 s), not once a beat
        self.assertTrue(waiting and all(n >= 3 for n in waiting),
                        "asks between beats while a collective waited: %s" % waiting)
        other = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
        mark = len(seen)
        other.add("pace/g1/end", 1)  # another rank ends the generation
        at = time.monotonic()
        while not ctx.over(1) and time.monotonic() - at < 5:
            time.sleep(0.01)
        self.assertTrue(ctx.over(1), "the end never heard")
        # heard within a beat: at most the beat in flight came first
        self.assertLessEqual(seen[mark:].count("beat"), 1, "the end heard after beats %s" % seen[mark:])
        ctx.end_flight(token)
        self.assertEqual(ctx.waited(), 0.0)


if __name__ == "__main__":
    unittest.main()


# An outsider's attack on a job's store: a plain c10d client (no secret), or
# etjob's own client holding another job's secret, adds to the key that ends
# the workers' generation. It prints what happened.
ATTACK = """
import sys
from datetime import timedelta
import torch.distributed as dist
from etjob import storeclient
port, key, how = int(sys.argv[1]), sys.argv[2], sys.argv[3]
try:
    if how == "plain":
        c = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
    else:
        c = storeclient.new_client("127.0.0.1", port, timedelta(seconds=5))
    print("added: %s" % c.add(key, 1), flush=True)
except Exception as e:
    print("refused: %s" % (str(e).splitlines() or ["?"])[0], flush=True)
"""


@unittest.skipIf(dist is None, "needs torch")
class StoreAuthTest(unittest.TestCase):
    """Issue #26, N1: the launcher's store (etjob.rdzv, with the job's
    secret) admits only clients that prove the secret. Outsiders that reach
    its port, one with a plain c10d client and one with etjob's client and
    another job's secret, try to end the workers' generation: both are
    refused before they touch a key, the store says so, and the workers
    train on in their generation."""

    def test_outsiders_cannot_end_a_generation(self):
        job = Job(self, 2, "2:2", steps=100000, env={"STEP_SLEEP": "0.05"}, store_process=True)
        gen, _ = job.wait_world(2)
        key = "etjob/elastic/test/g%d/end" % gen
        other = store_secret(tempfile.mkdtemp(prefix="etjob-other-"))
        out = {}
        for how in ("plain", "other-secret"):
            env = dict(job.env, ETJOB_STORE_SECRET_FILE=other) if how == "other-secret" else \
                {k: v for k, v in job.env.items() if k != "ETJOB_STORE_SECRET_FILE"}
            r = subprocess.run([sys.executable, "-c", ATTACK, str(job.port), key, how], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
            out[how] = r.stdout.strip() or "no answer (exit %d): %s" % (r.returncode, r.stderr[-300:])
        attacked = max(s[0] for s in job.steps("w0"))
        job.wait_step(attacked + 40)
        after = [s for n in job.procs for s in job.steps(n) if s[0] > attacked]
        self.assertEqual({s[3] for s in after}, {gen},
                         job.dump("the workers left generation %d after the attacks (%s):" % (gen, out)))
        for how, said in out.items():
            self.assertTrue(said.startswith("refused"), "%s: %s" % (how, said))
        job.kill_store()
        self.assertIn("without the job's secret", job.store_proc_err(), "the store logs whom it refused")
