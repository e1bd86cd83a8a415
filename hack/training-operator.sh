#!/usr/bin/env bash
# Builds Kubeflow's training-operator (PyTorchJob and the other kubeflow.org/v1 job kinds) from its Go
# module, once, into ~/.cache/gpuq/bin/training-operator-<version>/; progress on stderr, the
# directory on the last line. Beside the binary: manifests/, the module's install manifests (what a
# user applies: overlays/standalone; gpuq.peers.training_operator applies them but the Deployment). Its go.mod has no replace directives, so `go install pkg@version` builds
# what its Makefile builds; nothing comes from GitHub or a container registry.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tools.env
source "$HACK_DIR/tools.env"
VERSION="${GPUQ_TRAINING_OPERATOR_VERSION:-$TRAINING_OPERATOR_VERSION}"
# shellcheck source=lib.sh
source "$HACK_DIR/lib.sh"
tool_dirs training-operator "$VERSION"
need_go

module=github.com/kubeflow/training-operator
if [[ ! -f "$BIN_DIR/manifests/.copied" ]]; then
  log "training-operator: downloading module ${module}@${VERSION}"
  src=$(cd "$(mktemp -d)" && go mod download -json "${module}@${VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d "$src" ]] || die "go mod download ${module}@${VERSION} gave no directory"
  rm -rf "$BIN_DIR/manifests"
  cp -r "$src/manifests" "$BIN_DIR/manifests"
  chmod -R u+w "$BIN_DIR/manifests"
  touch "$BIN_DIR/manifests/.copied"
fi
build_ticking training-operator.v1 - "${module}/cmd/training-operator.v1@${VERSION}" "-s -w"
echo "$BIN_DIR"
