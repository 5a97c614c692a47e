# etjob — `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
CACHE ?= $(HOME)/.cache/etjob
CONTROLLER_GEN_VERSION ?= v0.23.0
CONTROLLER_GEN ?= $(CACHE)/tools/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Build flags shared by `make build` and the Dockerfile.
# LOCAL_BINS are what etjob-local runs: itself and the components it starts.
LOCAL_BINS := ./cmd/etjob-local ./cmd/etjob-controller ./cmd/etjob-node ./cmd/etjob-agent
LDFLAGS ?= -s -w -X main.version=$(VERSION)
GOFLAGS_BUILD ?= -trimpath -ldflags "$(LDFLAGS)"

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*##/ {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the binaries into bin/: etjob and kubectl-etjob (the user's CLI), etjob-local (local cluster, demo, chaos, sim), etjob-controller, etjob-agent, etjob-node.
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o bin/ ./cmd/...

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Regenerate deepcopy, the CRDs and RBAC (controller-gen, into the chart), the Python contract (python/etjob/contract.py), then config/.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd:generateEmbeddedObjectMeta=true paths=./api/... output:crd:dir=charts/etjob/crds
	$(GO) run ./hack/crdtrim charts/etjob/crds/etjob.dev_elasticjobs.yaml
	$(CONTROLLER_GEN) rbac:roleName=etjob-controller paths=./internal/controller/... output:rbac:dir=charts/etjob/templates/rbac
	ETJOB_UPDATE_CONTRACT=1 $(GO) test -count=1 -run '^TestPythonContract$$' ./api/v1alpha1/
	$(MAKE) manifests

.PHONY: manifests
manifests: ## Render the kustomize tree in config/ from the Helm chart (charts/etjob), the manifests' one source.
	$(GO) run ./hack/manifests

$(CONTROLLER_GEN):
	GOBIN=$(dir $(CONTROLLER_GEN)) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

.PHONY: controlplane
controlplane: ## Build kube-apiserver, scheduler, controller-manager, kubectl and etcd into the cache (once).
	hack/build-controlplane.sh

.PHONY: test
test: ## The README's test command (CI): lint, walls, unit, worker library, integration (real kube-apiserver), end-to-end.
	hack/test.sh

.PHONY: test-fast
test-fast: ## The inner loop (warm <= 5 min): lint, walls, unit tests, the worker library on Debian's torch 1.13; no local cluster, no e2e.
	hack/test.sh fast

.PHONY: test-unit
test-unit: ## Unit tests (the decision core, builders, CLI, the Go supervisor package).
	$(GO) test ./internal/... ./api/... ./config/... ./pkg/... ./cmd/... ./hack/...

.PHONY: walls
walls: ## Check the import walls (hack/walls): pure core, api/ and the agent on their own, the user's binaries clients of <= 60 MB.
	$(GO) test -count=1 -v -run 'Walls|ClockCalls|UserBinarySize' ./hack/walls/

.PHONY: test-integration
test-integration: controlplane ## Integration tests against a real kube-apiserver and etcd.
	KUBEBUILDER_ASSETS=$$(hack/build-controlplane.sh) $(GO) test -p 1 -timeout 20m ./test/integration/...

.PHONY: cover
cover: ## Coverage of the decision core.
	$(GO) test -cover ./internal/core/

# FUZZTIME is how long `make fuzz` runs each fuzz target; FUZZFLAGS go to
# every run (-parallel 1 on a shared machine).
FUZZTIME ?= 30s
FUZZFLAGS ?=
# The packages with fuzz targets: go test -fuzz takes one package and one
# target per run.
FUZZ_PKGS ?= $(addprefix ./,$(sort $(dir $(shell grep -rl --include='*_test.go' '^func Fuzz' internal))))

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each, one after the other (make fuzz FUZZTIME=30s); a failing input lands in the package's testdata/fuzz/.
	@set -e; for pkg in $(FUZZ_PKGS); do \
	  for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$target for $(FUZZTIME)"; \
	    hack/fuzz.sh $$pkg $$target $(FUZZTIME) $(FUZZFLAGS); \
	  done; \
	done

.PHONY: lint
lint: ## gofmt and go vet.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

.PHONY: verify
verify: generate lint ## Regenerate and fail if anything generated is out of date.
	git diff --exit-code -- api config charts

