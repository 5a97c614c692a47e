#!/usr/bin/env bash
# hack/gpu-check.sh: etjob.elastic's GPU data path on a machine with one GPU
# and a torch 2.x with CUDA (e.g. one H200, torch 2.11). No test of
# `make test` depends on it: the project's machines have no GPU. It runs
# hack/gpu_check.py's checks, each bounded, all of them even when one fails,
# and exits non-zero when one failed:
#   1. nccl-abort: etjob's NCCL transport, a world-1 communicator made and
#      aborted 100 times: GPU memory flat;
#   2. gloo-cuda: etjob.elastic's DDP on CUDA tensors over gloo, 4
#      processes, one SIGKILLed: the survivors go on in process, end alike;
#   3. nccl-ddp: the same DDP with init_process_group("nccl"), world 1,
#      ends where gloo ends;
#   4. state-gb: a GPU_CHECK_GB (default 4) GB state on the GPU: commit,
#      async checkpoint (how long the loop is held), load, bit for bit.
# PYTHON picks the interpreter (python3 by default).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)' || exit 1
failed=()
check() {
  local name=$1 limit=$2
  shift 2
  echo "== gpu-check: $name"
  if ! timeout "$limit" "$py" hack/gpu_check.py "$name" "$@"; then
    echo "== gpu-check: $name FAILED"
    failed+=("$name")
  fi
}
check nccl-abort 180 100
check gloo-cuda 150
check nccl-ddp 150
check state-gb 150 "${GPU_CHECK_GB:-4}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: failed: ${failed[*]}"
  exit 1
fi
echo "gpu-check: passed"
