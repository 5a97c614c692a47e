#!/usr/bin/env bash
# install-horovod.sh builds Horovod 0.28.1 (PyTorch + gloo; no MPI, TensorFlow
# or MXNet) from PyPI's source distribution against Debian's python3-torch 1.13,
# once, and installs it into a venv that sees Debian's torch. It prints the
# venv's directory; its bin/ holds horovodrun and a python3 that imports
# horovod.torch. Everything is cached under $ETJOB_CACHE/horovod (default
# ~/.cache/etjob/horovod): the wheel is built once (cold ~ see
# docs/benchmarks.md), a new venv installs from it in seconds, and a warm run
# costs 0 s.
#
# Why each piece (each found building it on Debian 12):
#   - libtorch-dev: Debian's torch/include/{ATen,c10,torch} are symlinks into
#     /usr/include that dangle without it;
#   - pybind11-dev: torch/csrc/Exceptions.h includes pybind11/pybind11.h
#     (without it: "fatal error: pybind11/pybind11.h: No such file");
#   - cmake from Debian (>= 3.13, or setup.py pip-installs one);
#   - python3-cffi: horovod's setup imports it to build its ctypes shim;
#   - a venv with --system-site-packages (Debian's python is externally
#     managed, PEP 668, and torch lives in dist-packages);
#   - pip --no-build-isolation: setup.py imports torch, which an isolated build
#     environment does not have (the sdist has no pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.28.1
CACHE=${ETJOB_CACHE:-$HOME/.cache/etjob}/horovod
VENV=$CACHE/venv-$VERSION
WHEELS=$CACHE/wheels
log() { echo "[install-horovod] $*" >&2; }

if [ -x "$VENV/bin/horovodrun" ] && "$VENV/bin/python3" -c 'import horovod.torch' 2>/dev/null; then
  echo "$VENV"; exit 0
fi

hack/install-deps.sh
hack/apt-install.sh install-horovod libtorch-dev pybind11-dev python3-dev python3-cffi python3-cloudpickle python3-psutil \
  python3-packaging python3-yaml python3-venv python3-pip cmake g++ make

mkdir -p "$WHEELS"
# Debian's pip, not the one first on PATH (another interpreter without torch).
PY=/usr/bin/python3
rm -rf "$VENV.tmp"
$PY -m venv --system-site-packages "$VENV.tmp"
VPIP=("$VENV.tmp/bin/python3" -m pip --disable-pip-version-check -q)

wheel=$(ls "$WHEELS"/horovod-$VERSION-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  log "building the horovod $VERSION wheel from PyPI's sdist (cold: several minutes on 2 cores; once)"
  src=$CACHE/src
  rm -rf "$src" && mkdir -p "$src"
  "${VPIP[@]}" download --no-deps --no-binary :all: -d "$src" "horovod==$VERSION"
  start=$(date +%s)
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO \
  HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  MAKEFLAGS="-j$(nproc)" \
    "${VPIP[@]}" wheel --no-build-isolation --no-deps -w "$WHEELS.tmp" "$src"/horovod-$VERSION.tar.gz \
    > "$CACHE/build.log" 2>&1 || { log "wheel build failed; the log: $CACHE/build.log"; tail -40 "$CACHE/build.log" >&2; exit 1; }
  mv "$WHEELS.tmp"/horovod-*.whl "$WHEELS"/ && rm -rf "$WHEELS.tmp"
  log "wheel built in $(( $(date +%s) - start )) s"
  wheel=$(ls "$WHEELS"/horovod-$VERSION-*.whl | head -1)
fi
# Horovod's own dependencies are Debian's (cloudpickle, psutil, pyyaml,
# packaging): --no-deps keeps pip from pulling anything else, PyPI's torch
# above all (GBs of CUDA libraries).
"${VPIP[@]}" install --no-deps "$wheel"
"$VENV.tmp/bin/python3" -c 'import horovod.torch as hvd; assert hvd.gloo_built(), "gloo not built"' \
  || { log "horovod installed but horovod.torch does not import or has no gloo"; exit 1; }
rm -rf "$VENV" && mv "$VENV.tmp" "$VENV"
# The venv's scripts name the .tmp path in their shebang: fix them after the move.
sed -i "1s|^#!.*$|#!$VENV/bin/python3|" "$VENV"/bin/horovodrun
echo "$VENV"
