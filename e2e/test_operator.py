"""The operator end to end on a real API server: admission, quota, gangs, topology, cohorts,
preemption, completion, failures and bad input. One operator process serves the whole module."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, OperatorProcess, install_crds
from gpuq.devcluster import SIM_DURATION
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

FAST_CONFIG = "failover: {notReadyGraceSeconds: 2}\n"


@pytest.fixture(scope="module")
def gpuq(cluster: E2ECluster) -> GpuqClient:
    install_crds(cluster.api)
    return GpuqClient(cluster.api)


@pytest.fixture(scope="module")
def operator(cluster: E2ECluster, gpuq: GpuqClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    work = tmp_path_factory.mktemp("operator")
    (work / "config.yaml").write_text(FAST_CONFIG)
    op = OperatorProcess(cluster.kubeconfig, work / "operator.log", work / "config.yaml").start()
    yield op
    op.stop()
    print(f"operator log: {op.log_path}")


@pytest.fixture
def ns(namespace: str, gpuq: GpuqClient, operator: OperatorProcess) -> Iterator[str]:
    """A namespace whose jobs (and so their pods) are gone after the test, freeing the GPUs."""
    yield namespace
    for job in gpuq.jobs(namespace):
        gpuq.delete_job(namespace, job["metadata"]["name"])
    wait_for(lambda: not gpuq.core.list_namespaced_pod(namespace).items, 60, f"pods of {namespace} gone")


@pytest.fixture
def queue(gpuq: GpuqClient) -> Iterator[Callable[..., str]]:
    made: list[str] = []

    def make(nominal: int, **spec: Any) -> str:
        name = f"q-{uuid.uuid4().hex[:6]}"
        gpuq.create_queue(name, nominal, **spec)
        made.append(name)
        return name

    yield make
    for name in made:
        gpuq.delete_queue(name)


def phase(gpuq: GpuqClient, op: OperatorProcess, ns: str, name: str, phases: str | tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
    try:
        return gpuq.wait_phase(ns, name, phases, timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; status={gpuq.status(ns, name)}\n--- operator log ---\n{op.log_tail()}") from None


def test_job_is_admitted_and_its_gang_bound_and_running(
    gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    q = queue(32)
    gpuq.submit(ns, "llm", q, replicas=2, gpus=8)
    st = phase(gpuq, operator, ns, "llm", "Running")
    placement = {p["rank"]: p["node"] for p in st["placement"]}
    assert sorted(placement) == [0, 1] and st["attempt"] == 1 and st["gpus"] == 16
    pods = {int(p.metadata.labels[meta.LABEL_RANK]): p for p in gpuq.pods(ns, "llm")}
    assert sorted(pods) == [0, 1]
    for rank, pod in pods.items():
        assert pod.spec.node_name == placement[rank]
        assert pod.spec.scheduler_name == "gpuq"
        assert pod.status.phase == "Running"
        assert pod.metadata.labels[meta.LABEL_QUEUE] == q and pod.metadata.labels[meta.LABEL_ATTEMPT] == "1"
        assert pod.metadata.owner_references[0].kind == "TrainingJob"
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == f"worker-0.llm.{ns}.svc"
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
    svc = gpuq.core.read_namespaced_service("llm", ns)
    assert svc.spec.cluster_ip == "None"
    reasons = {e.reason for e in gpuq.events(ns, "llm")}
    assert {"Admitted", "Running"} <= reasons
    wait_for(lambda: gpuq.queue(q).get("status", {}).get("usedGPUs") == 16, 20, "queue usage published")
