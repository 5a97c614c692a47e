#!/usr/bin/env bash
# test.sh is the project's one test command (README "Test it", .ci/run):
# lint, unit tests (with the decision core's coverage), the worker library on
# Debian's torch 1.13 and on PyPI's torch 2.15, then integration tests against
# a real kube-apiserver and etcd built once into the cache, and the
# end-to-end stories. `hack/test.sh fast` (make test-fast) is the inner loop:
# lint, walls, unit tests and the worker library on torch 1.13, no cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
mode=${1:-all}

# step prints a stage's heading with the minutes and seconds since the start:
# the budget's breakdown, in every run's log.
began=$SECONDS
step() { printf '\n==> [%dm%02ds] %s\n' $(((SECONDS - began) / 60)) $(((SECONDS - began) % 60)) "$*"; }
# worker_tests runs the worker library's tests with one interpreter (the
# tests start their workers with that same interpreter, sys.executable) in
# five shards at once: test_elastic, test_elastic_faults, test_elastic_ddp,
# test_elastic_shapes and the other modules. Their workers mostly wait
# (steps that sleep, timeouts), and are forked from a process that imported
# torch once (python/tests/worker_zygote.py):
# alone here the torch 1.13 lane took 143 s, the torch 2.15 lane 189 s (310 s
# when each worker imported torch itself). Each shard's log is printed whole
# once all are done.
worker_tests() {
  local py=$1 shards rc=0 pids=() m
  shards=$(mktemp -d)
  for m in test_elastic test_elastic_faults test_elastic_ddp test_elastic_shapes; do
    ( PYTHONPATH="$PWD/python:$PWD/python/tests" "$py" -m unittest "$m" > "$shards/$m.log" 2>&1 ) &
    pids+=($!)
  done
  PYTHONPATH="$PWD/python:$PWD/python/tests" "$py" -m unittest discover -s python/tests -t python/tests -p 'test_[!e]*.py' > "$shards/rest.log" 2>&1 || rc=1
  for m in "${pids[@]}"; do wait "$m" || rc=1; done
  cat "$shards/rest.log" "$shards/test_elastic.log" "$shards/test_elastic_faults.log" "$shards/test_elastic_ddp.log" \
    "$shards/test_elastic_shapes.log"
  rm -rf "$shards"
  return $rc
}

step "Debian packages (python3-torch, python3-sklearn; installed once)"
hack/install-deps.sh

step "lint (gofmt, go vet)"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi
go vet ./...

if [ "$mode" = fast ]; then
  step "walls (hack/walls)"
  go test -count=1 ./hack/...
  step "unit tests, -short (the process-node and agent tests start the control plane: built once into the cache)"
  go test -short -count=1 ./api/... ./config/... ./internal/... ./pkg/... ./cmd/...
  step "worker library tests on Debian's torch 1.13 (test_elastic, test_elastic_faults, test_elastic_ddp and test_elastic_shapes beside the rest: all mostly wait)"
  worker_tests /usr/bin/python3 || { echo "worker library tests failed (above)"; exit 1; }
  step "done"
  exit 0
fi

step "control plane binaries (built once into the cache; cold ~7 min)"
KUBEBUILDER_ASSETS=$(hack/build-controlplane.sh)
export KUBEBUILDER_ASSETS
echo "using $KUBEBUILDER_ASSETS"

step "Horovod 0.28.1 with PyTorch and gloo (built once from PyPI's sdist into the cache; cold ~5 min)"
echo "using $(hack/install-horovod.sh)"

step "the torch 2.x venv: PyPI's torch 2.15.0, torchft 0.2.0 (installed once into the cache; cold ~3 min)"
TORCH2=$(hack/install-torch2.sh)
echo "using $TORCH2"

step "walls (hack/walls: the core is pure, api/ and the agent stand alone, the user's binaries are clients of at most 60 MB)"
go test -count=1 ./hack/...

step "unit tests, with coverage (the process-node tests use the real API server too)"
# One run: the decision core's coverage is read from it (a second run of the
# core's tests for it took ~30 s).
unit_log=$(mktemp)
rc=0
go test -count=1 -cover ./api/... ./config/... ./internal/... ./pkg/... ./cmd/... 2>&1 | tee "$unit_log" || rc=$?
cover=$(sed -n 's|^ok[[:space:]]*github.com/etjob/etjob/internal/core[[:space:]].*coverage: \([0-9.]*\)%.*|\1|p' "$unit_log")
rm -f "$unit_log"
[ "$rc" -eq 0 ] || { echo "unit tests failed (above)"; exit 1; }
echo "decision core coverage: ${cover}%"
awk -v c="$cover" 'BEGIN { exit !(c >= 95) }' || { echo "decision core coverage ${cover}% is below 95%"; exit 1; }

