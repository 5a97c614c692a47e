"""etjob.elastic's store traffic as the job grows (issue #43): a generation
change costs O(N) store calls, not O(N^2).

- BulkStore (etjob.groupstore) under a real gloo group: every rank's
  address in a few store calls a rank, on the torch this runs.
- scale_harness at N = 24 (threads with a FAKE process group, the real
  etjob.rdzv store and its front): the store calls of the rendezvous after
  a hard kill and after a join stay within 20 a rank (30 on torch 1.13,
  which polls). On the commit this work started from (901f045) it failed
  on torch 2.15: "AssertionError: 3690 not less than or equal to 480"
  (every rank read every arrival's code and every peer's address).
make bench-scale-elastic measures the same at 16, 64 and 256 ranks."""

import os
import re
import tempfile
import threading
import time
import unittest
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    from etjob import groupstore, storeauth, storeclient
except ImportError:  # pragma: no cover - the lane without torch skips
    dist = None


@unittest.skipIf(dist is None, "needs torch")
class BulkStoreTest(unittest.TestCase):
    """A real gloo group of 6 threads over BulkStore: it works, and each
    rank's calls to the store under it do not grow with the group."""

    N = 6

    def test_a_gloo_group_reads_its_peers_in_bulk(self):
        import scale_harness

        master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
        h = scale_harness.Harness(1, self.N)  # its counts only: nothing installed, no rank started
        out, errs, keep = {}, [], []

        def rank(r):
            try:
                c = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=30))
                counting = scale_harness.CountingStore(c, h, r)  # referenced here: a Python store only C++ holds is gone
                store = groupstore.BulkStore(dist.PrefixStore("g/", counting), r, self.N, timedelta(seconds=30))
                pg = dist.ProcessGroupGloo(store, r, self.N, timedelta(seconds=30))
                keep.append((pg, store, counting, c))
                t = torch.tensor([float(r)])
                pg.allreduce([t]).wait()
                out[r] = t.item()
            except Exception as e:  # noqa: BLE001 - reported below
                errs.append("rank %d: %r" % (r, e))

        ts = [threading.Thread(target=rank, args=(r,)) for r in range(self.N)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(errs, [])
        self.assertEqual(out, {r: float(sum(range(self.N))) for r in range(self.N)})
        # a family is a set, a claim, a wait and a get a rank (its claimant:
        # a set, a claim, a wait, one read a key or one multi_get, and the
        # bulk value's set); torch 1.13's gloo has two families (host
        # names, addresses), 2.x one
        families = 2 if torch.__version__.startswith("1.") else 1
        calls = {r: h.counts.total(ranks=[r]) for r in range(self.N)}
        ordered = sorted(calls.values())
        self.assertLessEqual(ordered[-families - 1], 4 * families, calls)  # all but the claimants
        self.assertLessEqual(sum(calls.values()), 4 * families * self.N + (self.N + 1) * families, calls)

    def test_family(self):
        self.assertEqual(groupstore.family("0/3", 3), "0/")
        self.assertEqual(groupstore.family("0/rank_12", 12), "0/rank_")
        self.assertIsNone(groupstore.family("0/13", 3))
        self.assertIsNone(groupstore.family("0/3", 4))
        values = [b"", b"\x00\x01", b"x" * 300]
        self.assertEqual(groupstore.unpack(groupstore.pack(values), 3), values)
        with self.assertRaises(RuntimeError):
            groupstore.unpack(groupstore.pack(values), 2)


@unittest.skipIf(dist is None, "needs torch")
class GenerationChangeCallsTest(unittest.TestCase):
    """24 ranks (scale_harness: threads, a FAKE process group, the real
    store behind its front): a hard kill and a join each cost at most 20
    store calls a rank in the rendezvous, and every rank trains again."""

    N = 24

    def test_a_kill_and_a_join_cost_o_n_store_calls(self):
        import scale_harness

        d = tempfile.mkdtemp(prefix="etjob-scale-")
        secret = storeauth.write_secret(os.path.join(d, "store-secret"))
        port = scale_harness.free_port()
        with open(os.path.join(d, "store.err"), "w") as log:
            store = scale_harness.start_store(port, secret, log)
        self.addCleanup(store.wait)
        self.addCleanup(store.kill)
        saved = {k: os.environ.get(k) for k in ("ETJOB_RDZV_ENDPOINT", "ETJOB_STORE_SECRET_FILE")}
        os.environ.update(ETJOB_RDZV_ENDPOINT="127.0.0.1:%d" % port, ETJOB_STORE_SECRET_FILE=secret)
        for k, v in saved.items():
            self.addCleanup(lambda k=k, v=v: os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v))
        h = scale_harness.Harness(min_size=2, max_size=self.N)
        h.install()
        self.addCleanup(h.uninstall)
        self.addCleanup(h.close)
        ranks = h.start(self.N)
        h.wait_all_at(ranks, self.N, timeout=120)
        time.sleep(1)
        kill = scale_harness.change(h, ranks[:-1], self.N - 1, victim=ranks[-1], timeout=120)
        join = scale_harness.change(h, ranks[:-1], self.N, joiners=1, timeout=120)
        print("\n%d ranks: a hard kill cost %d store calls in the rendezvous (%.0f s to training), a join %d" % (
            self.N, kill["rdzv_calls"], kill["fault_to_training_s"], join["rdzv_calls"]))
        # torch 2.x waits in the store for the close (one call a beat);
        # torch 1.13's client cannot wait with a timeout and stay in step,
        # so its ranks poll, at most 0.1 s apart (a hard kill's pause): 21-24
        # a rank measured, alone and beside the other lanes
        bound = 20 if storeclient.WAIT_SAFE else 30
        self.assertLessEqual(kill["rdzv_calls"], bound * self.N)
        self.assertLessEqual(join["rdzv_calls"], bound * self.N)


