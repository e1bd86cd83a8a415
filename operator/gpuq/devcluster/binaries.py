"""Locating (and, when missing, building) the control-plane binaries.

The build itself is hack/build-binaries.sh; this module only decides whether it must run, shows its
progress, and turns its failures into one clear line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from gpuq.devcluster.errors import DevClusterError
from gpuq.devcluster.paths import cache_root

BINARIES: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
# versions.env key -> environment override (the same names the build script honours)
_VERSION_KEYS = {
    "K8S_VERSION": "GPUQ_K8S_VERSION",
    "ETCD_VERSION": "GPUQ_ETCD_VERSION",
    "KWOK_VERSION": "GPUQ_KWOK_VERSION",
}


def hack_dir() -> Path:
    """The repository's hack/ directory (GPUQ_HACK_DIR overrides, for installs outside the checkout)."""
    if explicit := os.environ.get("GPUQ_HACK_DIR"):
        return Path(explicit)
    return Path(__file__).resolve().parents[3] / "hack"


def pinned_versions() -> dict[str, str]:
    """K8S_VERSION / ETCD_VERSION / KWOK_VERSION from hack/versions.env, with environment overrides."""
    pinned = read_env(hack_dir() / "versions.env")
    return {key: os.environ.get(env) or pinned[key].strip() for key, env in _VERSION_KEYS.items()}


def read_env(path: Path) -> dict[str, str]:
    """KEY=value lines of a hack/*.env file (comments and blank lines skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DevClusterError(f"cannot read pinned versions: {exc}") from exc
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#") and "=" in line)


def bin_dir() -> Path:
    """The versioned cache directory the build script installs into."""
    v = pinned_versions()
    key = f"k8s-{v['K8S_VERSION']}_etcd-{v['ETCD_VERSION']}_kwok-{v['KWOK_VERSION']}"
    return cache_root() / "bin" / key


def missing_binaries(directory: Path) -> list[str]:
    return [name for name in BINARIES if not os.access(directory / name, os.X_OK)]


def ensure_binaries(progress: TextIO | None = sys.stderr) -> Path:
    """Return the directory holding all control-plane binaries, building what is missing first.

    GPUQ_BIN_DIR points at prebuilt binaries and skips the build. Build progress (one line per binary)
    goes to `progress`; a failure raises DevClusterError naming the cause and the build log.
    """
    if explicit := os.environ.get("GPUQ_BIN_DIR"):
        directory = Path(explicit)
        if missing := missing_binaries(directory):
            raise DevClusterError(f"GPUQ_BIN_DIR={directory} lacks {', '.join(missing)}")
        return directory
    directory = bin_dir()
    if not missing_binaries(directory):
        return directory
    if shutil.which("go") is None:
        raise DevClusterError(
            "Go is not installed: building the local control plane needs Go >= 1.26 on PATH "
            "(or set GPUQ_BIN_DIR to prebuilt binaries, or use GPUQ_E2E_CLUSTER=kind)"
        )
    return _run_build_script(progress)


def _run_build_script(progress: TextIO | None) -> Path:
    directory = run_hack("build-binaries.sh", "the control-plane binaries", progress)
    if missing := missing_binaries(directory):
        raise DevClusterError(f"the build finished but {directory} lacks {', '.join(missing)}")
    return directory


def run_hack(script_name: str, what: str, progress: TextIO | None, args: tuple[str, ...] = ()) -> Path:
    """Run a hack/ build script, relaying its progress (stderr); the path its last stdout line names."""
    script = hack_dir() / script_name
    proc = subprocess.Popen(
        ["bash", str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None and proc.stdout is not None
    last_line = ""
    for line in proc.stderr:  # relay progress as it happens; remember the final (error) line
        if progress is not None:
            progress.write(line)
            progress.flush()
        last_line = line.strip() or last_line
    out = proc.stdout.read().strip().splitlines()
    if proc.wait() != 0 or not out:
        cause = last_line.removeprefix("gpuq build: error: ") or f"{script} failed"
        raise DevClusterError(f"building {what} failed: {cause}")
    return Path(out[-1])


class GoMissing(DevClusterError):
    """A tool is not built yet and Go is not there to build it."""


def hack_tool(name: str, progress: TextIO | None = sys.stderr) -> Path:
    """The binary hack/<name>.sh builds from Go modules (prometheus, helm), built on first use and
    cached by version. GoMissing when it must be built and Go is absent; DevClusterError when the
    build fails."""
    if shutil.which("go") is None:
        # The script would only report the cached binary; without Go, find it the same way.
        cached = _cached_tool(name)
        if cached is None:
            raise GoMissing(f"{name} is not built and Go is not installed (need Go >= 1.26 to build it)")
        return cached
    binary = run_hack(f"{name}.sh", name, progress)
    if not os.access(binary, os.X_OK):
        raise DevClusterError(f"hack/{name}.sh finished but {binary} is not an executable")
    return binary


def _cached_tool(name: str) -> Path | None:
    """hack/<name>.sh's cached binary: bin/<name>-<version>/<name>, the version from hack/tools.env."""
    key = f"{name.upper()}_VERSION"
    version = os.environ.get(f"GPUQ_{key}") or read_env(hack_dir() / "tools.env")[key].strip()
    binary = cache_root() / "bin" / f"{name}-{version}" / name
    return binary if os.access(binary, os.X_OK) else None
