#!/usr/bin/env bash
# kind, built from Go modules (hack/kind/build.sh), run with this host's container engine: podman
# (KIND_EXPERIMENTAL_PROVIDER=podman, and hack/container-engine.sh's containers.conf) unless a docker
# daemon is running. Hand this script to pytest-kind as the kind binary. kind mounts /lib/modules
# read-only into its nodes; a host without it (a container, a sandbox) gets an empty one.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN=$(bash "$HACK_DIR/kind/build.sh" 2>/dev/null | tail -1)
read -r -a engine <<< "$(bash "$HACK_DIR/container-engine.sh")"  # [env VAR=VALUE] podman|docker
if [[ "${engine[-1]}" == podman ]]; then
  export KIND_EXPERIMENTAL_PROVIDER=podman
  [[ "${engine[0]}" != env ]] || export "${engine[1]}"
fi
[[ -d /lib/modules ]] || mkdir -p /lib/modules
exec "$BIN/kind" "$@"
