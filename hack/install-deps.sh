#!/usr/bin/env bash
# install-deps.sh installs what the tests and the demo need from Debian, once:
# PyTorch (gloo on CPU; python3-torch is ~2 min and ~650 MB) and scikit-learn
# (the offline digits set) for /usr/bin/python3, and util-linux's
# unshare/nsenter for process nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/apt-install.sh install-deps python3-torch python3-sklearn util-linux
