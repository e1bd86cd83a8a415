#!/usr/bin/env bash
# The images the kind e2e suite loads into its cluster, as archives for `kind load image-archive`:
# the operator image (hack/image.sh, tagged as the manifests name it), kwok's (FROM scratch; kwok
# runs inside the kind cluster to simulate the GPU nodes) and Kubeflow's training-operator's (FROM
# scratch; e2e/test_pytorchjob.py installs it as its Deployment there). Prints the directory holding them.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$HACK_DIR/versions.env"
source "$HACK_DIR/lib.sh"
engine=$(bash "$HACK_DIR/container-engine.sh")
out="${GPUQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuq}/kind-images"
mkdir -p "$out"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$HACK_DIR/../pyproject.toml")
bash "$HACK_DIR/image.sh" "gpuq:$version"
$engine tag "gpuq:$version" "docker.io/library/gpuq:$version"
rm -f "$out/gpuq.tar"
$engine save --format docker-archive -o "$out/gpuq.tar" "docker.io/library/gpuq:$version" >/dev/null
CP_DIR=$(bash "$HACK_DIR/build-binaries.sh" | tail -1)
# binary_image IMAGE BINARY PATH_IN_IMAGE ARCHIVE [LINES]: BINARY (static Go) alone on an empty base,
# as PATH_IN_IMAGE and its entrypoint (LINES: more Dockerfile lines), saved as ARCHIVE in $out (both
# cached by tag and file).
binary_image() {
  local image=$1 binary=$2 inside=$3 archive=$4 ctx
  if ! $engine image inspect "$image" >/dev/null 2>&1; then
    ctx=$(mktemp -d)
    cp "$binary" "$ctx/bin"
    printf 'FROM scratch\nCOPY bin %s\n%bENTRYPOINT ["%s"]\n' "$inside" "${5:-}" "$inside" > "$ctx/Dockerfile"
    $engine build -q -t "$image" "$ctx" >/dev/null
    rm -rf "$ctx"
  fi
  [[ -f "$out/$archive" ]] || $engine save --format docker-archive -o "$out/$archive" "$image" >/dev/null
}
kwok_image="localhost/gpuq/kwok:${KWOK_VERSION}"
binary_image "$kwok_image" "$CP_DIR/kwok" /usr/local/bin/kwok "kwok-${KWOK_VERSION}.tar" 'USER 65532:65532\n'
# Kubeflow's training-operator as its Dockerfile packs it (/manager; distroless static runs it as root).
# shellcheck source=../tools.env
source "$HACK_DIR/tools.env"
TO_DIR=$(bash "$HACK_DIR/training-operator.sh" | tail -1)
to_version="${GPUQ_TRAINING_OPERATOR_VERSION:-$TRAINING_OPERATOR_VERSION}"
to_image="localhost/gpuq/training-operator:$to_version"
binary_image "$to_image" "$TO_DIR/training-operator.v1" /manager "training-operator-$to_version.tar"
log "kind test images in $out: gpuq.tar (docker.io/library/gpuq:$version), kwok-${KWOK_VERSION}.tar ($kwok_image), training-operator-$to_version.tar ($to_image)"
echo "$out"
