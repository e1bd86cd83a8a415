"""Kill the operator at any moment and start it again: state is rebuilt from the API server,
nothing is bound twice, no job is lost or stuck."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

import test_operator as shared
from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, OperatorProcess
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

# Fixtures shared with test_operator.py (this module brings its own `operator`).
gpuq = shared.gpuq
ns = shared.ns
queue = shared.queue
phase = shared.phase


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster, gpuq: GpuqClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    work = tmp_path_factory.mktemp("operator-restart")
    op = OperatorProcess(cluster.kubeconfig, work / "operator.log", log_level="DEBUG").start()
    yield op
    op.stop()
    print(f"operator log: {op.log_path}")


def gang_state(cluster: E2ECluster, gpuq: GpuqClient, ns: str) -> dict[str, tuple[int, tuple[str, ...]]]:
    """job -> (attempt, nodes by rank), checking that the live pods match the recorded placement."""
    state = {}
    for job in gpuq.jobs(ns):
        name, st = job["metadata"]["name"], job.get("status") or {}
        placement = tuple(p["node"] for p in sorted(st.get("placement") or [], key=lambda p: p["rank"]))
        live = [
            p
            for p in gpuq.pods(ns, name)
            if p.status.phase in ("Pending", "Running") and not p.metadata.deletion_timestamp
        ]
        assert len(live) == len(placement), (name, [p.metadata.name for p in live], placement)
        for pod in live:
            assert pod.metadata.labels[meta.LABEL_ATTEMPT] == str(st["attempt"]), pod.metadata.name
            assert pod.spec.node_name == placement[int(pod.metadata.labels[meta.LABEL_RANK])], (
                pod.metadata.name
            )
        state[name] = (st["attempt"], placement)
    return state


def assert_no_node_overcommitted(cluster: E2ECluster) -> None:
    used: dict[str, int] = {}
    for pod in cluster.core.list_pod_for_all_namespaces().items:
        if pod.spec.node_name and pod.status.phase in ("Pending", "Running"):
            for c in pod.spec.containers:
                gpus = int(((c.resources and c.resources.limits) or {}).get("nvidia.com/gpu", 0))
                used[pod.spec.node_name] = used.get(pod.spec.node_name, 0) + gpus
    assert all(v <= cluster.gpus_per_node for v in used.values()), used


def test_operator_killed_mid_admission_and_restarted_never_double_binds(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
) -> None:
    q = queue(10_000)
    g = cluster.gpus_per_node
    jobs = [f"j{i}" for i in range(len(cluster.node_names) // 2)]  # together they fill the cluster
    for name in jobs:
        gpuq.submit(ns, name, q, 2, g)
    # Kill as soon as the first gang pod exists (pods come before the status that records them,
    # gpuq.controller.record): other gangs are half-created, others created without a status yet.
    wait_for(lambda: bool(gpuq.core.list_namespaced_pod(ns).items), 30, "first gang pod")
    operator.kill()
    half_done = {j: gpuq.status(ns, j).get("phase") for j in jobs}
    operator.start()
    for name in jobs:
        phase(gpuq, operator, ns, name, "Running", timeout=90)
    before = gang_state(cluster, gpuq, ns)
    assert_no_node_overcommitted(cluster)
    assert len({n for _, nodes in before.values() for n in nodes}) == 2 * len(jobs), before
    print(f"phases when killed: {half_done}")
    # A restart in a steady state changes nothing at all.
    uids = {p.metadata.uid for p in gpuq.core.list_namespaced_pod(ns).items}
    operator.kill()
    operator.start()
    time.sleep(5)
    assert operator.alive
    assert gang_state(cluster, gpuq, ns) == before
    assert {p.metadata.uid for p in gpuq.core.list_namespaced_pod(ns).items} == uids
