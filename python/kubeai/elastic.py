"""kubeai.elastic with kubeai 0.1.0's API, on etjob's node agent.

kubeai 0.1.0's ``init()`` serves ``GET /stop`` on port 9009 (et-operator's
``kubeai-service-port``) and ``check_alive()`` turns False once something
calls it. Here ``init()`` starts etjob.supervisor instead: this pod's node
agent says when its node is being reclaimed, when it is scaled in, and when
the job stops below its minimum; a SIGTERM counts too. Both return what
kubeai's do: ``init()`` None, ``check_alive()`` a bool.
"""

import logging

import etjob.supervisor as _supervisor


def init():
    """init starts watching for this worker's stop signal (kubeai.init())."""
    _supervisor.init()
    logging.getLogger(__name__).info("success init kubeai (etjob node agent)")


def check_alive():
    """check_alive is False once this worker must checkpoint and stop."""
    return bool(_supervisor.check_alive())
