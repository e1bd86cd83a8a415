"""Pod constraints and heterogeneous GPUs end to end (issue 7): gpuq binds pods itself, so it must refuse
what kube-scheduler or a kubelet would refuse. Node labels, taints and cordons are patched per test and
restored afterwards; kube-scheduler runs next to gpuq on the same nodes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from gpuq.controller.testing import GpuqClient, OperatorProcess, install_crds
from gpuq.devcluster.shape import GPU_PRODUCT_LABEL, GPU_RESOURCE, HOSTNAME_LABEL
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

MERGE_PATCH = "application/merge-patch+json"
POOL = "gpuq.dev/e2e-pool"  # a label only this module sets (and removes again)


@pytest.fixture(scope="module")
def gpuq(cluster: E2ECluster) -> GpuqClient:
    install_crds(cluster.api)
    return GpuqClient(cluster.api)


@pytest.fixture(scope="module")
def operator(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(cluster.kubeconfig, log).start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def ns(namespace: str, gpuq: GpuqClient, operator: OperatorProcess) -> Iterator[str]:
    """A namespace whose jobs and plain pods are gone (their GPUs free) after the test."""
    yield namespace
    gpuq.clear_namespace(namespace)


@pytest.fixture
def queue(gpuq: GpuqClient) -> Iterator[str]:
    name = f"q-{uuid.uuid4().hex[:6]}"
    gpuq.create_queue(name, 1000)
    yield name
    gpuq.delete_queue(name)


@pytest.fixture
def patch_node(cluster: E2ECluster) -> Iterator[Callable[..., None]]:
    """patch_node(name, labels=..., taints=..., unschedulable=...): a merge patch undone after the test
    (a label set to None is removed; taints replace the node's list)."""
    undo: list[tuple[str, dict[str, Any]]] = []

    def patch(name: str, **spec: Any) -> None:
        node = cluster.core.read_node(name)
        labels = spec.pop("labels", None)
        body: dict[str, Any] = {"spec": spec} if spec else {}
        old: dict[str, Any] = {}
        if labels:
            body["metadata"] = {"labels": labels}
            old["metadata"] = {"labels": {k: (node.metadata.labels or {}).get(k) for k in labels}}
        if "taints" in spec:
            taints = [cluster.api.sanitize_for_serialization(t) for t in node.spec.taints or []]
            old.setdefault("spec", {})["taints"] = taints or None
        if "unschedulable" in spec:
            old.setdefault("spec", {})["unschedulable"] = node.spec.unschedulable
        undo.append((name, old))
        cluster.core.patch_node(name, body, _content_type=MERGE_PATCH)

    yield patch
    for name, old in reversed(undo):
        cluster.core.patch_node(name, old, _content_type=MERGE_PATCH)


def template(**pod_spec: Any) -> dict[str, Any]:
    container = {"name": "trainer", "image": E2ECluster.IMAGE}
    return {"spec": {"terminationGracePeriodSeconds": 0, "containers": [container], **pod_spec}}


def submit(
    gpuq: GpuqClient, ns: str, name: str, queue: str, replicas: int, gpus: int, **workers: Any
) -> None:
    gpuq.submit(ns, name, queue, replicas, gpus, workers=workers)


def running_on(gpuq: GpuqClient, op: OperatorProcess, ns: str, name: str, timeout: float = 60) -> list[str]:
    """Wait until the job runs; its nodes by rank, checked against where its pods really are."""
    try:
        st = gpuq.wait_phase(ns, name, "Running", timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; status={gpuq.status(ns, name)}\n{op.log_tail()}") from None
    nodes = [p["node"] for p in sorted(st["placement"], key=lambda p: p["rank"])]
    assert sorted(p.spec.node_name for p in gpuq.pods(ns, name)) == sorted(nodes)
    return nodes


def queued_because(gpuq: GpuqClient, ns: str, name: str, *words: str, timeout: float = 30) -> str:
    """Wait until the job is Queued with a message naming every word; it has no pods."""

    def check(s: dict[str, Any]) -> bool:
        return s.get("phase") == "Queued" and all(w in (s.get("message") or "") for w in words)

    try:
        message: str = gpuq.wait_status(ns, name, check, timeout, f"{name} queued because {words}")["message"]
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; status={gpuq.status(ns, name)}") from None
    assert not gpuq.pods(ns, name)
    return message


def test_node_selector_picks_the_labelled_nodes(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: str, patch_node: Any
) -> None:
    racks = list(cluster.nodes_by_rack.values())
    chosen = sorted([racks[0][0], racks[-1][1]])  # two nodes in different zones
    for name in chosen:
        patch_node(name, labels={POOL: "selected"})
    submit(
        gpuq, ns, "picky", queue, 2, cluster.gpus_per_node, template=template(nodeSelector={POOL: "selected"})
    )
    assert sorted(running_on(gpuq, operator, ns, "picky")) == chosen
    pod = gpuq.pods(ns, "picky")[0]
    assert pod.spec.node_selector == {POOL: "selected"}  # the kubelet would re-check it
    submit(gpuq, ns, "more", queue, 1, 1, template=template(nodeSelector={POOL: "selected"}))
    queued_because(gpuq, ns, "more", "nodeSelector", f"{POOL}: selected")


def test_only_tolerating_jobs_land_on_a_tainted_pool(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: str, patch_node: Any
) -> None:
    pool = list(cluster.nodes_by_rack.values())[1]
    taint = {"key": "gpuq.dev/e2e-dedicated", "value": "team-x", "effect": "NoSchedule"}
    for name in pool:
        patch_node(name, labels={POOL: "team-x"}, taints=[taint])
    toleration = {"key": taint["key"], "operator": "Equal", "value": "team-x", "effect": "NoSchedule"}
    g = cluster.gpus_per_node
    # Without the toleration the pool is off limits, even when the job asks for it by label.
    submit(gpuq, ns, "intruder", queue, 1, g, template=template(nodeSelector={POOL: "team-x"}))
    queued_because(
        gpuq, ns, "intruder", "does not tolerate: gpuq.dev/e2e-dedicated=team-x:NoSchedule (2 nodes)"
    )
    submit(gpuq, ns, "team-x", queue, len(pool), g, template=template(
        nodeSelector={POOL: "team-x"}, tolerations=[toleration]
    ))  # fmt: skip
    assert sorted(running_on(gpuq, operator, ns, "team-x")) == pool
    assert gpuq.core.read_namespaced_pod(gpuq.pods(ns, "team-x")[0].metadata.name, ns).spec.tolerations
    # A plain job filling many nodes still avoids the tainted pool.
    submit(gpuq, ns, "plain", queue, 6, g)
    assert not set(running_on(gpuq, operator, ns, "plain")) & set(pool)


def test_a_gpu_model_present_in_one_rack_only(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: str, patch_node: Any
) -> None:
    racks = list(cluster.nodes_by_rack.values())
    a100 = racks[2]
    for name in a100:
        patch_node(name, labels={GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"})
    h100 = cluster.core.read_node(racks[0][0]).metadata.labels[GPU_PRODUCT_LABEL]
    g = cluster.gpus_per_node
    submit(gpuq, ns, "on-a100", queue, len(a100), g, gpuModels=["NVIDIA-A100-SXM4-80GB"])
    assert sorted(running_on(gpuq, operator, ns, "on-a100")) == a100
    # The A100 rack is full: a second A100 job waits and says so; an any-of job takes the other model.
    submit(gpuq, ns, "more-a100", queue, 1, 1, gpuModels=["NVIDIA-A100-SXM4-80GB"])
    queued_because(gpuq, ns, "more-a100", "gpuModels [NVIDIA-A100-SXM4-80GB]")
    submit(gpuq, ns, "either", queue, 2, g, gpuModels=["NVIDIA-A100-SXM4-80GB", h100])
    either = running_on(gpuq, operator, ns, "either")
    assert not set(either) & set(a100)


def test_a_gpu_model_nobody_has_waits_with_a_clear_reason(
    gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: str
) -> None:
    submit(gpuq, ns, "b200", queue, 1, 8, gpuModels=["NVIDIA-B200"])
    message = queued_because(gpuq, ns, "b200", "no node matches gpuModels [NVIDIA-B200]")
    cond = gpuq.condition(ns, "b200", "Admitted")
    assert cond is not None and cond["status"] == "False", (cond, message)


def test_a_cordoned_node_receives_nothing(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: str, patch_node: Any
) -> None:
    names = cluster.node_names
    cordoned = names[3]
    patch_node(cordoned, unschedulable=True)
    g = cluster.gpus_per_node
    # Everything else is filled; the cordoned node is the only free one, and stays empty.
    submit(gpuq, ns, "fill", queue, len(names) - 1, g)
    assert cordoned not in running_on(gpuq, operator, ns, "fill", timeout=90)
    submit(gpuq, ns, "last", queue, 1, g)
    queued_because(gpuq, ns, "last", "0 free on eligible nodes")
    patch_node(cordoned, unschedulable=False)
    assert running_on(gpuq, operator, ns, "last") == [cordoned]


def default_scheduler_pod(core: k8s.CoreV1Api, ns: str, name: str, node: str, gpus: int) -> None:
    """A plain pod for kube-scheduler, pinned by nodeSelector and asking for GPUs."""
    resources = {"requests": {GPU_RESOURCE: str(gpus)}, "limits": {GPU_RESOURCE: str(gpus)}}
    container = {"name": "c", "image": E2ECluster.IMAGE, "resources": resources}
    spec = {
        "nodeSelector": {HOSTNAME_LABEL: node},
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    core.create_namespaced_pod(
        ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    )


def gpus_bound_to(core: k8s.CoreV1Api, node: str) -> int:
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    live = [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]
    return sum(
        int((c.resources.requests or {}).get(GPU_RESOURCE, 0)) for p in live for c in p.spec.containers
    )


def test_kube_scheduler_and_gpuq_never_overcommit_a_shared_node(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: str
) -> None:
    core, g = cluster.core, cluster.gpus_per_node
    node = cluster.node_names[5]
    on_node = template(nodeSelector={HOSTNAME_LABEL: node})
    # kube-scheduler first: gpuq counts its pod.
    default_scheduler_pod(core, ns, "web", node, g - 2)
    wait_for(
        lambda: core.read_namespaced_pod("web", ns).spec.node_name == node, 30, "web bound by kube-scheduler"
    )
    submit(gpuq, ns, "big", queue, 1, 4, template=on_node)
    queued_because(gpuq, ns, "big", "needs 1x4 GPUs")
    submit(gpuq, ns, "small", queue, 1, 2, template=on_node)
    assert running_on(gpuq, operator, ns, "small") == [node]
    assert gpus_bound_to(core, node) == g
    # gpuq next: kube-scheduler counts gpuq's bound pods and leaves its pod pending.
    default_scheduler_pod(core, ns, "late", node, 1)

    def refused() -> bool:
        conds = core.read_namespaced_pod("late", ns).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds)

    wait_for(refused, 30, "kube-scheduler refuses the late pod")
    # Freeing the foreign pod lets both schedulers use the room, still within the node.
    core.delete_namespaced_pod("web", ns, grace_period_seconds=0)
    assert running_on(gpuq, operator, ns, "big") == [node]
    wait_for(lambda: core.read_namespaced_pod("late", ns).spec.node_name == node, 30, "late bound")
    assert gpus_bound_to(core, node) == 2 + 4 + 1 <= g