try:
    from test_elastic import Undisturbed
except ImportError:  # pragma: no cover - the lane without torch skips
    Undisturbed = object


@unittest.skipIf(dist is None, "needs torch")
class SixteenRanksTest(Undisturbed, unittest.TestCase):
    """16 real worker processes (elastic_worker.py: a tiny model, real gloo
    groups, the real store behind its front): a hard kill and a join, every
    rank's final model the undisturbed run's, no survivor restarted."""

    STEPS = 400

    def test_sixteen_ranks_survive_a_hard_kill_and_a_join(self):
        job = self.job(16, "2:16", steps=self.STEPS, env={"STEP_SLEEP": "0.05"})
        g16, at_step = job.wait_world(16, timeout=180)
        job.wait_step(at_step + 5, timeout=120)
        pids = {n: p.pid for n, p in job.procs.items()}
        killed = time.time()
        job.procs["w15"].kill()
        survivors = ["w%d" % i for i in range(15)]
        g15, _ = job.wait_world(15, timeout=120)
        back = min(s[5] for s in job.steps("w0") if s[3] == g15)
        name = job.start()
        joined, _ = job.wait_world(16, name=name, timeout=180)
        self.assertGreater(joined, g15, job.dump())
        codes = job.wait_exit(survivors + [name], timeout=300)
        self.assertEqual(set(codes.values()), {0}, job.dump())
        self.assert_survivors_kept_their_process(job, survivors, pids)
        self.assert_finished_like_undisturbed(job, survivors + [name])
        print("\n16 ranks: training at 15 %.1f s after the kill, the joiner trained from step %d" % (
            back - killed, job.steps(name)[0][0]))


