"""What e2e tests (and the demo) hold: a handle on a real cluster with GPU nodes, the same whichever
backend started it (gpuq.devcluster, kind, or an existing cluster). e2e/conftest.py builds it;
tests import it from here (never from conftest) for types and helpers:

    from gpuq.devcluster.testing import E2ECluster, wait_for
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client as k8s

from gpuq.devcluster.shape import GPU_RESOURCE, RACK_LABEL, Shape

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `check` until it returns something truthy and return that; TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def built_tool(name: str) -> Path:
    """hack/<name>.sh's binary (prometheus, helm) for a test, built on first use with its progress
    shown past pytest's capture (`required_build`)."""
    from gpuq.devcluster.binaries import hack_tool

    return required_build(name, lambda progress: hack_tool(name, progress=progress))


def required_build(name: str, build: Callable[[Any], T]) -> T:
    """What `build(progress)` builds from Go modules, for a test. Without Go the test skips, unless
    GPUQ_REQUIRE_<NAME> is set (as .ci/run does), which makes it fail; a build that fails always
    fails the test."""
    import os
    import sys

    import pytest

    from gpuq.devcluster.binaries import GoMissing
    from gpuq.devcluster.errors import DevClusterError

    require = f"GPUQ_REQUIRE_{name.upper()}"
    try:
        return build(sys.__stderr__)
    except GoMissing as exc:
        if os.environ.get(require):
            pytest.fail(f"{exc} ({require} is set)")
        pytest.skip(str(exc))
    except DevClusterError as exc:
        pytest.fail(str(exc))


def node_is_ready(node: Any) -> bool:
    """Ready=True (a kubernetes client V1Node)."""
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


@dataclass
class E2ECluster:
    """A cluster for tests.

    backend: "local" | "kind" | "existing".  kubeconfig: admin kubeconfig path.  api: a kubernetes
    ApiClient for it (`core` is a CoreV1Api on it).  shape: the simulated fleet (None unless the
    cluster is a gpuq dev cluster).  simulated_pods: pods follow the gpuq.dev/sim-* annotations
    (kwok nodes); on kind they really run IMAGE.  GPU nodes are the nodes with a gpuq.dev/rack label.
    """

    IMAGE = "registry.k8s.io/pause:3.10"  # use for test pods: valid on kwok and on kind alike

    backend: str
    kubeconfig: Path
    api: k8s.ApiClient
    simulated_pods: bool
    shape: Shape | None = None
    _fail: Callable[[str], None] | None = field(repr=False, default=None)
    _recover: Callable[[str], None] | None = field(repr=False, default=None)
    # The gpuq dev cluster behind it, if any: its control-plane processes can be broken on purpose
    # (restart, pause) by chaos tests. None on kind and foreign clusters.
    dev: Any = field(repr=False, default=None)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def gpu_nodes(self) -> list[Any]:
        return list(self.core.list_node(label_selector=RACK_LABEL).items)

    @property
    def nodes_by_rack(self) -> dict[str, list[str]]:
        """GPU node names per rack label value, sorted."""
        racks: dict[str, list[str]] = {}
        for node in self.gpu_nodes():
            racks.setdefault(node.metadata.labels[RACK_LABEL], []).append(node.metadata.name)
        return {rack: sorted(names) for rack, names in sorted(racks.items())}

    @property
    def node_names(self) -> list[str]:
        return [name for names in self.nodes_by_rack.values() for name in names]

    @property
    def gpus_per_node(self) -> int:
        """The largest nvidia.com/gpu allocatable of any node."""
        return max(int((n.status.allocatable or {}).get(GPU_RESOURCE, 0)) for n in self.gpu_nodes())

    def node_ready(self, name: str) -> bool:
        return node_is_ready(self.core.read_node(name))

    def require_simulated_pods(self, what: str) -> None:
        """Skip the calling test unless pods follow the gpuq.dev/sim-* annotations: on a foreign
        cluster a pod told to finish after 2 s runs forever, and the test would time out, not fail."""
        if not self.simulated_pods:
            import pytest  # only tests call this; the library does not depend on pytest

            pytest.skip(
                f"{what} needs simulated pods (gpuq.dev/sim-*); backend {self.backend!r} runs real ones"
            )

    @property
    def can_fail_nodes(self) -> bool:
        return self._fail is not None

    def fail_node(self, name: str, timeout: float = 30.0) -> None:
        """Kill the node the way a real one dies (its heartbeat stops) and wait until it is NotReady."""
        if self._fail is None:
            raise NotImplementedError(f"backend {self.backend!r} cannot fail nodes (check can_fail_nodes)")
        self._fail(name)
        wait_for(lambda: not self.node_ready(name), timeout, f"node {name} NotReady")

    def recover_node(self, name: str, timeout: float = 30.0) -> None:
        """Bring a failed node back and wait until it is Ready."""
        if self._recover is None:
            raise NotImplementedError(f"backend {self.backend!r} cannot recover nodes")
        self._recover(name)
        wait_for(lambda: self.node_ready(name), timeout, f"node {name} Ready")
