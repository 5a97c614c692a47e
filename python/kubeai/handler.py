"""kubeai.handler: the name a public Horovod sample imports; the same API as
kubeai.elastic (init(), check_alive())."""

from kubeai.elastic import check_alive, init  # noqa: F401
