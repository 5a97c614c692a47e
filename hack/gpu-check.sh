#!/usr/bin/env bash
# hack/gpu-check.sh: etjob.elastic's GPU data path on a machine with one GPU
# and a torch 2.x with CUDA (e.g. one H200, torch 2.11). No test of
# `make test` depends on it: the project's machines have no GPU. It runs
# hack/gpu_check.py's two checks, each bounded, and exits non-zero when one
# fails:
#   1. a world-1 NCCL group aborted and made again 100 times: GPU memory flat;
#   2. gloo on CUDA tensors across 4 processes (etjob.elastic's DDP) with a
#      hard kill: the survivors go on in process and end alike.
# PYTHON picks the interpreter (python3 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
timeout 300 "$py" hack/gpu_check.py nccl-abort 100
timeout 300 "$py" hack/gpu_check.py gloo-cuda
echo "gpu-check: passed"
