#!/usr/bin/env bash
# The images the kind e2e suite loads into its cluster, as archives for `kind load image-archive`:
# the operator image (hack/image.sh, tagged as the manifests name it) and kwok's (FROM scratch; kwok
# runs inside the kind cluster to simulate the GPU nodes). Prints the directory holding them.
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
kwok_image="localhost/gpuq/kwok:${KWOK_VERSION}"
if ! $engine image inspect "$kwok_image" >/dev/null 2>&1; then
  ctx=$(mktemp -d)
  cp "$CP_DIR/kwok" "$ctx/"
  printf 'FROM scratch\nCOPY kwok /usr/local/bin/kwok\nUSER 65532:65532\nENTRYPOINT ["/usr/local/bin/kwok"]\n' > "$ctx/Dockerfile"
  $engine build -q -t "$kwok_image" "$ctx" >/dev/null
  rm -rf "$ctx"
fi
[[ -f "$out/kwok-${KWOK_VERSION}.tar" ]] || $engine save --format docker-archive -o "$out/kwok-${KWOK_VERSION}.tar" "$kwok_image" >/dev/null
log "kind test images in $out: gpuq.tar (docker.io/library/gpuq:$version), kwok-${KWOK_VERSION}.tar ($kwok_image)"
echo "$out"
