"""Imported by etjob.torchrun's forkserver alone (its preload list, first):
the forkserver ignores SIGTERM and SIGINT.

A pod's deletion may signal its whole process group (a runtime's init such as
dumb-init or tini -g does; etjob's process nodes do). A forkserver that died
of it would take its workers with it: torch's agent, which waits for its
workers through the forkserver's pipe, would take every worker for gone and
exit, and the workers, which die with their agent, would go in the middle of a
step: a hard loss instead of the agreed stop their own SIGTERM handler is
heading for (a scheduler's preemption sends exactly that). Its workers start
with SIGTERM and SIGINT at their defaults again (etjob.torchrun.run_worker)."""

import os
import signal

from etjob import contract

if os.environ.get(contract.ENV_AGENT_PID) not in (None, "", str(os.getpid())):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
