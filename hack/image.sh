#!/usr/bin/env bash
# Builds the operator image (Dockerfile) with docker or podman. The standard base image
# (python:3.11-slim-bookworm) is used when it can be pulled; otherwise an equivalent Debian
# bookworm + Python 3.11 base is built from Debian packages and passed in as BASE_IMAGE.
# Usage: hack/image.sh [TAG]   (env: ENGINE, BASE_IMAGE)
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-gpuq:$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
engine=$(bash hack/container-engine.sh)
standard=python:3.11-slim-bookworm
base=${BASE_IMAGE:-}
if [[ -z "$base" ]]; then
  if $engine image inspect "$standard" >/dev/null 2>&1 \
     || timeout 30 $engine pull -q "docker.io/library/$standard" >/dev/null 2>&1; then
    base=$standard
  else
    base=localhost/gpuq-base:bookworm-python3
    echo "== $standard cannot be pulled here: using $base, built from Debian packages" >&2
    bash hack/debian-image.sh "$base" python3,python3-venv,ca-certificates
  fi
fi
echo "== wheels: gpuq and its dependencies into build/wheelhouse" >&2
rm -rf build/wheelhouse
python=${PYTHON:-.venv/bin/python}
[[ -x $python ]] || python=python3
$python -m pip wheel --quiet --disable-pip-version-check -w build/wheelhouse . >&2
echo "== ${engine##* } build -t $tag (base $base)" >&2
$engine build -q --build-arg "BASE_IMAGE=$base" -t "$tag" . >/dev/null
size=$($engine image inspect --format '{{.Size}}' "$tag")
echo "== built $tag: $(numfmt --to=iec "$size") ($size bytes) with ${engine##* }" >&2
