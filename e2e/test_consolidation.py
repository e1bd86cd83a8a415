"""Consolidation end to end: two nodes each half used by a small gang, and a starving whole-node gang.
The operator moves one small gang onto the other node's free half (it restarts there) and the big
gang gets the node that came free. Without consolidation the big gang would wait for a small one to
finish."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import test_operator as shared
from gpuq.controller.testing import GpuqClient, OperatorProcess
from gpuq.devcluster.testing import E2ECluster
from test_constraints import template

pytestmark = pytest.mark.e2e

gpuq = shared.gpuq
ns = shared.ns
queue = shared.queue
# Heads starve and may have gangs moved for them after 1 s; gangs may be moved after 2 s of running;
# nobody reaches a service level.
CONSOLIDATION_CONFIG = shared.FAST_CONFIG + (
    "starvationSeconds: 1\n"
    "service: {thresholdsGPUHours: [1000], preempt: true, minRunSeconds: 2}\n"
    "consolidation: {enabled: true, maxMovedGPUs: 32, minWaitSeconds: 1}\n"
)


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster, gpuq: GpuqClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    yield from shared.run_operator(cluster, tmp_path_factory, "consolidation-operator", CONSOLIDATION_CONFIG)


def on_nodes(nodes: list[str]) -> dict[str, Any]:
    """Worker spec fields that keep a job on `nodes` (required node affinity)."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    return {"workers": {"template": template(affinity=affinity)}}


def node_of(status: dict[str, Any]) -> str:
    (node,) = {p["node"] for p in status["placement"]}
    return str(node)


def test_a_small_gang_moves_so_a_starving_whole_node_gang_fits(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Any
) -> None:
    g = cluster.gpus_per_node
    pair = next(iter(cluster.nodes_by_rack.values()))[:2]
    q = queue(4 * g)
    for i in range(4):  # best fit packs two halves per node
        gpuq.submit(ns, f"half{i}", q, 1, g // 2, **on_nodes(pair))
    where = {f"half{i}": node_of(shared.phase(gpuq, operator, ns, f"half{i}", "Running")) for i in range(4)}
    assert sorted(where.values()) == sorted(pair * 2)
    gone = [next(name for name, n in where.items() if n == node) for node in pair]
    for name in gone:  # leave one half on each node: g/2 GPUs free on each, no whole node
        gpuq.delete_job(ns, name)
    kept = sorted(set(where) - set(gone))

    gpuq.submit(ns, "big", q, 1, g, **on_nodes(pair))
    big = shared.phase(gpuq, operator, ns, "big", "Running", timeout=90)
    moved = [name for name in kept if gpuq.status(ns, name).get("preemptions", 0) == 1]
    assert len(moved) == 1, {name: gpuq.status(ns, name) for name in kept}
    (stayed,) = set(kept) - set(moved)
    after = shared.phase(gpuq, operator, ns, moved[0], "Running", timeout=90)
    assert after["attempt"] == 2
    assert node_of(after) == node_of(gpuq.status(ns, stayed)) != node_of(big)
    reasons = [e.message for e in gpuq.events(ns, moved[0]) if "moved to make room for" in (e.message or "")]
    assert reasons, [e.message for e in gpuq.events(ns, moved[0])]
