#!/usr/bin/env bash
# Builds a container image from Debian packages (debootstrap; no registry needed) and imports it
# into the container engine. Usage: hack/debian-image.sh TAG PACKAGE[,PACKAGE...] [SUITE]
# An image already present under TAG is kept (the tag names its contents).
set -euo pipefail
tag=$1 packages=$2 suite=${3:-bookworm}
engine=$(bash "$(dirname "$0")/container-engine.sh")
if $engine image inspect "$tag" >/dev/null 2>&1; then exit 0; fi
if ! command -v debootstrap >/dev/null; then
  echo "== installing debootstrap (apt)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
fi
root=$(mktemp -d /var/tmp/gpuq-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "== building $tag from Debian $suite packages ($packages; about a minute)" >&2
debootstrap --variant=minbase --include="$packages" "$suite" "$root" http://deb.debian.org/debian \
  > "$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# What a slim image leaves out too: package downloads and lists, docs, man pages, translations.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
  "$root"/var/log/*.log
tar -C "$root" -c . | $engine import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "== $tag: $($engine image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec)" >&2