.PHONY: demo
demo: ## The local demo: a cluster of process nodes, real torchrun training through spot reclamations.
	hack/install-deps.sh
	$(GO) build -o bin/ ./cmd/etjob $(LOCAL_BINS)
	bin/etjob-local demo $(DEMO_FLAGS)

.PHONY: bench-local
bench-local: ## Spot-path latencies on the local cluster with real training (docs/benchmarks.md).
	hack/install-deps.sh
	$(GO) build -o bin/ $(LOCAL_BINS)
	bin/etjob-local demo --churn 10 --notice 30s --width 96 --epochs 80
	bin/etjob-local demo --churn 5 --hard --width 96 --epochs 80

# HVD_CYCLES is how many noticed losses, hard losses (and twice as many joins)
# `make bench-horovod` measures.
HVD_CYCLES ?= 5

.PHONY: bench-horovod
bench-horovod: ## Real Horovod on the local cluster: HVD_CYCLES noticed losses, hard losses and joins; pauses and steps done again (docs/benchmarks.md).
	hack/install-deps.sh
	hack/install-horovod.sh >/dev/null
	ETJOB_HVD_BENCH=$(HVD_CYCLES) KUBEBUILDER_ASSETS=$$(hack/build-controlplane.sh) $(GO) test -count=1 -p 1 -timeout 60m -v -run '^TestHorovodBench$$' ./test/e2e/

# ELASTIC_EVENTS is how many hard kills (each followed by a join) `make
# bench-elastic` makes.
ELASTIC_EVENTS ?= 10
SCALE_NS ?= 16,64,256
comma := ,

.PHONY: bench-elastic
bench-elastic: ## In-process recovery (etjob.elastic) on this machine, no cluster: ELASTIC_EVENTS hard kills and joins of 4 real gloo ranks, a freeze; pauses, steps done again (docs/benchmarks.md).
	hack/install-deps.sh
	PYTHONPATH="$$PWD/python:$$PWD/python/tests" /usr/bin/python3 python/tests/bench_elastic.py --events $(ELASTIC_EVENTS)

.PHONY: bench-scale-elastic
bench-scale-elastic: ## etjob.elastic's rendezvous at SCALE_NS ranks (16,64,256: threads, a fake process group, the real store and front): store calls of a kill and a join, time to training, steady calls (docs/benchmarks.md).
	hack/install-deps.sh
	PYTHONPATH="$$PWD/python:$$PWD/python/tests" "$$(hack/install-torch2.sh)/bin/python3" python/tests/bench_scale_elastic.py $(subst $(comma), ,$(SCALE_NS))

.PHONY: bench-generations
bench-generations: ## What each etjob.elastic generation leaves behind (threads, fds, RSS) over 200 generations, on torch 1.13 and 2.15 (docs/benchmarks.md).
	hack/install-deps.sh
	PYTHONPATH="$$PWD/python:$$PWD/python/tests" /usr/bin/python3 python/tests/bench_generations.py --gens 200
	PYTHONPATH="$$PWD/python:$$PWD/python/tests" "$$(hack/install-torch2.sh)/bin/python3" python/tests/bench_generations.py --gens 200

.PHONY: bench-store
bench-store: ## What the rendezvous store's authentication costs a client (a new client, one add), with and without the job secret, on torch 1.13 and 2.15 (docs/benchmarks.md).
	hack/install-deps.sh
	PYTHONPATH="$$PWD/python:$$PWD/python/tests" /usr/bin/python3 python/tests/bench_store.py
	PYTHONPATH="$$PWD/python:$$PWD/python/tests" "$$(hack/install-torch2.sh)/bin/python3" python/tests/bench_store.py

# TORCHFT_MINUTES of hard kills (one every TORCHFT_EVERY seconds, the rank
# started again after TORCHFT_RESTART_DELAY) in `make bench-torchft`.
TORCHFT_MINUTES ?= 10
TORCHFT_EVERY ?= 30
TORCHFT_RESTART_DELAY ?= 5

.PHONY: bench-torchft
bench-torchft: ## Head to head on the GPT example (torch 2.15, gloo): plain DDP, torchft 0.2.0 (its DDP, and its pure DDP) and etjob.elastic; step time vs DDP, then a hard kill every TORCHFT_EVERY s for TORCHFT_MINUTES (docs/benchmarks.md).
	hack/install-deps.sh
	hack/bench-torchft.py --python "$$(hack/install-torch2.sh)/bin/python3" --fault-minutes $(TORCHFT_MINUTES) --every $(TORCHFT_EVERY) --restart-delay $(TORCHFT_RESTART_DELAY)

