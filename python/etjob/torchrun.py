"""torchrun for etjob workers: `python3 -m etjob.torchrun ARGS...`.

It runs torch.distributed.run unchanged (every torchrun flag and PET_* variable
works as documented) with two additions:

* Debian's torch 1.13 on Python 3.11 crashes at launch (FACTS.md: IntFlag
  iteration changed, so `Std.from_str("0")` returns None); Std.from_str is fixed.
* torch closes the rendezvous for every node whenever one agent exits other
  than by success (its launcher calls rdzv_handler.shutdown() in a finally:
  a SIGTERM from a pod deletion is enough), which ends the whole elastic job.
  Here an agent that did not succeed only leaves the rendezvous; the others go
  on, and a successful agent still closes it, as torch's completion needs.
* A worker told to leave (a reclamation notice, a scale-in: the node agent says
  so) stops at the step all ranks agreed on, after the checkpoint, with exit
  code 75. When that happens on a leaving pod, this agent leaves the rendezvous
  itself (survivors need not wait out the 15 s heartbeat expiry, FACTS.md) and
  exits 75, which the controller counts as a preemption. On a surviving pod the
  agent restarts its workers, which resume from the agreed step's checkpoint.
"""

import os
import sys
import time


def _patch_std():
    from torch.distributed.elastic.multiprocessing import api

    std = api.Std
    original = std.from_str

    def from_str(vm):
        got = original(vm)
        if got is not None:
            return got
        # Python 3.11: a plain "0".."3" no longer maps through the IntFlag loop.
        if isinstance(vm, str) and vm.strip().isdigit():
            return std(int(vm))
        if isinstance(vm, str) and ":" in vm:
            return {int(k): std(int(v)) for k, v in (kv.split(":") for kv in vm.split(","))}
        return got

    std.from_str = staticmethod(from_str)



def _patch_shutdown():
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    state = {"succeeded": False}
    run = api.SimpleElasticAgent.run

    def run_and_remember(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        state["succeeded"] = not result.is_failed()
        return result

    api.SimpleElasticAgent.run = run_and_remember
    shutdown = dr.DynamicRendezvousHandler.shutdown

    def leave_or_close(self):
        if state["succeeded"]:
            return shutdown(self)
        self._stop_heartbeats()
        try:
            self._op_executor.run(dr._RendezvousExitOp(), time.monotonic() + 10)
        except Exception as e:  # the store may be gone; heartbeats expire anyway
            print("etjob.torchrun: leaving the rendezvous failed: %s" % e, file=sys.stderr, flush=True)
        return True

    dr.DynamicRendezvousHandler.shutdown = leave_or_close


def _patch_leaving(sup):
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    original = api.SimpleElasticAgent._restart_workers

    def _restart_workers(self, worker_group):
        sup.poll_once()  # the workers may have heard it a poll earlier
        if not sup.check_alive():
            print("etjob.torchrun: this pod leaves (%s): leaving the rendezvous and exiting %d"
                  % (sup.reason(), sup_module.EXIT_CODE_PREEMPTED), file=sys.stderr, flush=True)
            try:
                self._stop_workers(worker_group)
            except Exception:
                pass
            handler = worker_group.spec.rdzv_handler
            try:
                handler._stop_heartbeats()
                handler._op_executor.run(dr._RendezvousExitOp(), time.monotonic() + 10)
            except Exception as e:  # the store may be gone too; heartbeats expire anyway
                print("etjob.torchrun: leaving the rendezvous failed: %s" % e, file=sys.stderr, flush=True)
            sup.exit_preempted()
        return original(self, worker_group)

    api.SimpleElasticAgent._restart_workers = _restart_workers


def main(argv=None):
    global sup_module
    _patch_std()
    _patch_shutdown()
    from etjob import supervisor as sup_module

    if os.environ.get("ETJOB_AGENT_ADDR"):
        # torch's agent keeps its own SIGTERM handling (it stops the workers).
        _patch_leaving(sup_module.Supervisor(install_sigterm=False).start())
    from torch.distributed import run

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    try:
        run.main()
    except ChildFailedError as e:
        # Every worker stopped because it was told to: so does the pod, with
        # the reserved code, instead of torchrun's generic 1.
        codes = {f.exitcode for f in e.failures.values()}
        if codes == {sup_module.EXIT_CODE_PREEMPTED}:
            print("etjob.torchrun: all workers stopped as told; exiting %d" % sup_module.EXIT_CODE_PREEMPTED,
                  file=sys.stderr, flush=True)
            sys.exit(sup_module.EXIT_CODE_PREEMPTED)
        raise


if __name__ == "__main__":
    main()
