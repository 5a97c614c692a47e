"""etjob worker library (stdlib only; torch only where a module says so).

Modules:
  etjob.rdzv  -- the torchrun rendezvous store the launcher hosts (needs torch).
"""

# The reserved exit code of a worker that stops because it was told to
# (EX_TEMPFAIL); the controller counts it as a preemption, never a failure.
from etjob.contract import EXIT_CODE_PREEMPTED  # noqa: F401 (api/v1alpha1 owns it)
