"""kubeai compatibility: seed 000's `import kubeai.elastic as kubeai`."""

import threading
import unittest

import agentstub
import etjob.supervisor as sup


class KubeaiCompatTest(unittest.TestCase):
    def setUp(self):
        sup._default = None

    def tearDown(self):
        if sup._default is not None:
            sup._default.close()
        sup._default = None

    def test_names_signatures_and_return_values(self):
        stub = agentstub.AgentStub()
        self.addCleanup(stub.close)
        sup._default = sup.Supervisor(agent_addr=stub.addr, pod="w-0", namespace="ns", install_sigterm=False).start()
        import kubeai.elastic as kubeai
        import kubeai.handler as handler
        self.assertIsNone(kubeai.init())
        self.assertIs(kubeai.check_alive(), True)
        self.assertIs(handler.check_alive, kubeai.check_alive)
        stub.answer = {"action": "leave", "reason": "ReclaimNotice(aws)", "deadline": "", "source": "node"}
        done = threading.Event()
        for _ in range(50):
            if not kubeai.check_alive():
                done.set()
                break
            done.wait(0.05)
        self.assertTrue(done.is_set(), "check_alive() stayed True after the agent said leave")
        self.assertIs(kubeai.check_alive(), False)


if __name__ == "__main__":
    unittest.main()
