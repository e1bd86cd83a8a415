#!/usr/bin/env bash
# Builds an offline kind node image, localhost/gpuq/kind-node:<k8s version>, holding what kind's
# own kindest/node holds: systemd, containerd, runc, crictl, CNI plugins, kubelet, kubeadm, kubectl
# and the images kubeadm deploys (pause, etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kube-proxy, coredns), with no registry:
#   - binaries: hack/kind/build.sh (Go modules, cached by version);
#   - the node's filesystem: Debian bookworm from Debian's packages (debootstrap), plus the files
#     kind's own base image is made of (entrypoint, systemd units, containerd config), read from
#     the kind module in the Go module cache at build time: the same recipe as kindest/base;
#   - component images: FROM scratch (static binaries), kube-proxy on Debian with iptables; they
#     are saved as archives in /kind/images and imported into containerd at boot, before kubelet.
# Differences from kindest/node, for this purpose: kindnet is not built (the default CNI is a static
# ptp/host-local config, enough for a single kind node; /kind/manifests/default-cni.yaml is empty of
# DaemonSets), no local-path storage provisioner (kind falls back to its host-path StorageClass), and
# kubelet may run on cgroup v1 hosts (--fail-cgroupv1=false).
# Usage: hack/kind/node-image.sh   (env: ENGINE, GPUQ_REBUILD=1). Prints the image name last.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$HACK_DIR/versions.env"
source "$HACK_DIR/kind/versions.env"
source "$HACK_DIR/lib.sh"
K8S_VERSION="${GPUQ_K8S_VERSION:-$K8S_VERSION}"
TAG="localhost/gpuq/kind-node:${K8S_VERSION}"
engine=$(bash "$HACK_DIR/container-engine.sh")
if [[ "${GPUQ_REBUILD:-0}" != 1 ]] && $engine image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG: cached"; echo "$TAG"; exit 0
fi
start=$SECONDS
BIN=$(bash "$HACK_DIR/kind/build.sh" | tail -1)
work=$(mktemp -d /var/tmp/gpuq-kind-node.XXXXXX)
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"

# 1. Component images, as kubeadm names them.
iptables_base=localhost/gpuq-base:bookworm-iptables
bash "$HACK_DIR/debian-image.sh" "$iptables_base" iptables,nftables,conntrack,ca-certificates
image() {  # image NAME:TAG FROM ENTRYPOINT FILE:DEST...
  local name=$1 from=$2 entry=$3 ctx="$work/ctx-${1//[\/:]/_}"; shift 3
  mkdir -p "$ctx"
  { echo "FROM $from"
    for f in "$@"; do cp "$BIN/${f%%:*}" "$ctx/"; echo "COPY ${f%%:*} ${f#*:}"; done
    echo 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    [[ -z "$entry" ]] || echo "ENTRYPOINT [\"$entry\"]"
  } > "$ctx/Dockerfile"
  $engine build -q -t "$name" "$ctx" >/dev/null
  $engine save --format docker-archive -o "$work/images/${name//[\/:]/_}.tar" "$name" >/dev/null
  log "image $name"
}
mkdir -p "$work/images"
image "registry.k8s.io/pause:${PAUSE_VERSION}" scratch /pause pause:/pause
image "registry.k8s.io/etcd:${ETCD_IMAGE_TAG}" scratch "" etcd:/usr/local/bin/etcd
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  image "registry.k8s.io/$c:${K8S_VERSION}" scratch "" "$c:/usr/local/bin/$c"
done
image "registry.k8s.io/kube-proxy:${K8S_VERSION}" "$iptables_base" "" kube-proxy:/usr/local/bin/kube-proxy
image "registry.k8s.io/coredns/coredns:${COREDNS_VERSION}" scratch /coredns coredns:/coredns

# 2. The node's root filesystem.
log "node rootfs: debootstrap bookworm (about 2 minutes)"
packages=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod
packages+=,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,jq,procps
debootstrap --variant=minbase --include="$packages" bookworm "$root" http://deb.debian.org/debian \
  >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
kind_src=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@${KIND_VERSION}" \
  | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[[ -d "$kind_src/images/base/files" ]] || die "kind ${KIND_VERSION} source not found in the module cache"
