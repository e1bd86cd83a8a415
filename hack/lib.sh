# Shared by the hack/ build scripts (source it): logging, and Go builds into $BIN_DIR that are
# skipped when the binary is cached. Callers set BIN_DIR, LOG_DIR and TIMES (build-times.tsv).

log() { printf '[gpuq build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'gpuq build: error: %s\n' "$*" >&2; exit 1; }

need_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 on PATH to build the local control plane)"
}

# record NAME SECONDS: one line per binary actually built, so cold-build cost stays known later.
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$(date -u +%FT%TZ)" "$(nproc 2>/dev/null || echo ?)" >>"$TIMES"; }

# k8s_ldflags VERSION: the version stamps Kubernetes' own build sets.
k8s_ldflags() {
  local version=$1 minor pkg flags="-s -w"
  minor="${version#v1.}"; minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
    flags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "$flags"
}

# build NAME MODULE_DIR PACKAGE LDFLAGS [TAGS] [CGO_ENABLED]: `go build` PACKAGE inside the
# wrapper module MODULE_DIR (use "-" and PACKAGE@VERSION to `go install` a module instead).
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4" tags="${5:-}" cgo="${6:-0}" logf="$LOG_DIR/$1.log" t0 ok lock
  if [[ -x "$BIN_DIR/$name" ]]; then log "$name: cached"; return; fi
  # One build per binary at a time (hack/prebuild.sh builds in the background while tests may ask
  # for the same tool): a second caller waits for the first and then finds it cached.
  exec {lock}>"$BIN_DIR/.$name.lock"
  if ! flock -n "$lock"; then log "$name: being built by another process; waiting for it"; flock "$lock"; fi
  if [[ -x "$BIN_DIR/$name" ]]; then log "$name: cached"; exec {lock}>&-; return; fi
  need_go
  t0=$SECONDS
  log "$name: building $pkg (log: $logf)"
  if [[ "$dir" == - ]]; then
    local tmp; tmp=$(mktemp -d)
    (cd "$tmp" && CGO_ENABLED=$cgo GOBIN="$tmp" go install -trimpath -tags "$tags" -ldflags "$ldflags" "$pkg") \
      >"$logf" 2>&1 && mv "$tmp/$(basename "${pkg%@*}")" "$BIN_DIR/$name.tmp" && ok=1 || ok=0
    rm -rf "$tmp"
  else
    (cd "$dir" && CGO_ENABLED=$cgo go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$BIN_DIR/$name.tmp" "$pkg") \
      >"$logf" 2>&1 && ok=1 || ok=0
  fi
  if [[ $ok != 1 ]]; then
    tail -n 20 "$logf" >&2
    die "building $name failed; full log: $logf"
  fi
  mv "$BIN_DIR/$name.tmp" "$BIN_DIR/$name"
  exec {lock}>&-
  record "$name" "$((SECONDS - t0))"
  log "$name: built in $((SECONDS - t0))s"
}

# tool_dirs NAME VERSION: BIN_DIR, LOG_DIR and TIMES for a tool built on its own (hack/prometheus.sh,
# hack/helm.sh), cached in bin/NAME-VERSION beside the control plane's directory.
tool_dirs() {
  local root="${GPUQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuq}"
  BIN_DIR="$root/bin/$1-$2" LOG_DIR="$root/build-logs" TIMES="$root/bin/$1-$2/build-times.tsv"
  mkdir -p "$BIN_DIR" "$LOG_DIR"
}

# build_ticking NAME ARGS...: build() with a line every 30 s while it runs, so a cold build of
# several minutes (module downloads, then compiling) visibly makes progress.
build_ticking() {
  local name=$1 t0 ticker
  if [[ -x "$BIN_DIR/$name" ]]; then log "$name: cached"; return; fi
  t0=$(date +%s)
  # The ticker kills its own sleep when stopped: a sleep left behind would hold stderr open.
  (
    trap 'kill $pid 2>/dev/null; exit 0' TERM
    while :; do sleep 30 & pid=$!; wait $pid; log "$name: still building ($(( $(date +%s) - t0 ))s)"; done
  ) >/dev/null &
  ticker=$!
  trap 'kill '"$ticker"' 2>/dev/null || true' EXIT  # build() exits the script when it fails
  build "$@"
  kill "$ticker" 2>/dev/null || true
  trap - EXIT
}
