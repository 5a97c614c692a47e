#!/usr/bin/env bash
# install-kwok.sh installs kwok (sigs.k8s.io/kwok, which simulates nodes and
# makes their pods Running without processes) into a cache directory keyed by
# version, with its stage YAMLs (pod-ready, node-heartbeat, ...) copied from
# the module zip, and prints that directory. There is no downloadable binary on
# our machines (docs/development.md), so `go install` builds it (~3 min cold on
# 2 cores); once installed, it returns at once. The controller scale benchmark
# (make bench-scale, test/bench/scale) uses it.
#
# Usage: hack/install-kwok.sh                 # installs if missing, prints the dir
#        KWOK_VERSION=v0.8.0 ETJOB_CACHE=/path hack/install-kwok.sh
set -euo pipefail

KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CACHE="${ETJOB_CACHE:-${HOME:-/root}/.cache/etjob}"
DIR="$CACHE/tools/kwok-${KWOK_VERSION}"

log() { printf '[install-kwok] %s\n' "$*" >&2; }

if [ -x "$DIR/kwok" ] && [ -d "$DIR/stage" ]; then echo "$DIR"; exit 0; fi

mkdir -p "$DIR"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOFLAGS="-buildvcs=false"
if [ ! -x "$DIR/kwok" ]; then
  log "go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION (~3 min cold)"
  start=$(date +%s)
  GOBIN="$DIR" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  log "installed kwok in $(( $(date +%s) - start ))s"
fi
if [ ! -d "$DIR/stage" ]; then
  # The stage YAMLs are not compiled into the binary: copy them out of the
  # module that go install just downloaded.
  moddir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$moddir/kustomize/stage" ] || { log "no kustomize/stage in $moddir"; exit 1; }
  rm -rf "$DIR/stage.tmp"
  (cd "$moddir/kustomize/stage" && find . -name '*.yaml' -not -path '*/testdata/*' -not -name kustomization.yaml) |
    while read -r f; do
      mkdir -p "$DIR/stage.tmp/$(dirname "$f")"
      cp "$moddir/kustomize/stage/$f" "$DIR/stage.tmp/$f"
    done
  chmod -R u+w "$DIR/stage.tmp"
  mv "$DIR/stage.tmp" "$DIR/stage"
fi
echo "$DIR"
