"""etjob's stand-in for Alibaba's ``kubeai`` package (PyPI kubeai 0.1.0).

Only the spot-training part is provided: ``import kubeai.elastic as kubeai``
(seed 000's line) and ``import kubeai.handler as kubeai`` (a public Horovod
sample's) both give ``init()`` and ``check_alive()`` with kubeai's names,
signatures and return values, backed by etjob's node agent
(etjob.supervisor). kubeai's model-evaluation helpers (kubeai.api,
kubeai.evaluate: MySQL reporting) are not part of etjob. See
docs/worker-library.md for what kubeai 0.1.0 contains and how it differs.
"""
