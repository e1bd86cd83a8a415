"""Kueue built from its Go module (hack/kueue.sh), located in the cache and built on first use."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpuq.devcluster.binaries import GoMissing, hack_dir, read_env, run_hack
from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.paths import cache_root

BINARIES = ("manager", "minimalkueue", "performance-scheduler-runner")
BENCHMARK = ("minimalkueue", "performance-scheduler-runner")  # Kueue's scheduler benchmark alone


@dataclass(frozen=True)
class KueueBuild:
    """What hack/kueue.sh leaves in ~/.cache/gpuq/bin/kueue-<version>/."""

    directory: Path
    version: str

    @property
    def manager(self) -> Path:
        return self.directory / "manager"

    @property
    def minimalkueue(self) -> Path:
        return self.directory / "minimalkueue"

    @property
    def runner(self) -> Path:
        return self.directory / "performance-scheduler-runner"

    @property
    def module(self) -> Path:
        """The module's config/ and test/performance/scheduler/configs/, copied from the module cache."""
        return self.directory / "module"

    @property
    def crds(self) -> Path:
        return self.module / "config" / "components" / "crd" / "bases"

    @property
    def perf_configs(self) -> Path:
        return self.module / "test" / "performance" / "scheduler" / "configs"

    def missing(self, binaries: tuple[str, ...] = BINARIES) -> list[str]:
        gone = [b for b in binaries if not os.access(self.directory / b, os.X_OK)]
        return gone + ([] if (self.module / ".copied").exists() else ["module/"])


def version() -> str:
    return os.environ.get("GPUQ_KUEUE_VERSION") or read_env(hack_dir() / "tools.env")["KUEUE_VERSION"].strip()


def cached() -> KueueBuild:
    return KueueBuild(cache_root() / "bin" / f"kueue-{version()}", version())


def ensure_kueue(progress: TextIO | None = sys.stderr, binaries: tuple[str, ...] = BINARIES) -> KueueBuild:
    """Kueue's `binaries` and files, built first when missing (minutes, with progress). GoMissing
    without Go to build them; DevClusterError when the build fails."""
    build = cached()
    if not build.missing(binaries):
        return build
    if shutil.which("go") is None:
        raise GoMissing(f"Kueue {build.version} is not built and Go is not installed (need Go >= 1.26)")
    directory = run_hack("kueue.sh", f"Kueue {build.version}", progress, args=binaries)
    build = KueueBuild(directory, build.version)
    if missing := build.missing(binaries):
        raise DevClusterError(f"hack/kueue.sh finished but {directory} lacks {', '.join(missing)}")
    return build
