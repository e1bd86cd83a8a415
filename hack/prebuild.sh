#!/usr/bin/env bash
# Builds what the later test stages need (kind and its node image, Prometheus, helm, Kueue, Kubeflow's
# training-operator) in the
# background at the lowest CPU priority, while the local suites run: those mostly wait on the API
# server, and on a cold machine the Go builds are a third of `make test`. Warm, everything is cached
# and this takes a second.
#
#   hack/prebuild.sh start   launch it (returns at once; log in ~/.cache/gpuq/prebuild.log)
#   hack/prebuild.sh wait    wait for it and show its progress (a failed step is reported, not fatal)
#
# A test that needs one of the tools before the background build is done runs the same script,
# which waits on the build's lock (hack/lib.sh) instead of building it twice.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${GPUQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuq}"
mkdir -p "$CACHE_ROOT"
LOG="$CACHE_ROOT/prebuild.log" PID="$CACHE_ROOT/prebuild.pid" RC="$CACHE_ROOT/prebuild.rc"

# A step that fails here is only reported: the stage that needs it runs the same script again and
# fails (or skips) by its own rules, as it would without this head start.
steps() {
  local step
  for step in prometheus.sh helm.sh "kueue.sh minimalkueue performance-scheduler-runner" training-operator.sh \
    kind/node-image.sh; do
    # shellcheck disable=SC2086  # a step may carry arguments
    bash "$HACK_DIR"/$step >/dev/null || echo "== background: hack/$step failed"
  done
}

case "${1:-}" in
  start)
    rm -f "$RC"
    (
      set +e
      nice -n 19 bash -c "$(declare -f steps); HACK_DIR='$HACK_DIR'; steps" >"$LOG" 2>&1
      echo $? >"$RC"
    ) </dev/null &
    echo $! >"$PID"
    echo "== building kind, its node image, Prometheus, helm, Kueue and the training-operator in the background (nice 19; log: $LOG)"
    ;;
  wait)
    [[ -f "$PID" ]] || { echo "hack/prebuild.sh wait: nothing was started" >&2; exit 1; }
    pid=$(cat "$PID") shown=0
    while kill -0 "$pid" 2>/dev/null && [[ ! -f "$RC" ]]; do
      lines=$(wc -l <"$LOG")
      if (( lines > shown )); then tail -n "+$((shown + 1))" "$LOG" | grep '^\[gpuq build' || true; shown=$lines; fi
      sleep 5
    done
    for _ in 1 2 3 4 5; do [[ -f "$RC" ]] && break; sleep 1; done
    grep '^== background' "$LOG" || true
    echo "== background builds done (log: $LOG)"
    ;;
  *) echo "usage: hack/prebuild.sh start|wait" >&2; exit 2 ;;
esac
