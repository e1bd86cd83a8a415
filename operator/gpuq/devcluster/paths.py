"""Where the dev cluster keeps things: one cache root, one state directory per named cluster."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")


def cache_root() -> Path:
    """~/.cache/gpuq unless GPUQ_CACHE_DIR or XDG_CACHE_HOME say otherwise (as in hack/build-binaries.sh)."""
    if explicit := os.environ.get("GPUQ_CACHE_DIR"):
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "gpuq"


def clusters_root() -> Path:
    return cache_root() / "clusters"


def validate_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"invalid cluster name {name!r}: use 1-40 lowercase letters, digits or '-' (not first or last)"
        )
    return name


@dataclass(frozen=True)
class ClusterPaths:
    """Files of one named cluster; everything `down` and `status` need to work from another process."""

    root: Path

    @classmethod
    def for_name(cls, name: str) -> ClusterPaths:
        return cls(clusters_root() / validate_name(name))

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig handed to users and tests."""
        return self.root / "kubeconfig"

    def component_kubeconfig(self, component: str) -> Path:
        return self.config / f"{component}.kubeconfig"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"
