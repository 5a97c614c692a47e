#!/usr/bin/env bash
# build-controlplane.sh builds the real Kubernetes control plane (kube-apiserver,
# kube-scheduler, kube-controller-manager, and a matching kubectl) and etcd from the Go module proxy into a
# cache directory keyed by version, and prints that directory. There is no container
# engine and no downloadable binary on our machines (docs/development.md), so this is
# how envtest and the local cluster get real binaries. Once built, it returns at once.
#
# Usage: hack/build-controlplane.sh            # builds if missing, prints the bin dir
#        ETJOB_CACHE=/path hack/build-controlplane.sh
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE="${ETJOB_CACHE:-${HOME:-/root}/.cache/etjob}"
BIN="$CACHE/controlplane/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}"
SRC="$CACHE/controlplane/src-${KUBE_VERSION}"
COMPONENTS=(kube-apiserver kube-scheduler kube-controller-manager kubectl)

log() { printf '[build-controlplane] %s\n' "$*" >&2; }

missing=()
for c in "${COMPONENTS[@]}" etcd; do [ -x "$BIN/$c" ] || missing+=("$c"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$BIN"; exit 0; fi

mkdir -p "$BIN" "$SRC"
# One build at a time: packages whose tests need the control plane run in
# parallel under `go test ./...` and each may start this script on a cold
# cache; two builds of one component into one .tmp file lose it
# ("mv: cannot stat .../kube-apiserver.tmp"). The second waits, then finds
# what the first built.
exec 9>"$CACHE/controlplane/.build.lock"
if ! flock -n 9; then
  log "another build of the control plane is running; waiting for it"
  flock 9
fi

export GOFLAGS="-mod=mod -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

needs_kube=0
for c in "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || needs_kube=1; done

if [ $needs_kube -eq 1 ]; then
  if [ ! -f "$SRC/go.mod" ] || ! grep -q "k8s.io/kubernetes $KUBE_VERSION" "$SRC/go.mod"; then
    log "resolving k8s.io/kubernetes@$KUBE_VERSION (staging replaces from its go.mod)"
    gomod=$(cd "$SRC" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    staging_version="v0.${KUBE_VERSION#v1.}"
    {
      echo "module etjob.local/controlplane"
      echo
      echo "go 1.26.0"
      echo
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo
      echo "replace ("
      # Each staging module that kubernetes points at ./staging/src/... is published as v0.Y.Z.
      sed -n '/^replace (/,/^)/p' "$gomod" | grep -E '=> \./staging/' | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}'
      echo ")"
    } > "$SRC/go.mod"
    log "$(grep -c '=>' "$SRC/go.mod") staging replaces written"
  fi
  minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  for c in "${COMPONENTS[@]}"; do
    [ -x "$BIN/$c" ] && continue
    log "building $c $KUBE_VERSION (cold: ~5 min for the first, under 1 min for each next one on 2 cores)"
    start=$(date +%s)
    (cd "$SRC" && go get "k8s.io/kubernetes/cmd/$c@$KUBE_VERSION" >/dev/null 2>&1 || true)
    (cd "$SRC" && go build -trimpath -ldflags "$ldflags" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c")
    mv "$BIN/$c.tmp" "$BIN/$c"
    log "built $c in $(( $(date +%s) - start ))s"
  done
fi

if [ ! -x "$BIN/etcd" ]; then
  # etcd's server module has replace directives, so `go install mod@v` refuses
  # it; build it from a throwaway module that requires it instead.
  log "building etcd $ETCD_VERSION (~1 min)"
  start=$(date +%s)
  esrc="$CACHE/controlplane/src-etcd-${ETCD_VERSION}"
  mkdir -p "$esrc"
  if [ ! -f "$esrc/go.mod" ]; then
    printf 'module etjob.local/etcd\n\ngo 1.26.0\n' > "$esrc/go.mod"
    (cd "$esrc" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2)
  fi
  (cd "$esrc" && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$BIN/etcd.tmp" "$BIN/etcd"
  log "built etcd in $(( $(date +%s) - start ))s"
fi
echo "$BIN"
