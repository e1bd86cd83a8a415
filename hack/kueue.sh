#!/usr/bin/env bash
# Builds Kueue from its Go module, once, into a cache directory keyed by version
# (~/.cache/gpuq/bin/kueue-<version>/); progress on stderr, the directory on the last line.
#   hack/kueue.sh [BINARY...]   (default: all three)
#   manager                        the full Kueue controller manager (cmd/kueue), as a Kueue user runs it
#   minimalkueue                   Kueue's own benchmark manager: core controllers and the scheduler only
#   performance-scheduler-runner   Kueue's scheduler benchmark runner (test/performance/scheduler/runner)
#   module/                        the module's config/ (CRDs, webhook manifests, RBAC) and its benchmark
#                                  configs (test/performance/scheduler/configs), copied from the module cache
# Kueue's go.mod has no replace directives, so `go install pkg@version` of the published module builds
# each binary as Kueue's Makefile does (same packages, its version stamps); nothing comes from GitHub.
# bench/kueue_perf.py, bench/e2e_throughput.py and bench/spike.py run them (gpuq.devcluster.kueue).
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tools.env
source "$HACK_DIR/tools.env"
VERSION="${GPUQ_KUEUE_VERSION:-$KUEUE_VERSION}"
# shellcheck source=lib.sh
source "$HACK_DIR/lib.sh"
tool_dirs kueue "$VERSION"
need_go

module=sigs.k8s.io/kueue
if [[ ! -f "$BIN_DIR/module/.copied" ]]; then
  log "kueue: downloading module ${module}@${VERSION}"
  src=$(cd "$(mktemp -d)" && go mod download -json "${module}@${VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d "$src" ]] || die "go mod download ${module}@${VERSION} gave no directory"
  rm -rf "$BIN_DIR/module"
  mkdir -p "$BIN_DIR/module/test/performance/scheduler"
  cp -r "$src/config" "$BIN_DIR/module/config"
  cp -r "$src/test/performance/scheduler/configs" "$BIN_DIR/module/test/performance/scheduler/configs"
  chmod -R u+w "$BIN_DIR/module"
  touch "$BIN_DIR/module/.copied"
fi

pkg=${module}/pkg/version
ldflags="-s -w -X '$pkg.GitVersion=${VERSION}' -X '$pkg.GitCommit=gpuq' -X '$pkg.BuildDate=1970-01-01T00:00:00Z'"
# Kueue's Makefile builds with CGO_ENABLED=0 (GO_BUILD_ENV): so does build().
declare -A pkgs=(
  [manager]=cmd/kueue
  [minimalkueue]=test/performance/scheduler/minimalkueue
  [performance-scheduler-runner]=test/performance/scheduler/runner
)
for name in "${@:-minimalkueue performance-scheduler-runner manager}"; do
  for bin in $name; do
    [[ -n "${pkgs[$bin]:-}" ]] || die "unknown Kueue binary $bin (${!pkgs[*]})"
    build_ticking "$bin" - "${module}/${pkgs[$bin]}@${VERSION}" "$ldflags"
  done
done
echo "$BIN_DIR"
