#!/usr/bin/env bash
# install-deps.sh installs what the tests and the demo need from Debian, once:
# PyTorch (gloo on CPU) and scikit-learn (the offline digits set) for
# /usr/bin/python3, and util-linux's unshare/nsenter for process nodes.
set -euo pipefail
need=()
/usr/bin/python3 -c 'import torch' 2>/dev/null || need+=(python3-torch)
/usr/bin/python3 -c 'import sklearn' 2>/dev/null || need+=(python3-sklearn)
command -v unshare >/dev/null && command -v nsenter >/dev/null || need+=(util-linux)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: ${need[*]}; run as root: apt-get install -y --no-install-recommends ${need[*]}" >&2
  exit 1
fi
echo "[install-deps] apt-get install ${need[*]} (~2 min, ~650 MB for python3-torch)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
