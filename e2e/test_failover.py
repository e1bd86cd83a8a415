"""Failover end to end (local backend): what test_operator's single node failure does not cover.
The grace period really applies (the unreachable taint no longer fails a gang at once), a 4x8 gang
resumes from the checkpoint its worker reported through gpuq.sdk with only its own pod-bound token,
two nodes failing at once, a failure with no spare capacity, a flapping node, and a preemption whose
victim never reports. One operator serves the module (grace 5 s, damping after 3 flaps in 10 min)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

import test_operator as shared
from gpuq import sdk
from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, OperatorProcess
from gpuq.devcluster.components import SA_ISSUER
from gpuq.devcluster.shape import GPU_RESOURCE
from gpuq.devcluster.testing import E2ECluster, wait_for
from gpuq.sdk.rbac import worker_rbac

pytestmark = pytest.mark.e2e

# Fixtures and helpers shared with the operator suite (the operator fixture below is this module's own).
gpuq, ns, queue, phase = shared.gpuq, shared.ns, shared.queue, shared.phase

GRACE = 5.0
CONFIG = f"failover: {{notReadyGraceSeconds: {GRACE:g}, nodeFlapThreshold: 3, nodeFlapWindowSeconds: 600}}\n"


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    if not cluster.can_fail_nodes:
        pytest.skip("backend cannot fail nodes")
    yield from shared.run_operator(cluster, tmp_path_factory, "failover-operator", CONFIG)


@pytest.fixture
def failed(cluster: E2ECluster) -> Iterator[list[str]]:
    """Nodes a test fails; every one of them is recovered afterwards, whatever happens."""
    nodes: list[str] = []
    yield nodes
    for name in nodes:
        if not cluster.node_ready(name):
            cluster.recover_node(name)


def pinned_job(
    gpuq: GpuqClient, name: str, q: str, replicas: int, nodes: list[str], **spec: Any
) -> dict[str, Any]:
    """A job whose workers may only run on `nodes` (required node affinity): capacity is exactly known."""
    body = gpuq.job_body(name, q, replicas, 8, **spec)
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}
    body["spec"]["workers"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    return body


def not_ready_at(cluster: E2ECluster, node: str) -> float:
    """When the API recorded the node turning NotReady (the Ready condition's lastTransitionTime)."""
    cond = next(c for c in cluster.core.read_node(node).status.conditions if c.type == "Ready")
    assert cond.status != "True"
    return float(cond.last_transition_time.timestamp())


def steady_nodes(cluster: E2ECluster) -> list[str]:
    """GPU nodes that never turned NotReady since they joined (other tests fail nodes, and a node
    the operator saw flap takes no new work for a while). Not kind's own node: it has no GPUs."""
    out = []
    gpu_nodes = set(cluster.node_names)
    for nd in cluster.core.list_node().items:
        ready = next(c for c in nd.status.conditions if c.type == "Ready")
        if (
            nd.metadata.name in gpu_nodes
            and ready.status == "True"
            and (ready.last_transition_time - nd.metadata.creation_timestamp).total_seconds() < 60
        ):
            out.append(nd.metadata.name)
    assert len(out) >= 2, "no two nodes that never failed"
    return sorted(out)


def idle_steady_nodes(cluster: E2ECluster, count: int = 2, timeout: float = 90) -> list[str]:
    """`count` steady nodes without live GPU pods: a gang of the previous test may still be leaving
    its nodes (on kind, its pods take a while to terminate), and a test that pins jobs needs them
    empty. (kind's DaemonSet pods run on every node and take no GPU.)"""

    def takes_gpus(pod: Any) -> bool:
        return any(
            GPU_RESOURCE in ((c.resources.limits or {}) | (c.resources.requests or {}))
            for c in pod.spec.containers
        )

    def idle() -> list[str]:
        busy = {
            p.spec.node_name
            for p in cluster.core.list_pod_for_all_namespaces().items
            if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed") and takes_gpus(p)
        }
        return [n for n in steady_nodes(cluster) if n not in busy]

    wait_for(lambda: len(idle()) >= count, timeout, f"{count} steady nodes without pods")
    return idle()[-count:]


def condition_time(gpuq: GpuqClient, ns: str, job: str, type_: str) -> float:
    cond = gpuq.condition(ns, job, type_)
    assert cond is not None, f"{job} has no {type_} condition"
    return datetime.fromisoformat(cond["lastTransitionTime"]).timestamp()


def attempt_env(gpuq: GpuqClient, ns: str, job: str, attempt: int) -> list[dict[str, str]]:
    pods = [p for p in gpuq.pods(ns, job) if p.metadata.labels[meta.LABEL_ATTEMPT] == str(attempt)]
    return [{e.name: e.value for e in p.spec.containers[0].env} for p in pods]


def worker_context(
    cluster: E2ECluster, ns: str, pod: Any, tmp_path: Path, bound: bool = True
) -> sdk.PodContext:
    """What the SDK sees inside `pod`: its name and namespace, and a token of the pod's service account
    bound to that pod (as the kubelet mounts it), issued through the TokenRequest API."""
    ref = k8s.V1BoundObjectReference(
        api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
    )
    spec = k8s.V1TokenRequestSpec(
        audiences=[SA_ISSUER], bound_object_ref=ref if bound else None, expiration_seconds=600
    )
    token = cluster.core.create_namespaced_service_account_token(
        pod.spec.service_account_name or "default", ns, k8s.AuthenticationV1TokenRequest(spec=spec)
    ).status.token
    (tmp_path / "token").write_text(token)
    conf = cluster.api.configuration
    return sdk.PodContext(pod.metadata.name, ns, conf.host, tmp_path / "token", Path(conf.ssl_ca_cert))


def test_gang_resumes_from_the_checkpoint_its_worker_reported_after_the_grace_period(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    failed: list[str],
    tmp_path: Path,
) -> None:
    for obj in worker_rbac(ns, "default"):
        k8s_utils.create_from_dict(
            cluster.api, obj, namespace=ns if obj["kind"] in ("Role", "RoleBinding") else None
        )
    time.sleep(1.5)  # admission policies take effect asynchronously
    gpuq.submit(ns, "big", queue(64), 4, 8)
    first = phase(gpuq, operator, ns, "big", "Running")
    pods = sorted(gpuq.pods(ns, "big"), key=lambda p: int(p.metadata.labels[meta.LABEL_RANK]))
    rank0 = worker_context(cluster, ns, pods[0], tmp_path)
    sdk.report_checkpoint(300, "s3://ckpt/big/300", ctx=rank0)
    assert sdk.checkpoint_requested(rank0) is False
    # The pod's token reports only for its own pod; an unbound token not at all.
    other = sdk.PodContext(pods[1].metadata.name, ns, rank0.server, rank0.token_file, rank0.ca_file)
    with pytest.raises(sdk.SdkError, match="only on its own pod"):
        sdk.report_checkpoint(999, "s3://forged", ctx=other)
    unbound = worker_context(cluster, ns, pods[2], tmp_path / "..", bound=False)
    with pytest.raises(sdk.SdkError, match="only on its own pod"):
        sdk.report_checkpoint(999, "s3://forged", ctx=unbound)
    gpuq.wait_status(
        ns, "big", lambda s: (s.get("lastCheckpoint") or {}).get("step") == 300, 30, "report folded"
    )

    victim = first["placement"][0]["node"]
    failed.append(victim)
    cluster.fail_node(victim)
    down = not_ready_at(cluster, victim)
    st = gpuq.wait_status(
        ns, "big", lambda s: s.get("phase") == "Running" and s.get("attempt") == 2, 90, "big running again"
    )
    # The unreachable taint came with NotReady, yet the gang was failed only once the grace was over.
    assert condition_time(gpuq, ns, "big", "Admitted") >= down  # re-admitted after the failure
    restarted = [e for e in gpuq.events(ns, "big") if e.reason == "NodeFailed"]
    assert (
        restarted and min(e.last_timestamp or e.event_time for e in restarted).timestamp() >= down + GRACE - 1
    )
    assert victim not in {p["node"] for p in st["placement"]} and st["restarts"] == 1
    envs = attempt_env(gpuq, ns, "big", 2)
    assert len(envs) == 4
    assert {(e["GPUQ_RESUME_FROM"], e["GPUQ_RESUME_STEP"], e["GPUQ_RESTART_COUNT"]) for e in envs} == {
        ("s3://ckpt/big/300", "300", "1")
    }
    assert st["lostGPUSeconds"] > 0


def test_two_nodes_failing_at_once_restart_the_gang_once(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    failed: list[str],
) -> None:
    gpuq.submit(ns, "pair", queue(64), 4, 8)
    first = phase(gpuq, operator, ns, "pair", "Running")
    victims = sorted({p["node"] for p in first["placement"]})[:2]
    failed.extend(victims)
    for node in victims:
        cluster._fail(node)  # type: ignore[misc]  # both heartbeats stop together
    for node in victims:
        wait_for(lambda n=node: not cluster.node_ready(n), 30, f"{node} NotReady")
    st = gpuq.wait_status(
        ns, "pair", lambda s: s.get("phase") == "Running" and s.get("attempt") == 2, 90, "pair running again"
    )
    assert st["restarts"] == 1 and set(victims) <= set(st["failedNodes"])
    assert not set(victims) & {p["node"] for p in st["placement"]}


def test_no_spare_capacity_waits_then_resumes_when_the_node_recovers(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    failed: list[str],
) -> None:
    nodes = cluster.node_names[-2:]
    gpuq.create_job(ns, pinned_job(gpuq, "tight", queue(64), 2, nodes))
    phase(gpuq, operator, ns, "tight", "Running")
    failed.append(nodes[0])
    cluster.fail_node(nodes[0])
    st = gpuq.wait_status(
        ns,
        "tight",
        lambda s: s.get("phase") == "Recovering" and "avoiding" in (s.get("message") or ""),
        60,
        "tight waiting for capacity",
    )
    assert st["restarts"] == 1 and st["placement"] == []
    cluster.recover_node(nodes[0])
    st = gpuq.wait_status(
        ns,
        "tight",
        lambda s: s.get("phase") == "Running" and s.get("attempt") == 2,
        60,
        "tight running again",
    )
    assert sorted(p["node"] for p in st["placement"]) == sorted(nodes) and st["restarts"] == 1


def test_flapping_node_causes_no_restart_storm_and_is_damped(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    failed: list[str],
) -> None:
    flappy, steady = cluster.node_names[-4], cluster.node_names[-3]
    q = queue(64)
    gpuq.create_job(ns, pinned_job(gpuq, "steady", q, 2, [flappy, steady]))
    phase(gpuq, operator, ns, "steady", "Running")
    failed.append(flappy)
    for _ in range(3):  # each outage is shorter than the grace period: no failover
        cluster.fail_node(flappy)
        cluster.recover_node(flappy)
    time.sleep(GRACE)
    st = gpuq.status(ns, "steady")
    assert (st["phase"], st.get("restarts", 0), st["attempt"]) == ("Running", 0, 1)
    # Three NotReady transitions within the window: the node now receives no new work.
    gpuq.create_job(ns, pinned_job(gpuq, "newcomer", q, 1, [flappy]))
    gpuq.wait_status(
        ns, "newcomer", lambda s: s.get("phase") == "Queued" and s.get("message"), 30, "newcomer waits"
    )
    time.sleep(3)
    assert gpuq.status(ns, "newcomer")["phase"] == "Queued"


def test_preemption_gives_up_waiting_for_a_checkpoint_after_the_grace_period(
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
) -> None:
    q = queue(16)
    gpuq.submit(ns, "silent", q, 2, 8, checkpoint={"requestOnPreemption": True, "gracePeriodSeconds": 6})
    phase(gpuq, operator, ns, "silent", "Running")
    gpuq.submit(ns, "urgent", q, 2, 8, priority=100)
    wait_for(lambda: gpuq.condition(ns, "silent", "PreemptionRequested"), 30, "checkpoint requested")
    asked = condition_time(gpuq, ns, "silent", "PreemptionRequested")
    assert gpuq.status(ns, "silent")["phase"] == "Running"  # it waits for the report...
    st = phase(gpuq, operator, ns, "silent", ("Preempted", "Queued"), timeout=60)
    evicted = condition_time(gpuq, ns, "silent", "Admitted")
    assert evicted - asked >= 6 - 1  # ...for the whole grace period, then gives up
    assert st["preemptions"] == 1 and st.get("restarts", 0) == 0 and "lastCheckpoint" not in st
    phase(gpuq, operator, ns, "urgent", "Running")


def test_a_running_job_whose_queue_was_deleted_is_still_failed_over(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    failed: list[str],
) -> None:
    """Issue 33: it stayed Running on a dead node until its queue came back. A dead node is handled
    whatever happened to the queue: the gang is stopped, and waits Recovering with QueueNotFound."""
    nodes = cluster.node_names[-3:]
    q = queue(64)
    gpuq.create_job(ns, pinned_job(gpuq, "orphan", q, 2, nodes))
    first = phase(gpuq, operator, ns, "orphan", "Running")
    gpuq.delete_queue(q)
    victim = first["placement"][0]["node"]
    failed.append(victim)
    cluster.fail_node(victim)
    st = gpuq.wait_status(
        ns,
        "orphan",
        lambda s: s.get("phase") == "Recovering" and s.get("reason") == "QueueNotFound",
        60,
        "orphan stopped and blocked",
    )
    assert st["restarts"] == 1 and victim in st["failedNodes"] and st["placement"] == []
    blocked = gpuq.condition(ns, "orphan", "Blocked")
    assert blocked is not None and blocked["reason"] == "QueueNotFound"
    wait_for(lambda: not gpuq.pods(ns, "orphan"), 60, "the stopped gang's pods gone")
    gpuq.create_queue(q, 64)
    st = phase(gpuq, operator, ns, "orphan", "Running")
    assert st["attempt"] == 2 and victim not in {p["node"] for p in st["placement"]}


def test_a_preemption_that_buys_nothing_is_called_off(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
) -> None:
    """Issue 33: the preemptor was placed on a node that had just recovered, yet its victim was
    still evicted 60 s later and re-admitted on the same nodes. Here the room comes free by a job
    ending rather than a node recovering (the rule is the same): the preemption is called off,
    the request annotation goes, the victim runs on in its first attempt."""
    spare, home = idle_steady_nodes(cluster)
    q = queue(64)
    gpuq.create_job(ns, pinned_job(gpuq, "busy", q, 1, [spare], priority=20))
    phase(gpuq, operator, ns, "busy", "Running")
    slow = {"requestOnPreemption": True, "gracePeriodSeconds": 600}
    gpuq.create_job(ns, pinned_job(gpuq, "low", q, 1, [home, spare], checkpoint=slow))
    assert phase(gpuq, operator, ns, "low", "Running")["placement"][0]["node"] == home
    gpuq.create_job(ns, pinned_job(gpuq, "high", q, 1, [home, spare], priority=10))
    wait_for(lambda: all(shared.checkpoint_asked(gpuq, ns, "low")), 30, "checkpoint requested on low's pods")
    gpuq.delete_job(ns, "busy")
    high = phase(gpuq, operator, ns, "high", "Running")
    assert high["placement"][0]["node"] == spare
    low = gpuq.wait_status(ns, "low", lambda s: "preemption" not in s, 30, "the preemption called off")
    assert low["phase"] == "Running" and low["attempt"] == 1 and low.get("preemptions", 0) == 0
    assert gpuq.condition(ns, "low", "PreemptionRequested") is None
    assert "called off" in low["message"]
    wait_for(lambda: not any(shared.checkpoint_asked(gpuq, ns, "low")), 30, "the request annotation removed")
    shared.wait_events(gpuq, ns, "low", {"PreemptionCalledOff"})
    assert "Preempted" not in {e.reason for e in gpuq.events(ns, "low")}
