#!/usr/bin/env bash
# install-deps.sh installs what the tests and the demo need from Debian, once:
# PyTorch (gloo on CPU; python3-torch is ~2 min and ~650 MB) and scikit-learn
# (the offline digits set) for /usr/bin/python3, and util-linux's
# unshare/nsenter for process nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/apt-install.sh install-deps python3-torch python3-sklearn util-linux

# torch's store clients and servers look up the name of each peer address
# (getnameinfo) as they connect; for ::ffff:127.0.0.1, the address a torch
# client has on loopback, /etc/hosts has no line, so the query goes to the
# resolver. This machine kind's resolver drops some of them: a 5 s stall
# every ~25 connections (strace: the store's thread waiting on port 53),
# which slowed or failed the tests' store connections at random. One line
# answers it locally; added once, where missing and writable.
if ! grep -qE '^[[:space:]]*::ffff:127\.0\.0\.1[[:space:]]' /etc/hosts 2>/dev/null; then
  if [ -w /etc/hosts ]; then
    printf '::ffff:127.0.0.1 localhost # etjob hack/install-deps.sh: loopback name lookups answered locally\n' >> /etc/hosts
    echo "install-deps: /etc/hosts now answers ::ffff:127.0.0.1 (torch's loopback name lookups) locally"
  else
    echo "install-deps: /etc/hosts is not writable: torch's loopback name lookups go to the resolver (5 s stalls where it drops them)" >&2
  fi
fi