@unittest.skipIf(dist is None, "needs torch")
class VoteSizeTest(unittest.TestCase):
    """A commit's vote (one all-reduce a step) has the same size at 4 ranks
    and at 1,000: whether any rank leaves, not one slot a rank (who leaves
    is asked in a second all-reduce, only then). Before: 4 + 8 and 1,000 +
    8 numbers."""

    def test_the_vote_does_not_grow_with_the_ranks(self):
        import types

        from etjob import generations
        from etjob import state as state_module

        sup = types.SimpleNamespace(check_alive=lambda: True, beat=lambda *a: None, should_checkpoint=lambda: False)
        sizes = []
        for n in (4, 1000):
            ctx = types.SimpleNamespace(_joins=(0, 0), max=n, local_size=1, sup=sup)
            s = state_module.State(step=0)
            object.__setattr__(s, "_ctx", ctx)
            sizes.append(len(s._flags(generations.Group(1, 0, n, None, []), extra=5)))
        self.assertEqual(sizes[0], sizes[1], "the vote's size at 4 and at 1,000 ranks: %s" % sizes)


@unittest.skipIf(dist is None, "needs torch")
class PodsTest(Undisturbed, unittest.TestCase):
    """Two pods of two ranks each (etjob.launch, real processes and gloo,
    the real store behind its front): the pod is one failure domain. One
    local rank SIGKILLed: its launcher kills its sibling and exits 137, the
    other pod trains on at world 2 in its own processes; a replacement pod
    brings the job back to 4; SIGTERM to a pod (its deletion): both its
    ranks leave at one commit (exit 75), the last pod finishes. Every
    rank's final model is the undisturbed run's, and a pod's ranks are
    adjacent in every generation."""

    # 500: at 300 (12 s at STEP_SLEEP 0.04 after the kill) a clean-clone run
    # with the machine's 2 cores shared by other work started the replacement
    # pod 18 s after the kill, once the job had ended
    STEPS = 500

    def finals(self, job, name):
        """The (ledger, weight) of each of a pod's ranks that finished. The
        pod's ranks share its output file, as a pod's log, and print()
        writes a line's newline apart: their lines may run into each
        other ("ledger okdone step=..."), so they are found, not split."""
        with open(os.path.join(job.dir, name + ".out")) as f:
            text = f.read()
        ledgers = re.findall(r"ledger (ok|problems=[^\n]*)", text)
        weights = re.findall(r"done step=\d+ pid=\d+ weight=(-?[\d.]+(?:,-?[\d.]+)*)", text)
        return list(zip(["ledger " + l for l in ledgers], weights))

    def test_a_pod_leaves_and_joins_whole(self):
        job = self.job(2, "1:2", steps=self.STEPS, env={"STEP_SLEEP": "0.04"}, per_pod=2)
        _, at = job.wait_world(4, timeout=180)
        job.wait_step(at + 5, timeout=120)
        ranks = {}  # pid -> (pod, rank) at world 4
        for name in ("w0", "w1"):
            for s in job.steps(name):
                if s[2] == 4:
                    ranks[s[4]] = (name, s[1])
        for name in ("w0", "w1"):
            mine = sorted({r for pod, r in ranks.values() if pod == name})
            self.assertEqual(len(mine), 2, job.dump("%s's ranks at world 4: %s" % (name, mine)))
            self.assertEqual(mine[0] // 2, mine[1] // 2, job.dump("%s's ranks are not adjacent: %s" % (name, mine)))
        survivors = sorted(pid for pid, (pod, _) in ranks.items() if pod == "w0")
        victim = max(pid for pid, (pod, _) in ranks.items() if pod == "w1")
        killed = time.time()
        os.kill(victim, 9)
        codes = job.wait_exit(["w1"], timeout=30)
        self.assertEqual(codes["w1"], 137, job.dump("the killed rank's pod:"))
        self.assertTrue(any("other running rank(s) were killed with it" in l for l in job.lines("w1", "err")), job.dump())
        g2, _ = job.wait_world(2, timeout=120)
        back = min(s[5] for s in job.steps("w0") if s[3] == g2)
        name = job.start()
        joined, _ = job.wait_world(4, name=name, timeout=180)
        self.assertGreater(joined, g2, job.dump())
        job.wait_step(max(s[0] for s in job.steps(name)) + 5, names=[name], timeout=60)
        job.procs[name].send_signal(15)  # the pod deleted: both ranks leave at one commit
        codes = job.wait_exit([name], timeout=60)
        self.assertEqual(codes[name], 75, job.dump("the deleted pod:"))
        left = [l for l in job.lines(name, "err") if "leaving at step" in l]
        self.assertEqual(len(left), 2, job.dump("the deleted pod's ranks: %s" % left))
        self.assertEqual(len({l.split("leaving at step ")[1].split()[0] for l in left}), 1, job.dump("not one step: %s" % left))
        codes = job.wait_exit(["w0"], timeout=300)
        self.assertEqual(codes["w0"], 0, job.dump())
        self.assertEqual(sorted({s[4] for s in job.steps("w0")}), survivors, job.dump("w0 restarted a rank"))
        finals = self.finals(job, "w0")
        self.assertEqual(len(finals), 2, job.dump())
        want = [float(v) for v in self.want.split(",")]
        for ledger, weight in finals:
            self.assertEqual(ledger, "ledger ok", job.dump())
            for g, w in zip([float(v) for v in weight.split(",")], want):
                self.assertAlmostEqual(g, w, delta=1e-4, msg="a rank ended with another model (%s) than the "
                                       "undisturbed run (%s)" % (weight, self.want))
        print("\n2 pods x 2 ranks: training at world 2 %.1f s after a local rank's kill" % (back - killed))


@unittest.skipIf(dist is None, "needs torch")
class WorldSizesTest(Undisturbed, unittest.TestCase):
    """spec.worldSizes [2, 4] ($ETJOB_WORLD_SIZES): 3 ranks form a world of
    2 and the third waits as a spare; a fourth brings 4; a hard kill leaves
    3, which train at 2 (one a spare again). No world of 3 ever, and every
    rank that finished holds the undisturbed run's model."""

    STEPS = 300

    def test_only_the_listed_world_sizes_form(self):
        job = self.job(3, "1:8", steps=self.STEPS, env={"STEP_SLEEP": "0.03", "ETJOB_WORLD_SIZES": "2,4"})
        end = time.monotonic() + 180
        while not any(s[2] == 2 for n in job.procs for s in job.steps(n)):  # any two of the three
            self.assertLess(time.monotonic(), end, job.dump("no world of 2"))
            time.sleep(0.05)
        job.wait_step(job.max_step() + 10, timeout=120)
        spares = [n for n in job.procs if any("waits as a spare" in l for l in job.lines(n, "err"))]
        self.assertEqual(len(spares), 1, job.dump("spares: %s" % spares))
        job.start()
        g4, at = job.wait_world(4, name=spares[0], timeout=180)
        job.wait_step(at + 10, timeout=120)
        victim = sorted(job.procs)[0]
        job.procs[victim].kill()
        others = [n for n in job.procs if n != victim]
        end = time.monotonic() + 120
        while not any(s[2] == 2 and s[3] > g4 for n in others for s in job.steps(n)):
            self.assertLess(time.monotonic(), end, job.dump("no world of 2 after the kill"))
            time.sleep(0.1)
        codes = job.wait_exit(others, timeout=300)
        self.assertEqual(set(codes.values()), {0}, job.dump())
        worlds = {s[2] for n in job.procs for s in job.steps(n)}
        self.assertLessEqual(worlds, {2, 4}, job.dump("worlds formed: %s" % sorted(worlds)))
        finished = [n for n in others if job.done(n)[1] is not None]
        self.assertGreaterEqual(len(finished), 2, job.dump())
        self.assert_finished_like_undisturbed(job, finished)


@unittest.skipIf(dist is None, "needs torch")
class VotePodsTest(PodsTest):
    """PodsTest with the script a DDP team brings (elastic_worker.py's
    API=vote: torch's DDP through etjob.elastic.DistributedDataParallel and
    the vote-then-step Optimizer), its undisturbed run too: the pod's leave
    goes through the DDP vote's who-leaves."""

    ENV = {"API": "vote"}
