#!/usr/bin/env bash
# install-torch2.sh installs, once, the torch 2.x venv the worker library is
# also tested on: PyPI's torch 2.15.0, torchft 0.2.0 (with its lighthouse,
# bin/torchft_lighthouse), numpy and scikit-learn, every package pinned with
# its hash (hack/torch2-requirements.txt, pip --require-hashes). It prints the
# venv's directory; its bin/python3 imports torch 2.15. The venv is cached
# under $ETJOB_CACHE/torch2 (default ~/.cache/etjob/torch2) and rebuilt only
# when the requirements file changes; a warm run costs 0 s.
#
# Why each piece:
#   - Debian's python3 (3.11) and python3-venv make the venv, without the
#     system's site packages: Debian's torch 1.13 must not be seen there (the
#     two torches do not talk to each other: a 1.13 store client hangs
#     against a 2.15 store);
#   - PyPI's torch wheels are CUDA builds: their CUDA, cuDNN and NCCL
#     libraries come with them (~5 GB installed) and stay unused on CPU; the
#     project cannot reach another index.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2.15.0
CACHE=${ETJOB_CACHE:-$HOME/.cache/etjob}/torch2
VENV=$CACHE/venv-$VERSION
REQS=$PWD/hack/torch2-requirements.txt
STAMP=$VENV/.requirements.sha256
log() { echo "[install-torch2] $*" >&2; }

want=$(sha256sum "$REQS" | cut -d' ' -f1)
if [ -x "$VENV/bin/python3" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "$VENV"; exit 0
fi

hack/apt-install.sh install-torch2 python3-venv python3-pip

log "installing torch $VERSION, torchft, numpy and scikit-learn into $VENV (cold: ~3 min and ~5.4 GB; once)"
began=$(date +%s)
rm -rf "$VENV.tmp"
mkdir -p "$CACHE"
/usr/bin/python3 -m venv "$VENV.tmp"
# --no-input: CI has no terminal.
"$VENV.tmp/bin/python3" -m pip --disable-pip-version-check -q --no-input \
  install --require-hashes --only-binary=:all: -r "$REQS" >&2
"$VENV.tmp/bin/python3" -c 'import torch, torchft, sklearn, numpy; assert torch.__version__.startswith("2.15."), torch.__version__' >&2
# Built aside and moved into place, so that a failed install leaves no
# half venv; its scripts (pip, torchrun, torchft_lighthouse) name their
# interpreter by the temporary path: point them at the final one.
rm -rf "$VENV"
mv "$VENV.tmp" "$VENV"
grep -rl "$VENV.tmp" "$VENV/bin" 2>/dev/null | xargs -r sed -i "s#$VENV.tmp#$VENV#g"
sed -i "s#$VENV.tmp#$VENV#g" "$VENV/pyvenv.cfg" "$VENV/bin/activate"* 2>/dev/null || true
echo "$want" > "$STAMP"
log "done in $(( $(date +%s) - began )) s"
echo "$VENV"
