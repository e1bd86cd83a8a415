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

log() { printf '[gpuq build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'gpuq build: error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$BIN_DIR" "$LOG_DIR"
TIMES="$BIN_DIR/build-times.tsv"

need_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 on PATH to build the local control plane)"
}
# record NAME SECONDS: one line per binary actually built, so cold-build cost stays known later.
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$(date -u +%FT%TZ)" "$(nproc 2>/dev/null || echo ?)" >>"$TIMES"; }

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
  K8S_LDFLAGS+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

# build NAME MODULE_DIR PACKAGE LDFLAGS
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4" logf="$LOG_DIR/$1.log" t0
  if [[ -x "$BIN_DIR/$name" ]]; then log "$name: cached"; return; fi
  need_go
  t0=$SECONDS
  log "$name: building $pkg (log: $logf)"
  if ! (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/$name.tmp" "$pkg") >"$logf" 2>&1; then
    tail -n 20 "$logf" >&2
    die "building $name failed; full log: $logf"
  fi
  mv "$BIN_DIR/$name.tmp" "$BIN_DIR/$name"
  record "$name" "$((SECONDS - t0))"
  log "$name: built in $((SECONDS - t0))s"
}

start=$SECONDS
build etcd "$HACK_DIR/etcd" go.etcd.io/etcd/server/v3 \
  "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=gpuq"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$cmd" "$HACK_DIR/k8s" "k8s.io/kubernetes/cmd/$cmd" "$K8S_LDFLAGS"
done
if [[ -x "$BIN_DIR/kwok" ]]; then
  log "kwok: cached"
else
  need_go
  t0=$SECONDS
  log "kwok: go install sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION} (log: $LOG_DIR/kwok.log)"
  if ! (cd "$HACK_DIR" && CGO_ENABLED=0 GOBIN="$BIN_DIR" go install -trimpath -ldflags "-s -w" \
        "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}") >"$LOG_DIR/kwok.log" 2>&1; then
    tail -n 20 "$LOG_DIR/kwok.log" >&2
    die "building kwok failed; full log: $LOG_DIR/kwok.log"
  fi
  record kwok "$((SECONDS - t0))"
  log "kwok: built in $((SECONDS - t0))s"
fi
log "all binaries ready in $((SECONDS - start))s"
echo "$BIN_DIR"
