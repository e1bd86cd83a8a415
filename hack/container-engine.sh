#!/usr/bin/env bash
# Prints the container engine command to use (ENGINE=docker|podman overrides): a running docker
# daemon, else podman, installing Debian's podman (and runc) when neither is there (root, apt).
#
# For podman it prints `env CONTAINERS_CONF=<file> podman`, with a containers.conf written for this
# host: on cgroup v1/hybrid hosts crun refuses to start containers ("cgroups in hybrid mode not
# supported"), so runc is the runtime; and containers get ulimits within the host's hard limits
# (podman's defaults exceed them where CAP_SYS_RESOURCE is not in the bounding set, and
# `--privileged` then fails to start).
set -euo pipefail
apt_install() {
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "no container engine: install podman (or docker) and runc, or start dockerd" >&2; exit 1
  fi
  echo "== installing $* (apt)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2; }
}
engine=${ENGINE:-}
if [[ -z "$engine" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker; else engine=podman; fi
fi
if [[ "$engine" != podman ]]; then echo "$engine"; exit 0; fi
command -v podman >/dev/null || apt_install podman
hybrid=0
[[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] || hybrid=1
[[ $hybrid == 0 ]] || command -v runc >/dev/null || apt_install runc
conf_dir="${GPUQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuq}/podman"
mkdir -p "$conf_dir"
nofile=$(ulimit -Hn); [[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
nproc=$(ulimit -Hu); [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
{
  echo "# written by gpuq hack/container-engine.sh for this host"
  echo "[containers]"
  echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
  if [[ $hybrid == 1 ]]; then echo "[engine]"; echo 'runtime = "runc"'; fi
} > "$conf_dir/containers.conf"
echo "env CONTAINERS_CONF=$conf_dir/containers.conf podman"
