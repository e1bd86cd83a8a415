#!/usr/bin/env bash
# Builds helm from Go modules, once, into a cache directory keyed by version
# (~/.cache/gpuq/bin/helm-<version>/); progress on stderr, the binary's path on the last line.
# tests/deploy/test_chart.py renders charts/gpuq with it and e2e/test_chart_install.py installs it.
# helm.sh/helm/v4's go.mod has no replace directives: `go install` of the published module is enough.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tools.env
source "$HACK_DIR/tools.env"
VERSION="${GPUQ_HELM_VERSION:-$HELM_VERSION}"
# shellcheck source=lib.sh
source "$HACK_DIR/lib.sh"
tool_dirs helm "$VERSION"

major=${VERSION%%.*}  # v4: the module path's major version suffix
module="helm.sh/helm/${major}"
ldflags="-s -w -X ${module}/internal/version.version=${VERSION} -X ${module}/internal/version.gitTreeState=clean"
build_ticking helm - "${module}/cmd/helm@${VERSION}" "$ldflags"
echo "$BIN_DIR/helm"
