#!/usr/bin/env bash
# Builds the local control plane binaries once into a cache directory keyed by version:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok.
# Re-running rebuilds nothing that is already cached. Prints the bin directory on the last line.
# Per-binary build times are appended to <bin dir>/build-times.tsv (read by bench/cluster_startup.py).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
K8S_VERSION="${GPUQ_K8S_VERSION:-$K8S_VERSION}"
ETCD_VERSION="${GPUQ_ETCD_VERSION:-$ETCD_VERSION}"
KWOK_VERSION="${GPUQ_KWOK_VERSION:-$KWOK_VERSION}"
CACHE_ROOT="${GPUQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuq}"
BIN_DIR="${CACHE_ROOT}/bin/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
LOG_DIR="${CACHE_ROOT}/build-logs"

# shellcheck source=lib.sh
source "$HACK_DIR/lib.sh"

mkdir -p "$BIN_DIR" "$LOG_DIR"
TIMES="$BIN_DIR/build-times.tsv"
K8S_LDFLAGS=$(k8s_ldflags "$K8S_VERSION")

start=$SECONDS
build etcd "$HACK_DIR/etcd" go.etcd.io/etcd/server/v3 \
  "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=gpuq"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$cmd" "$HACK_DIR/k8s" "k8s.io/kubernetes/cmd/$cmd" "$K8S_LDFLAGS"
done
build kwok - "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" "-s -w"
log "all binaries ready in $((SECONDS - start))s"
echo "$BIN_DIR"
