#!/usr/bin/env bash
# Builds the Prometheus server from Go modules, once, into a cache directory keyed by version
# (~/.cache/gpuq/bin/prometheus-<version>/); progress on stderr, the binary's path on the last line.
# It is what e2e/test_observability.py runs to scrape the operator and evaluate every expression of
# deploy/grafana/ and deploy/prometheus/ through the HTTP API. Build choices:
#   - `go install` of the published module: its go.mod has no replace directives, so no wrapper
#     module is needed (unlike hack/k8s);
#   - tag remove_all_sd: no cloud/Kubernetes service discovery (static and file targets remain),
#     which spares the build the AWS, Azure, GCP and client-go dependency trees;
#   - no tag builtinassets: the React UI is not embedded (it needs an npm build); the API and the
#     rule engine are all there.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tools.env
source "$HACK_DIR/tools.env"
VERSION="${GPUQ_PROMETHEUS_VERSION:-$PROMETHEUS_VERSION}"
# shellcheck source=lib.sh
source "$HACK_DIR/lib.sh"
tool_dirs prometheus "$VERSION"

# Module v0.MMmm.p is Prometheus M.mm.p (v0.316.0: 3.16.0): what `prometheus --version` reports.
release=${VERSION#v0.}
minors=${release%%.*}
release="$((10#$minors / 100)).$((10#$minors % 100)).${release#*.}"
pkg=github.com/prometheus/common/version
ldflags="-s -w -X $pkg.Version=$release -X $pkg.Revision=gpuq -X $pkg.Branch=HEAD"
ldflags+=" -X $pkg.BuildUser=gpuq -X $pkg.BuildDate=19700101-00:00:00"
build_ticking prometheus - "github.com/prometheus/prometheus/cmd/prometheus@${VERSION}" "$ldflags" remove_all_sd
echo "$BIN_DIR/prometheus"
