"""The operator in the cluster, as users install it (`kubectl apply -k manifests/`): its image, its
Deployment's two replicas and its ServiceAccount's RBAC. Only on the kind backend
(GPUQ_E2E_CLUSTER=kind, `make e2e-kind`), where the image is loaded into the cluster."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

import test_operator_install as install
from gpuq.api.meta import LABEL_RANK
from gpuq.controller.testing import GpuqClient
from gpuq.devcluster.shape import FakeNode, node_manifest
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
OVERLAY = Path(__file__).parent / "kind" / "incluster"
NS = "gpuq-system"
LEASE = "gpuq-operator"


def kubectl(cluster: E2ECluster, *args: str) -> str:
    out = subprocess.run(
        [install.kubectl(cluster), "--kubeconfig", str(cluster.kubeconfig), *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


def operator_pods(cluster: E2ECluster, terminating: bool = False) -> list[Any]:
    pods = cluster.core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=operator").items
    return [p for p in pods if terminating or p.metadata.deletion_timestamp is None]


@pytest.fixture
def sample_rack(cluster: E2ECluster) -> Iterator[None]:
    """The sample's 4x8 gang asks for one rack; the e2e fleet's racks hold 2 nodes. One more rack of
    4 simulated nodes for the test's duration (kwok runs it like the others)."""
    assert cluster.shape is not None
    names = [f"gpu-samples-n{i}" for i in range(4)]
    for i, name in enumerate(names):
        node = FakeNode(name, "zone-0", "block-0", "rack-samples", index=200 + i)
        cluster.core.create_node(node_manifest(node, cluster.shape))
    wait_for(lambda: all(cluster.node_ready(n) for n in names), 60, "the samples' rack Ready")
    yield
    for name in names:
        cluster.core.delete_node(name)


def leader(cluster: E2ECluster) -> str | None:
    lease = k8s.CoordinationV1Api(cluster.api).read_namespaced_lease(LEASE, NS)
    holder = lease.spec.holder_identity or ""
    names = {p.metadata.name for p in operator_pods(cluster) if p.status.phase == "Running"}
    return next((n for n in names if holder.startswith(n + "_")), None)


def phase_of(gpuq: GpuqClient, namespace: str, name: str) -> str | None:
    phase: str | None = gpuq.job(namespace, name).get("status", {}).get("phase")
    return phase


@pytest.fixture(scope="module")
def installed(cluster: E2ECluster) -> Iterator[None]:
    if cluster.backend != "kind":
        pytest.skip("the operator image runs in the cluster on the kind backend only (make e2e-kind)")
    kubectl(cluster, "apply", "-k", str(OVERLAY))
    apps = k8s.AppsV1Api(cluster.api)

    def available() -> bool:
        d = apps.read_namespaced_deployment("gpuq-operator", NS)
        return (d.status.available_replicas or 0) == 2

    wait_for(available, 180, "Deployment gpuq-operator 2/2 available")
    yield
    # Later modules run their own operators against this cluster: take the Deployment away, and
    # wait until its pods have really stopped (not just been marked for deletion).
    apps.delete_namespaced_deployment("gpuq-operator", NS)
    wait_for(lambda: not operator_pods(cluster, terminating=True), 120, "operator pods gone")


@pytest.fixture(scope="module")
def gpuq(cluster: E2ECluster) -> GpuqClient:
    return GpuqClient(cluster.api)


def test_deployment_runs_two_replicas_and_one_leads(cluster: E2ECluster, installed: None) -> None:
    pods = operator_pods(cluster)
    assert len(pods) == 2 and all(p.status.phase == "Running" for p in pods)
    for pod in pods:
        spec = pod.spec.containers[0]
        assert spec.image == "gpuq:0.1.0"
        assert pod.spec.service_account_name == "gpuq-operator"
        assert spec.security_context.read_only_root_filesystem is True
    wait_for(lambda: leader(cluster) is not None, 60, "a replica holds the Lease")


def test_metrics_service_serves_gpuq_metrics(cluster: E2ECluster, installed: None) -> None:
    path = f"/api/v1/namespaces/{NS}/services/gpuq-operator-metrics:metrics/proxy/metrics"

    def scrape() -> str | None:  # through the API server's service proxy, once endpoints exist
        try:
            return kubectl(cluster, "get", "--raw", path)
        except subprocess.CalledProcessError:
            return None

    text = wait_for(scrape, 60, "the metrics Service answering")
    assert "gpuq_leader " in text and "gpuq_cycle_seconds_bucket" in text


def test_samples_run(cluster: E2ECluster, installed: None, gpuq: GpuqClient, sample_rack: None) -> None:
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "samples"))
    try:
        for name in ("llama-finetune", "sweep-7"):
            wait_for(
                lambda n=name: phase_of(gpuq, "team-a", n) == "Running",
                120,
                f"sample job team-a/{name} Running",
            )
        assert len(gpuq.pods("team-a", "llama-finetune")) == 4
    finally:
        kubectl(cluster, "delete", "-k", str(ROOT / "manifests" / "samples"), "--wait=false")


def test_leader_pod_deleted_mid_admission_gang_ends_whole(
    cluster: E2ECluster, installed: None, gpuq: GpuqClient, namespace: str
) -> None:
    gpuq.create_queue(f"{namespace}-q", 64)
    try:
        wait_for(lambda: leader(cluster) is not None, 60, "a leader")
        old = leader(cluster)
        gpuq.submit(namespace, "gang", f"{namespace}-q", 4, 8)
        # Delete the leader as soon as it has decided (status written), before all pods exist.
        wait_for(
            lambda: phase_of(gpuq, namespace, "gang") in ("Admitted", "Running"),
            60,
            "gang admitted",
            0.02,
        )
        cluster.core.delete_namespaced_pod(old, NS, grace_period_seconds=0)
        wait_for(lambda: leader(cluster) not in (None, old), 90, "a new leader")
        wait_for(
            lambda: gpuq.job(namespace, "gang").get("status", {}).get("phase") == "Running", 90, "Running"
        )
        pods = [p for p in gpuq.pods(namespace, "gang") if p.metadata.deletion_timestamp is None]
        ranks = Counter(p.metadata.labels.get(LABEL_RANK) for p in pods)
        assert len(pods) == 4 and set(ranks.values()) == {1}, ranks
        assert all(p.spec.node_name for p in pods)
        per_node = Counter(p.spec.node_name for p in pods)
        assert max(per_node.values()) == 1  # 8 GPUs each on 8-GPU nodes: never two on one node
        wait_for(lambda: len(operator_pods(cluster)) == 2, 120, "the Deployment back to 2 pods")
    finally:
        gpuq.delete_queue(f"{namespace}-q")