# FAULTS_MINUTES of faults per mode (a kill or a join every FAULTS_EVERY) in
# `make bench-faults`, for each of FAULTS_MODES.
FAULTS_MINUTES ?= 10
FAULTS_EVERY ?= 30s
FAULTS_MODES ?= inprocess,etjob-torchrun,stock-torchrun
# FAULTS_NOTICE: a notice before each loss (e.g. 20s); 0, the default, kills without one.
FAULTS_NOTICE ?= 0

.PHONY: bench-faults
bench-faults: ## Hard kills (or losses with FAULTS_NOTICE's notice) and joins every FAULTS_EVERY for FAULTS_MINUTES on the local cluster, per mode of FAULTS_MODES (in-process, etjob.torchrun, stock torchrun): paused share of the wall time, pauses, steps done again (docs/benchmarks.md).
	hack/install-deps.sh
	ETJOB_FAULTS_BENCH=$(FAULTS_MINUTES) ETJOB_FAULTS_EVERY=$(FAULTS_EVERY) ETJOB_FAULTS_MODES=$(FAULTS_MODES) ETJOB_FAULTS_NOTICE=$(FAULTS_NOTICE) KUBEBUILDER_ASSETS=$$(hack/build-controlplane.sh) $(GO) test -count=1 -p 1 -timeout 120m -v -run '^TestFaultsBench$$' ./test/e2e/

# The spot availability traces (traces/: EC2 p3 and g4dn, attributed in traces/README.md).
TRACES ?= traces

.PHONY: sim
sim: ## Replay the p3 and g4dn spot traces through the decision core: etjob vs checkpoint-restart vs on-demand (docs/benchmarks.md).
	$(GO) run ./cmd/etjob-local sim --trace $(TRACES)/ec2-p3-trace.csv --trace $(TRACES)/ec2-g4dn-trace.csv $(SIM_FLAGS)

# BENCH_SCALE_FLAGS go to the controller scale benchmark, e.g. "-jobs 1000" (go run ./test/bench/scale -h lists them).
BENCH_SCALE_FLAGS ?=

.PHONY: bench-scale
bench-scale: controlplane ## Controller at scale: kube-apiserver+etcd, kwok nodes, 100 jobs x 32 workers; fails if a scale-out by k costs > 2k+3 API writes or a LIST follows the sync (docs/benchmarks.md).
	hack/install-kwok.sh >/dev/null
	$(GO) run ./test/bench/scale $(BENCH_SCALE_FLAGS)

# CHAOS_SEED picks the chaos schedule (default: drawn from the time, once, and printed).
ifeq ($(origin CHAOS_SEED), undefined)
CHAOS_SEED := $(shell date +%s%N | cut -c10-15)
endif
CHAOS_FLAGS ?=

.PHONY: chaos
chaos: ## Seeded chaos run (<= ~12 min) on the local cluster with real torchrun: >= 25 membership changes, restarts of controller/agent/apiserver, the apiserver down 30 s mid scale-out, the launcher's pod lost, checks and decision replay (make chaos CHAOS_SEED=7).
	hack/install-deps.sh
	$(GO) build -o bin/ $(LOCAL_BINS)
	@echo "chaos seed $(CHAOS_SEED)"
	bin/etjob-local chaos --seed $(CHAOS_SEED) $(CHAOS_FLAGS)

.PHONY: horovod
horovod: ## Build Horovod 0.28.1 (PyTorch + gloo) from PyPI's sdist into the cache, once; prints its venv.
	hack/install-horovod.sh

.PHONY: torch2
torch2: ## Install the torch 2.x venv (PyPI's torch 2.15.0, torchft 0.2.0, numpy, scikit-learn; pinned with hashes) into the cache, once; prints its directory.
	hack/install-torch2.sh

.PHONY: test-e2e
test-e2e: ## End-to-end tests on the local cluster with real torchrun and real Horovod training.
	hack/install-deps.sh
	hack/install-horovod.sh
	KUBEBUILDER_ASSETS=$$(hack/build-controlplane.sh) $(GO) test -p 1 -count=1 -timeout 60m ./test/e2e/...