# Fuzzing runs beside the torch 1.13 lane, at the lowest CPU priority: that
# lane mostly waits (104 CPU-s in its 143 s alone here), each fuzz target runs
# for its wall time whatever CPU it gets, and the lane's timing-sensitive tests
# keep the CPU they would have alone. One after the other they took 143 s +
# 144 s. The fuzzing's log is printed whole once both are done.
step "fuzzing: every fuzz target for ${ETJOB_FUZZTIME:-10s} (their corpora ran with the unit tests), at nice 19, beside the worker library tests on torch 1.13"
# In a session of its own, so that a failing lane (or an interrupted run)
# stops all of it: make, hack/fuzz.sh and go test -fuzz. A new session is a
# new scheduler autogroup where the kernel has them (Debian's does), which
# would share the CPU equally with the lane whatever its nice: the session's
# autogroup is niced too.
fuzz_log=$(mktemp)
setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' fuzz \
  make --no-print-directory fuzz FUZZTIME="${ETJOB_FUZZTIME:-10s}" > "$fuzz_log" 2>&1 &
fuzz=$!
trap 'kill -- -"$fuzz" 2>/dev/null || true; rm -f "$fuzz_log"' EXIT
for lane in 1.13:/usr/bin/python3 "2.15:$TORCH2/bin/python3"; do
  step "worker library tests on torch ${lane%%:*} (Python stdlib unittest; real torchrun, real gloo groups; five shards at once)"
  t0=$SECONDS
  worker_tests "${lane#*:}" || { echo "worker library tests on torch ${lane%%:*} failed (above)"; exit 1; }
  echo "lane torch ${lane%%:*}: $((SECONDS - t0)) s"
  if [ "${lane%%:*}" = 1.13 ]; then
    t0=$SECONDS
    rc=0
    wait "$fuzz" || rc=$?
    trap - EXIT
    echo "== fuzzing (waited $((SECONDS - t0)) s for it after the lane):"
    cat "$fuzz_log"
    rm -f "$fuzz_log"
    [ "$rc" -eq 0 ] || { echo "fuzzing failed (above)"; exit 1; }
  fi
done

step "the heavy test on PyPI's torch 2.15 (etjob.elastic at 1 GB of state a rank: a join, a hard kill, a freeze, a stop below min; ~14 GB), beside the integration tests (real kube-apiserver + etcd)"
# Both mostly wait (the heavy test's cores 48 % busy alone, the integration
# tests' 35 %): side by side they take the heavy test's time. Each log is
# printed whole once both are done.
integration_log=$(mktemp)
( go test -count=1 -p 1 -timeout 20m ./test/integration/... > "$integration_log" 2>&1 ) &
integration=$!
rc=0
ETJOB_HEAVY=1 PYTHONPATH="$PWD/python:$PWD/python/tests" "$TORCH2/bin/python3" -m unittest -v test_heavy || rc=1
wait "$integration" || rc=$((rc | 2))
echo "== integration tests:"
cat "$integration_log"
rm -f "$integration_log"
[ $((rc & 1)) -eq 0 ] || { echo "the heavy test failed (above)"; exit 1; }
[ $((rc & 2)) -eq 0 ] || { echo "the integration tests failed (above)"; exit 1; }

step "end-to-end: the spot stories on a local cluster with real torchrun, Horovod and etjob.elastic training (etjob.elastic on torch 1.13 and 2.15)"
# -v into a file: each story's time is printed (the budget's breakdown); the
# whole log only when something failed, as go test without -v would.
e2e_log=$(mktemp)
if go test -count=1 -p 1 -timeout 40m -v ./test/e2e/... > "$e2e_log" 2>&1; then
  grep -E '^(--- |ok |PASS)' "$e2e_log"
  rm -f "$e2e_log"
else
  cat "$e2e_log"
  echo "== the stories:"
  grep -E '^\s*--- ' "$e2e_log" || true
  awk -f hack/e2e-failures.awk "$e2e_log"
  rm -f "$e2e_log"
  exit 1
fi
step "done"
