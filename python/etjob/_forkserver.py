"""Imported by etjob.torchrun's forkserver alone (its preload list, first):
the forkserver ignores SIGTERM and SIGINT.

A pod's deletion may signal its whole process group (a runtime's init such as
dumb-init or tini -g does; etjob's process nodes do). The forkserver used to
die at once, and torch's agent, which waits for its workers through the
forkserver's pipe, then took every worker for gone and exited, and the
workers, which die with their agent, went with it in the middle of a step: a
hard loss instead of the agreed stop their own SIGTERM handler was heading
for (issue #14's scheduler preemption). Its workers start with SIGTERM and
SIGINT at their defaults again (etjob.torchrun.run_worker)."""

import os
import signal

if os.environ.get("ETJOB_AGENT_PID") not in (None, "", str(os.getpid())):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
