"""Kueue's manager installed as its users install it (gpuq.peers.kueue_stack), on a local cluster of
its own: what bench/e2e_throughput.py and bench/spike.py run as the Kueue user's path. An Indexed Job
with the queue-name label is suspended by Kueue's webhook, admitted from its ClusterQueue with TAS,
and its pods are created and bound by the Job controller and kube-scheduler; removed again, Kueue
no longer touches Jobs. Kueue is built from Go modules on first use (hack/kueue.sh)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpuq.controller.testing import DEFAULT_IMAGE, ensure_namespace
from gpuq.devcluster import Cluster, Shape, ensure_binaries
from gpuq.devcluster.shape import HOSTNAME_LABEL, RACK_LABEL
from gpuq.devcluster.testing import required_build, wait_for
from gpuq.peers import kueue_stack
from gpuq.peers.kueue_binaries import KueueBuild, ensure_kueue

pytestmark = pytest.mark.skipif(
    os.environ.get("GPUQ_E2E_CLUSTER", "local") != "local",
    reason="runs its own local control plane (GPUQ_E2E_CLUSTER=local)",
)
NS = "kueue-user"


@pytest.fixture(scope="module")
def kueue() -> KueueBuild:
    return required_build("kueue", lambda progress: ensure_kueue(progress, ("manager",)))


@pytest.fixture(scope="module")
def dev() -> Iterator[Cluster]:
    shape = Shape(racks=2, nodes_per_rack=2, gpus_per_node=8, blocks=1, zones=1)
    cluster = Cluster.up(f"kueue-stack-{os.getpid()}", shape, tie_to_process=True)
    try:
        yield cluster
    finally:
        cluster.down()


def test_a_kueue_users_job_is_admitted_and_bound_then_kueue_goes_away(
    kueue: KueueBuild, dev: Cluster, tmp_path: Path
) -> None:
    api = k8s_config.new_client_from_config(config_file=str(dev.kubeconfig))
    core, batch, custom = k8s.CoreV1Api(api), k8s.BatchV1Api(api), k8s.CustomObjectsApi(api)
    ensure_namespace(core, NS)
    stack = kueue_stack.KueueStack(kueue, ensure_binaries() / "kubectl", dev.kubeconfig, tmp_path)
    stack.up()
    try:
        for obj in kueue_stack.queue_objects(
            "q", NS, 32, (RACK_LABEL, HOSTNAME_LABEL), {"type": "kwok"}, False
        ):
            kueue_stack.create(custom, obj, NS)
        job = kueue_stack.indexed_job("gang", "q", 2, 8, DEFAULT_IMAGE, ("required", RACK_LABEL))
        created = batch.create_namespaced_job(NS, job)
        assert created.spec.suspend is True  # Kueue's webhook holds it until admitted

        def bound() -> list[k8s.V1Pod] | None:
            pods = [p for p in core.list_namespaced_pod(NS).items if p.spec.node_name]
            return pods if len(pods) == 2 else None

        pods = wait_for(bound, 120, "the Job's two pods bound")
        racks = {core.read_node(p.spec.node_name).metadata.labels[RACK_LABEL] for p in pods}
        assert len(racks) == 1  # Required at rack level: both in one rack (each node has 8 GPUs)
        workloads = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", NS, "workloads")[
            "items"
        ]
        assert len(workloads) == 1
        admitted = {c["type"]: c["status"] for c in workloads[0]["status"]["conditions"]}
        assert admitted.get("Admitted") == "True"
    finally:
        stack.down()
    plain = kueue_stack.indexed_job("plain", "q", 1, 1, DEFAULT_IMAGE)
    assert not batch.create_namespaced_job(NS, plain).spec.suspend  # no webhook answers any more
