"""PyTorchJobs as gangs (docs/existing-workloads.md) on a real API server with Kubeflow's
training-operator v1.8.1 installed as its users install it (built from its Go module,
hack/training-operator.sh; gpuq.peers.training_operator): a PyTorchJob whose pods ask for gpuq is
bound whole, Master and Workers at once, and a higher-priority TrainingJob preempts it by
suspending it (runPolicy.suspend), after which it runs again and succeeds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

import test_existing_workloads as workloads
import test_operator as shared
from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, OperatorProcess, pytorchjob_body
from gpuq.devcluster import SIM_DURATION, ensure_binaries
from gpuq.devcluster.testing import E2ECluster, required_build, wait_for
from gpuq.peers.training_operator import (
    TrainingOperatorDeployment,
    TrainingOperatorStack,
    ensure_training_operator,
)

pytestmark = pytest.mark.e2e

gpuq, ns, queue, phase = shared.gpuq, shared.ns, shared.queue, shared.phase
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"


@pytest.fixture(scope="module")
def training_operator(
    cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TrainingOperatorStack | TrainingOperatorDeployment]:
    """A local process beside the local cluster (it runs no containers); its Deployment on kind,
    from the image the kind fixture loaded (hack/kind/images.sh)."""
    cluster.require_simulated_pods("PyTorchJobs that finish on time")
    if cluster.dev is None and cluster.backend != "kind":
        pytest.skip("the training-operator is installed by this suite on a local or kind cluster only")
    build = required_build("training_operator", ensure_training_operator)
    work = tmp_path_factory.mktemp("training-operator")
    kubectl = ensure_binaries() / "kubectl"
    if cluster.dev is None:
        deployed = TrainingOperatorDeployment(build, kubectl, cluster.kubeconfig, work)
        deployed.up()
        yield deployed
        print(f"training-operator log (last lines):\n{deployed.logs()}")
        deployed.down()
        return
    stack = TrainingOperatorStack(build, kubectl, cluster.kubeconfig, work)
    stack.up()
    yield stack
    stack.down()
    print(f"training-operator log: {work / 'training-operator.log'}")


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    training_operator: TrainingOperatorStack | TrainingOperatorDeployment,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    # Started after the CRD exists: an operator started before finds the kind within a minute.
    yield from shared.run_operator(cluster, tmp_path_factory, "pytorch-operator", shared.FAST_CONFIG)


@pytest.fixture
def custom(cluster: E2ECluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.api)


def pytorchjob(
    name: str,
    queue: str,
    workers: int,
    gpus: int,
    seconds: int,
    priority: int = 0,
    restart: str = "OnFailure",
) -> dict[str, Any]:
    """A PyTorchJob as a Kubeflow user writes it, plus the opt-in (queue label, schedulerName)."""
    return pytorchjob_body(name, queue, workers, gpus, {SIM_DURATION: f"{seconds}s"}, priority, restart)


JOB_NAME = "training.kubeflow.org/job-name"


def job_pods(gpuq: GpuqClient, ns: str, name: str) -> list[Any]:
    return workloads.job_pods(gpuq, ns, name, JOB_NAME)


def bound(gpuq: GpuqClient, ns: str, name: str) -> list[Any]:
    return workloads.bound(gpuq, ns, name, JOB_NAME)


def conditions(custom: k8s.CustomObjectsApi, ns: str, name: str) -> dict[str, str]:
    body = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return {c.get("type"): c.get("status") for c in (body.get("status") or {}).get("conditions") or []}


def events_of(gpuq: GpuqClient, ns: str, name: str) -> set[str]:
    return workloads.owner_events(gpuq, ns, name, "PyTorchJob")


def condition(custom: k8s.CustomObjectsApi, ns: str, name: str, type_: str) -> bool:
    return conditions(custom, ns, name).get(type_) == "True"


@pytest.fixture
def pytorchjobs(
    gpuq: GpuqClient, custom: k8s.CustomObjectsApi, ns: str
) -> Iterator[Callable[[dict[str, Any]], str]]:
    made: list[str] = []

    def create(body: dict[str, Any]) -> str:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        made.append(body["metadata"]["name"])
        return str(body["metadata"]["name"])

    yield create
    for name in made:
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    wait_for(lambda: not any(job_pods(gpuq, ns, n) for n in made), 60, "PyTorchJob pods gone")


def test_a_pytorchjob_is_bound_whole_preempted_by_suspension_and_succeeds_after(
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    pytorchjobs: Callable[[dict[str, Any]], str],
    custom: k8s.CustomObjectsApi,
) -> None:
    q = queue(24)
    job = pytorchjobs(pytorchjob("bert", q, 3, 8, seconds=15))
    wait_for(lambda: len(bound(gpuq, ns, job)) == 3, 60, "Master and both Workers bound")
    ranks = {p.metadata.labels["training.kubeflow.org/replica-type"] for p in bound(gpuq, ns, job)}
    assert ranks == {"master", "worker"}
    for p in bound(gpuq, ns, job):
        assert workloads.attempt_of(p) == "1"
    gpuq.submit(ns, "urgent", q, 2, 8, priority=100, annotations={SIM_DURATION: "6s"})
    # Suspended by gpuq, its pods deleted by the training-operator, the suspension lifted once they
    # are gone: kwok deletes pods at once, so all of it may take a fraction of a second, too short
    # for the training-operator to record a Suspended condition. gpuq's Event on it says it.
    wait_for(lambda: "Preempted" in events_of(gpuq, ns, job), 30, "the PyTorchJob preempted")
    phase(gpuq, operator, ns, "urgent", "Running", timeout=60)
    phase(gpuq, operator, ns, "urgent", "Succeeded", timeout=60)
    wait_for(lambda: len(bound(gpuq, ns, job)) == 3, 90, "the PyTorchJob bound again after the preemptor")
    for p in bound(gpuq, ns, job):
        assert workloads.attempt_of(p) == "2"
    wait_for(lambda: condition(custom, ns, job, "Succeeded"), 90, "the PyTorchJob Succeeded")
    final = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)
    assert meta.ANNOTATION_SUSPENDED_BY not in (final["metadata"].get("annotations") or {})


def test_a_queue_mixing_the_three_kinds_keeps_its_quota(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    pytorchjobs: Callable[[dict[str, Any]], str],
) -> None:
    batch = k8s.BatchV1Api(cluster.api)
    q = queue(24)
    gpuq.submit(ns, "tj", q, 1, 8, annotations={SIM_DURATION: "12s"})
    batch.create_namespaced_job(ns, workloads.indexed_job("ij", q, 1, 8, seconds=60))
    try:
        phase(gpuq, operator, ns, "tj", "Running")
        wait_for(lambda: len(workloads.bound(gpuq, ns, "ij")) == 1, 60, "the Indexed Job bound")
        job = pytorchjobs(pytorchjob("pt", q, 2, 8, seconds=5))
        wait_for(lambda: len(job_pods(gpuq, ns, job)) == 2, 30, "the training-operator created the pods")
        # 8 + 8 + 16 > 24: the PyTorchJob waits though nodes are free, until the TrainingJob ends.
        assert workloads.stays_unbound(gpuq, ns, job, label=JOB_NAME)
        phase(gpuq, operator, ns, "tj", "Succeeded", timeout=45)
        wait_for(
            lambda: len(bound(gpuq, ns, job)) == 2, 60, "the PyTorchJob bound once the TrainingJob ended"
        )
        assert len(workloads.bound(gpuq, ns, "ij")) == 1  # the Indexed Job ran on throughout
    finally:
        batch.delete_namespaced_job("ij", ns, propagation_policy="Background")


def test_a_pytorchjob_fails_over_to_healthy_nodes_as_attempt_two(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    pytorchjobs: Callable[[dict[str, Any]], str],
) -> None:
    if not cluster.can_fail_nodes:
        pytest.skip("backend cannot fail nodes")
    q = queue(64)
    job = pytorchjobs(pytorchjob("ft", q, 2, cluster.gpus_per_node, seconds=300))
    workloads.fails_over(cluster, gpuq, ns, job, "PyTorchJob", JOB_NAME)