cp -r --no-preserve=ownership "$kind_src/images/base/files/." "$root/"
chmod -R u+w "$root/kind" "$root/etc" "$root/usr/local/bin" "$root/LICENSES"
chmod 755 "$root/kind" "$root/kind/bin" "$root"/kind/bin/*.sh "$root/usr/local/bin/entrypoint" "$root/usr/local/bin/clean-install"
# systemd in a container: no udev, no tmpfiles cleanup of kind's files, nothing started but ours.
rm -f "$root"/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service \
  "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
  "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
  "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> "$root/etc/systemd/journald.conf"
install -m 755 "$BIN"/kubeadm "$BIN"/kubelet "$BIN"/kubectl "$root/usr/bin/"
install -m 755 "$BIN"/containerd "$BIN"/ctr "$BIN"/containerd-shim-runc-v2 "$BIN"/crictl "$root/usr/local/bin/"
install -m 755 "$BIN"/runc "$root/usr/local/sbin/"
mkdir -p "$root/opt/cni/bin" "$root/etc/cni/net.d" "$root/etc/kubernetes/manifests" "$root/kind/images" "$root/kind/manifests"
for p in ptp loopback bridge host-local portmap; do install -m 755 "$BIN/cni-$p" "$root/opt/cni/bin/$p"; done
"$BIN/ctr" oci spec | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' > "$root/etc/containerd/cri-base.json"
sed -i "s#sandbox_image = .*#sandbox_image = \"registry.k8s.io/pause:${PAUSE_VERSION}\"#" "$root/etc/containerd/config.toml"
# Lowering oom_score_adj (pods ask for -998) needs CAP_SYS_RESOURCE, which hosts like ours keep out of
# the bounding set even for --privileged containers: let containerd clamp it, as kind does rootless.
sed -i "s#restrict_oom_score_adj = false#restrict_oom_score_adj = true#" "$root/etc/containerd/config.toml"
grep -q "restrict_oom_score_adj = true" "$root/etc/containerd/config.toml" || die "containerd config: no restrict_oom_score_adj"
# kubelet >= 1.35 refuses cgroup v1 hosts unless told otherwise (kind's template does not).
sed -i 's#^KUBELET_EXTRA_ARGS=.*#& --fail-cgroupv1=false#' "$root/etc/default/kubelet"
echo "$K8S_VERSION" > "$root/kind/version"
cp "$work"/images/*.tar "$root/kind/images/"
cat > "$root/etc/cni/net.d/10-gpuq-ptp.conflist" <<'CNI'
{
  "cniVersion": "1.0.0",
  "name": "kind",
  "plugins": [
    {"type": "ptp", "ipMasq": true, "mtu": 1500,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CNI
cat > "$root/kind/manifests/default-cni.yaml" <<'YAML'
# gpuq's offline node image: pod networking is the static ptp config in /etc/cni/net.d (one node).
apiVersion: v1
kind: ConfigMap
metadata: {name: gpuq-kind-cni, namespace: kube-system}
data: {cni: "static ptp + host-local, /etc/cni/net.d/10-gpuq-ptp.conflist"}
YAML
cat > "$root/etc/systemd/system/gpuq-preload-images.service" <<'UNIT'
[Unit]
Description=Import the preloaded Kubernetes images into containerd (gpuq offline kind node)
After=containerd.service
Requires=containerd.service
Before=kubelet.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for f in /kind/images/*.tar; do ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests "$f" || exit 1; done'
[Install]
WantedBy=multi-user.target
UNIT
mkdir -p "$root/etc/systemd/system/kubelet.service.d"
printf '[Unit]\nAfter=gpuq-preload-images.service\nWants=gpuq-preload-images.service\n' \
  > "$root/etc/systemd/system/kubelet.service.d/20-gpuq-preload.conf"
chroot "$root" systemctl enable kubelet.service containerd.service undo-mount-hacks.service gpuq-preload-images.service >/dev/null 2>&1
chroot "$root" systemctl mask systemd-binfmt.service >/dev/null 2>&1
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb "$root"/usr/share/doc/* "$root"/usr/share/man/*

# 3. The image.
log "importing $TAG"
tar -C "$root" -c . | $engine import \
  --change 'ENV container=docker' --change 'STOPSIGNAL SIGRTMIN+3' \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' - "$TAG" >/dev/null
log "$TAG: $($engine image inspect --format '{{.Size}}' "$TAG" | numfmt --to=iec) built in $((SECONDS - start))s"
echo "$TAG"
