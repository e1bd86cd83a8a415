#!/usr/bin/env bash
# Builds kind and everything its node image runs, from Go modules (and one C file), into a cache
# directory keyed by version; prints that directory on the last line. Nothing comes from GitHub:
#   kind; kubelet, kubeadm, kube-proxy (hack/kind/k8s) and kubectl, kube-apiserver,
#   kube-controller-manager, kube-scheduler (shared with the local control plane's build);
#   containerd, ctr, containerd-shim-runc-v2; runc (cgo, with seccomp: kubeadm's static pods ask
#   for the RuntimeDefault profile); crictl; the CNI plugins kind uses; coredns; etcd; pause.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$HACK_DIR/versions.env"
source "$HACK_DIR/kind/versions.env"
K8S_VERSION="${GPUQ_K8S_VERSION:-$K8S_VERSION}"
CACHE_ROOT="${GPUQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuq}"
BIN_DIR="${CACHE_ROOT}/bin/kind-${KIND_VERSION}_k8s-${K8S_VERSION}_containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}"
LOG_DIR="${CACHE_ROOT}/build-logs/kind"
source "$HACK_DIR/lib.sh"
mkdir -p "$BIN_DIR" "$LOG_DIR"
TIMES="$BIN_DIR/build-times.tsv"
start=$SECONDS

# The control-plane binaries the local cluster already built are reused (same version and flags).
CP_DIR=$(bash "$HACK_DIR/build-binaries.sh" | tail -1)
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [[ -x "$BIN_DIR/$b" ]] || cp "$CP_DIR/$b" "$BIN_DIR/$b"
done

build kind - "sigs.k8s.io/kind@${KIND_VERSION}" "-s -w"
K8S_LDFLAGS=$(k8s_ldflags "$K8S_VERSION")
for cmd in kubelet kubeadm kube-proxy; do
  build "$cmd" "$HACK_DIR/kind/k8s" "k8s.io/kubernetes/cmd/$cmd" "$K8S_LDFLAGS"
done
build etcd "$HACK_DIR/kind/etcd" go.etcd.io/etcd/server/v3 "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=gpuq"
CTRD=github.com/containerd/containerd/v2
CTRD_LDFLAGS="-s -w -X ${CTRD}/version.Version=${CONTAINERD_VERSION} -X ${CTRD}/version.Revision=gpuq"
for cmd in containerd ctr containerd-shim-runc-v2; do
  build "$cmd" - "${CTRD}/cmd/${cmd}@${CONTAINERD_VERSION}" "$CTRD_LDFLAGS" "no_btrfs no_zfs no_devmapper"
done
if [[ ! -x "$BIN_DIR/runc" ]] && ! pkg-config --exists libseccomp 2>/dev/null; then
  log "runc needs libseccomp-dev: installing it (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev pkg-config >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev pkg-config; }
fi
build runc - "github.com/opencontainers/runc@${RUNC_VERSION}" \
  "-s -w -X main.version=${RUNC_VERSION#v} -X main.gitCommit=gpuq" "seccomp urfave_cli_no_docs" 1
build crictl - "sigs.k8s.io/cri-tools/cmd/crictl@${CRICTL_VERSION}" "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${CRICTL_VERSION}"
CNI=github.com/containernetworking/plugins
for p in main/ptp main/loopback main/bridge ipam/host-local meta/portmap; do
  build "cni-$(basename $p)" - "${CNI}/plugins/${p}@${CNI_PLUGINS_VERSION}" \
    "-s -w -X ${CNI}/pkg/utils/buildversion.BuildVersion=${CNI_PLUGINS_VERSION}"
done
build coredns - "github.com/coredns/coredns@${COREDNS_VERSION}" "-s -w"
# pause: Kubernetes' own C source, from the module cache, linked statically.
if [[ ! -x "$BIN_DIR/pause" ]]; then
  t0=$SECONDS
  src=$(cd "$HACK_DIR/kind/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
  log "pause: gcc -static $src"
  gcc -Os -static -DVERSION="v${PAUSE_VERSION}-gpuq" -o "$BIN_DIR/pause" "$src" 2>"$LOG_DIR/pause.log" \
    || { cat "$LOG_DIR/pause.log" >&2; die "building pause failed"; }
  strip "$BIN_DIR/pause"
  record pause "$((SECONDS - t0))"
fi
log "kind and node binaries ready in $((SECONDS - start))s"
echo "$BIN_DIR"
