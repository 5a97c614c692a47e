import os
import signal
import tempfile
import threading
import time
import unittest
from datetime import datetime, timezone

from etjob import supervisor
from agentstub import AgentStub


class SupervisorTest(unittest.TestCase):
    def setUp(self):
        self.agent = AgentStub()
        self.token = tempfile.NamedTemporaryFile("w", delete=False)
        self.token.write("tok123\n")
        self.token.close()

    def tearDown(self):
        self.agent.close()
        os.unlink(self.token.name)

    def sup(self, **kw):
        return supervisor.Supervisor(agent_addr=self.agent.addr, namespace="ns", pod="p-0",
                                     token_path=self.token.name, install_sigterm=False,
                                     log=lambda m: None, **kw)

    def test_leave_turns_check_alive_false(self):
        s = self.sup()
        self.assertTrue(s.poll_once())
        self.assertTrue(s.check_alive())
        self.assertFalse(s.should_checkpoint())
        self.agent.answer = {"action": "leave", "reason": "ReclaimNotice(aws)", "deadline": "2026-11-29T10:00:00Z", "source": "aws"}
        s.poll_once()
        self.assertFalse(s.check_alive())
        self.assertTrue(s.should_checkpoint())
        self.assertEqual(s.reason(), "ReclaimNotice(aws)")
        self.assertEqual(s.deadline(), datetime(2026, 11, 29, 10, 0, tzinfo=timezone.utc).timestamp())
        path, auth = self.agent.requests[0]
        self.assertEqual(path, "/v1/signal?namespace=ns&pod=p-0")  # no step yet: no heartbeat
        self.assertEqual(auth, "Bearer tok123")

    def test_the_poll_carries_the_heartbeat(self):
        # a script that only calls check_alive() once a step: its calls are
        # the step, WORLD_SIZE and ETJOB_RDZV_ROUND (etjob.torchrun) the rest
        s = self.sup()
        os.environ["WORLD_SIZE"], os.environ["ETJOB_RDZV_ROUND"] = "4", "7"
        try:
            for _ in range(3):
                s.check_alive()
            s.poll_once()
        finally:
            del os.environ["WORLD_SIZE"], os.environ["ETJOB_RDZV_ROUND"]
        self.assertEqual(self.agent.requests[-1][0], "/v1/signal?namespace=ns&pod=p-0&step=3&world=4&round=7")
        # the library's own beat (etjob.elastic: agreed step, world, generation)
        s.beat(120, 3, 9)
        s.poll_once()
        self.assertEqual(self.agent.requests[-1][0], "/v1/signal?namespace=ns&pod=p-0&step=120&world=3&round=9")
        # a process that trains nothing (etjob.torchrun's agent) sends none:
        # its beat would be another world's, and the pod would look split
        quiet = self.sup(heartbeat=False)
        quiet.check_alive()
        quiet.poll_once()
        self.assertEqual(self.agent.requests[-1][0], "/v1/signal?namespace=ns&pod=p-0")

    def test_a_leave_stands(self):
        # Finding M5: an agent restarted during the notice may answer "none";
        # the rank must not go back to training.
        s = self.sup()
        self.agent.answer = {"action": "leave", "reason": "ReclaimNotice(aws)", "deadline": "2026-11-29T10:00:00Z", "source": "aws"}
        s.poll_once()
        self.agent.answer = {"action": "none"}
        s.poll_once()
        self.assertFalse(s.check_alive())
        self.assertEqual(s.reason(), "ReclaimNotice(aws)")

    def test_early_warning_asks_for_a_checkpoint_only(self):
        s = self.sup()
        self.agent.answer = {"action": "checkpoint", "reason": "rebalance"}
        s.poll_once()
        self.assertTrue(s.check_alive())
        self.assertTrue(s.should_checkpoint())
        # One checkpoint per warning, not one per step while it lasts.
        s.poll_once()
        self.assertFalse(s.should_checkpoint())
        self.assertTrue(s.check_alive())

    def test_a_notice_with_a_stop_time_trains_until_then(self):
        now = [datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc).timestamp()]
        s = self.sup(clock=lambda: now[0])
        self.agent.answer = {"action": "leave", "reason": "ReclaimNotice(aws)", "deadline": "2026-11-29T12:02:00Z",
                             "source": "aws", "stopAt": "2026-11-29T12:01:30Z"}
        s.poll_once()
        self.assertTrue(s.check_alive())
        self.assertTrue(s.should_checkpoint())  # once, at the notice, in case the node goes early
        self.assertFalse(s.should_checkpoint())
        self.assertEqual(s.stop_at(), now[0] + 90)
        now[0] += 89
        self.assertTrue(s.check_alive())
        now[0] += 1
        self.assertFalse(s.check_alive())
        self.assertTrue(s.should_checkpoint())
        self.assertEqual(s.reason(), "ReclaimNotice(aws)")

    def test_malformed_or_unknown_answers_keep_the_last_state(self):
        s = self.sup()
        self.agent.raw = b"{not json"
        self.assertFalse(s.poll_once())
        self.assertTrue(s.check_alive())
        self.agent.raw = None
        self.agent.answer = {"action": "explode"}
        self.assertFalse(s.poll_once())
        self.assertTrue(s.check_alive())

    def test_unreachable_agent_is_not_a_stop(self):
        s = supervisor.Supervisor(agent_addr="127.0.0.1:1", namespace="ns", pod="p", install_sigterm=False, log=lambda m: None)
        self.assertFalse(s.poll_once())
        self.assertTrue(s.check_alive())

    def test_background_polling(self):
        s = self.sup(interval=0.02).start()
        try:
            self.agent.answer = {"action": "leave", "reason": "ScaleIn"}
            deadline = time.time() + 5
            while s.check_alive() and time.time() < deadline:
                time.sleep(0.01)
            self.assertFalse(s.check_alive())
        finally:
            s.close()

    def test_sigterm_is_the_last_resort(self):
        s = supervisor.Supervisor(agent_addr="", install_sigterm=True, log=lambda m: None)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            self.assertFalse(s.check_alive())
            self.assertEqual(s.reason(), "SIGTERM")
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def test_sigterm_while_a_step_holds_the_lock(self):
        # Python runs a signal handler in the main thread between two
        # bytecodes: also while that thread holds the supervisor's lock,
        # which check_alive() takes once a step. A handler that took the lock
        # too waited for itself for good (a torch 2.15 lane run of
        # test_elastic's SIGTERM test hung 90 s in it).
        logged = []
        s = supervisor.Supervisor(agent_addr="", install_sigterm=False, log=logged.append)
        done = threading.Event()

        def step():
            with s._lock:  # as check_alive() holds it when the signal lands
                s._on_sigterm(signal.SIGTERM, None)
            done.set()

        threading.Thread(target=step, daemon=True).start()
        self.assertTrue(done.wait(5), "the SIGTERM handler waited for the lock its own thread held")
        self.assertFalse(s.check_alive())
        self.assertEqual(s.reason(), "SIGTERM")
        self.assertTrue(s.must_stop())
        self.assertEqual([m for m in logged if m.startswith("SIGTERM")], ["SIGTERM: finishing the step, then checkpoint and exit 75"])

    def test_progress_is_posted_with_the_token(self):
        s = self.sup()
        self.assertTrue(s.report_progress(40, 40, "ckpt-00000040.pt", 0.25))
        path, auth = self.agent.requests[-1]
        self.assertEqual(path, "/v1/progress?namespace=ns&pod=p-0")
        self.assertEqual(auth, "Bearer tok123")
        self.assertEqual(self.agent.bodies[-1], {"step": 40, "checkpointStep": 40, "checkpointPath": "ckpt-00000040.pt",
                                                 "checkpointSeconds": 0.25, "samplesPerSecond": 0.0, "workers": 0})
        # The throughput comes with the world size it was measured at.
        self.assertTrue(s.report_progress(50, 50, "ckpt-00000050.pt", 0.25, 812.5, 3))
        self.assertEqual(self.agent.bodies[-1]["samplesPerSecond"], 812.5)
        self.assertEqual(self.agent.bodies[-1]["workers"], 3)

    def test_the_api_token_is_never_sent_by_default(self):
        # Issue #26, L3: without $ETJOB_AGENT_TOKEN_PATH no token goes over
        # the agent's plain HTTP; the pod's API token used to, by default.
        import subprocess
        import sys
        env = {k: v for k, v in os.environ.items() if k != "ETJOB_AGENT_TOKEN_PATH"}
        out = subprocess.run([sys.executable, "-c", "from etjob import supervisor; print(supervisor.TOKEN_PATH)"],
                             env=env, stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
        self.assertEqual(out, "None", "the default token path")
        s = supervisor.Supervisor(agent_addr=self.agent.addr, namespace="ns", pod="p-0", token_path=None,
                                  install_sigterm=False, log=lambda m: None)
        s.poll_once()
        self.assertEqual(self.agent.requests[-1][1], None, "an Authorization header was sent")

    def test_exit_code_is_reserved(self):
        self.assertEqual(supervisor.EXIT_CODE_PREEMPTED, 75)


if __name__ == "__main__":
    unittest.main()
