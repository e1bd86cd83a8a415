"""Jobs teams already have (docs/existing-workloads.md), on a real API server with the Job
controller: an Indexed Job that opts in (schedulerName gpuq, gpuq.dev/queue on the Job) is a gang
gpuq binds all or nothing, its attempt written with each binding and its Events on the Job; it
shares its queue's quota with TrainingJobs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

import test_operator as shared
from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, OperatorProcess, indexed_job_body
from gpuq.devcluster import SIM_DURATION
from gpuq.devcluster.testing import E2ECluster, wait_for
from test_ctl import plugin as ctl

pytestmark = pytest.mark.e2e

gpuq, ns, queue, phase = shared.gpuq, shared.ns, shared.queue, shared.phase


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster, gpuq: GpuqClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    cluster.require_simulated_pods("Indexed Jobs that finish on time")
    yield from shared.run_operator(cluster, tmp_path_factory, "gangs-operator", shared.FAST_CONFIG)


@pytest.fixture
def batch(cluster: E2ECluster) -> k8s.BatchV1Api:
    return k8s.BatchV1Api(cluster.api)


@pytest.fixture
def custom(cluster: E2ECluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.api)


def wait_for_gang(
    custom: k8s.CustomObjectsApi, ns: str, name: str, ok: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The status of the Gang object gpuq keeps for a gang of another owner, once `ok` holds."""
    seen: dict[str, Any] = {}

    def check() -> bool:
        try:
            body = custom.get_namespaced_custom_object(meta.GROUP, meta.VERSION, ns, "gangs", name)
        except k8s.ApiException:
            return False
        seen.update(body.get("status") or {})
        return ok(seen)

    wait_for(check, 30, f"Gang {ns}/{name}")
    return seen


def indexed_job(name: str, queue: str, workers: int, gpus: int, seconds: int) -> dict[str, Any]:
    """What a pipeline emits, plus the opt-in: the queue label and gpuq as the pods' scheduler."""
    return indexed_job_body(name, queue, workers, gpus, {SIM_DURATION: f"{seconds}s"})


JOB_NAME = "batch.kubernetes.io/job-name"


def job_pods(gpuq: GpuqClient, ns: str, name: str, label: str = JOB_NAME) -> list[Any]:
    """The live pods of the Job (or, by `label`, of another owner kind) `name`."""
    pods = gpuq.core.list_namespaced_pod(ns, label_selector=f"{label}={name}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def bound(gpuq: GpuqClient, ns: str, name: str, label: str = JOB_NAME) -> list[Any]:
    return [p for p in job_pods(gpuq, ns, name, label) if p.spec.node_name]


def owner_events(gpuq: GpuqClient, ns: str, name: str, kind: str) -> set[str]:
    """Reasons of the Events on the owner `kind`/`name` (gpuq posts a gang's there)."""
    events = gpuq.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return {e.reason for e in events if e.involved_object.kind == kind}


def job_events(gpuq: GpuqClient, ns: str, name: str) -> set[str]:
    return owner_events(gpuq, ns, name, "Job")


def attempt_of(pod: Any) -> str | None:
    """The attempt gpuq wrote with the pod's binding."""
    return (pod.metadata.annotations or {}).get(meta.LABEL_ATTEMPT)


def fails_over(
    cluster: E2ECluster, gpuq: GpuqClient, ns: str, name: str, kind: str, label: str = JOB_NAME
) -> None:
    """Fail a node under the bound 2-worker gang of the owner `kind`/`name`: the gang is bound again
    as attempt 2 on other nodes, and the owner gets NodeFailed."""
    wait_for(lambda: len(bound(gpuq, ns, name, label)) == 2, 60, f"the {kind}'s gang bound")
    victim = bound(gpuq, ns, name, label)[0].spec.node_name
    cluster.fail_node(victim)
    try:

        def attempt_two() -> bool:
            pods = bound(gpuq, ns, name, label)
            return len(pods) == 2 and all(attempt_of(p) == "2" for p in pods)

        wait_for(attempt_two, 90, "the gang bound again as attempt 2")
        assert victim not in {p.spec.node_name for p in bound(gpuq, ns, name, label)}
        wait_for(
            lambda: "NodeFailed" in owner_events(gpuq, ns, name, kind), 30, f"NodeFailed Event on the {kind}"
        )
    finally:
        cluster.recover_node(victim)


@pytest.fixture
def jobs(gpuq: GpuqClient, batch: k8s.BatchV1Api, ns: str) -> Iterator[Callable[[dict[str, Any]], str]]:
    made: list[str] = []

    def create(body: dict[str, Any]) -> str:
        batch.create_namespaced_job(ns, body)
        made.append(body["metadata"]["name"])
        return str(body["metadata"]["name"])

    yield create
    for name in made:
        batch.delete_namespaced_job(name, ns, propagation_policy="Background")
    wait_for(lambda: not any(job_pods(gpuq, ns, n) for n in made), 60, "Job pods gone")


def stays_unbound(gpuq: GpuqClient, ns: str, name: str, seconds: float = 4.0, label: str = JOB_NAME) -> bool:
    """No pod of the Job is bound for a while (several scheduling cycles of the fast config)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if bound(gpuq, ns, name, label):
            return False
        time.sleep(0.2)
    return True


def test_an_indexed_job_runs_as_a_gang_and_the_next_waits_for_its_quota(
    cluster: E2ECluster,
    custom: k8s.CustomObjectsApi,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    jobs: Callable[[dict[str, Any]], str],
    batch: k8s.BatchV1Api,
) -> None:
    q = queue(16)
    first = jobs(indexed_job("first", q, 2, 8, seconds=12))
    wait_for(lambda: len(bound(gpuq, ns, first)) == 2, 60, "both workers of the first Job bound")
    for p in bound(gpuq, ns, first):
        assert attempt_of(p) == "1"  # written by the binding
    wait_for(lambda: "Admitted" in job_events(gpuq, ns, first), 30, "Admitted Event on the Job")
    running = wait_for_gang(custom, ns, "job.first", lambda s: s.get("phase") == "Running")
    assert running["attempt"] == 1 and sorted(p["rank"] for p in running["placement"]) == [0, 1]
    second = jobs(indexed_job("second", q, 2, 8, seconds=2))
    wait_for(lambda: len(job_pods(gpuq, ns, second)) == 2, 30, "the Job controller created the pods")
    assert stays_unbound(gpuq, ns, second)  # 16 of 16 GPUs in use: not one worker bound
    waiting = wait_for_gang(custom, ns, "job.second", lambda s: s.get("reason") == "QuotaExceeded")
    assert waiting["phase"] == "Queued" and waiting.get("queuePosition") == 1
    # The CLI shows the gang with the same reason code, and explains it.
    listed = json.loads(ctl(cluster, "jobs", "-n", ns, "-o", "json").stdout)
    row = next(r for r in listed if r["name"] == "job.second")
    assert row["reason"] == "QuotaExceeded" and row["queue"] == q
    explained = ctl(cluster, "explain", f"{ns}/job.second", "-o", "json")
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["reason"] == "QuotaExceeded"
    wait_for(lambda: (batch.read_namespaced_job(first, ns).status.succeeded or 0) == 2, 60, "first done")
    wait_for(lambda: len(bound(gpuq, ns, second)) == 2, 60, "the second Job's gang bound after it")
    wait_for(lambda: (batch.read_namespaced_job(second, ns).status.succeeded or 0) == 2, 60, "second done")


def test_a_queue_mixing_training_jobs_and_indexed_jobs_keeps_its_quota(
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    jobs: Callable[[dict[str, Any]], str],
) -> None:
    q = queue(16)
    gpuq.submit(ns, "tj", q, 1, 8, annotations={SIM_DURATION: "10s"})
    phase(gpuq, operator, ns, "tj", "Running")
    job = jobs(indexed_job("indexed", q, 2, 8, seconds=2))
    wait_for(lambda: len(job_pods(gpuq, ns, job)) == 2, 30, "the Job controller created the pods")
    assert stays_unbound(gpuq, ns, job)  # 8 + 16 > 16: the gang waits, though nodes are free
    phase(gpuq, operator, ns, "tj", "Succeeded", timeout=45)
    wait_for(lambda: len(bound(gpuq, ns, job)) == 2, 60, "the Indexed Job bound once the TrainingJob ended")


def test_a_training_job_preempts_an_indexed_job_by_suspending_it_and_the_job_resumes_after(
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    jobs: Callable[[dict[str, Any]], str],
    batch: k8s.BatchV1Api,
) -> None:
    q = queue(16)
    low = indexed_job("low", q, 2, 8, seconds=15)
    low["metadata"]["labels"][meta.LABEL_PRIORITY] = "0"
    job = jobs(low)
    wait_for(lambda: len(bound(gpuq, ns, job)) == 2, 60, "the Indexed Job's gang bound")
    gpuq.submit(ns, "high", q, 2, 8, priority=100, annotations={SIM_DURATION: "8s"})
    # Suspended by gpuq, its pods deleted by the Job controller, the suspension lifted once they are
    # gone: with kwok all of it can take a fraction of a second, too short for a Suspended
    # condition to be sure to show. That it was a suspension shows at the end: no failure counted.
    wait_for(lambda: "Preempted" in job_events(gpuq, ns, job), 30, "Preempted Event on the Job")
    phase(gpuq, operator, ns, "high", "Running", timeout=60)
    # Once its workers are gone gpuq lifts the suspension; the Job controller makes new pods, which
    # wait for the quota the TrainingJob holds and then run as attempt 2.
    phase(gpuq, operator, ns, "high", "Succeeded", timeout=60)
    wait_for(lambda: (batch.read_namespaced_job(job, ns).status.succeeded or 0) == 2, 90, "the Job done")
    done = batch.read_namespaced_job(job, ns)
    assert not done.spec.suspend and meta.ANNOTATION_SUSPENDED_BY not in (done.metadata.annotations or {})
    assert (done.status.failed or 0) == 0  # an eviction by suspension spends none of its backoffLimit


def test_an_indexed_job_fails_over_to_healthy_nodes_as_attempt_two(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    jobs: Callable[[dict[str, Any]], str],
    batch: k8s.BatchV1Api,
) -> None:
    if not cluster.can_fail_nodes:
        pytest.skip("backend cannot fail nodes")
    q = queue(64)
    job = jobs(indexed_job("ft", q, 2, cluster.gpus_per_node, seconds=300))
    fails_over(cluster, gpuq, ns, job, "Job")
    # Restarted by suspension: the pod on the healthy node was not a failure to the Job (only the
    # lost one may be), so no pod-failure back-off held the new pods.
    assert (batch.read_namespaced_job(job, ns).status.failed or 0) <= 1


def test_what_gpuq_cannot_run_gets_a_reason_and_an_event_and_no_pod_is_bound(
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    jobs: Callable[[dict[str, Any]], str],
    custom: k8s.CustomObjectsApi,
) -> None:
    q = queue(64)
    plain = indexed_job("plain", q, 2, 8, seconds=5)
    del plain["spec"]["completionMode"]  # NonIndexed: no gang to run all or nothing
    unsupported = jobs(plain)
    orphan = jobs(indexed_job("orphan", "no-such-queue", 1, 8, seconds=5))
    stray = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stray"},
        "spec": {"schedulerName": "gpuq", "containers": [{"name": "c", "image": "x"}]},
    }
    gpuq.core.create_namespaced_pod(ns, stray)
    try:
        blocked = wait_for_gang(custom, ns, "job.plain", lambda s: s.get("reason") == "UnsupportedGang")
        assert "Indexed" in blocked["message"]
        wait_for(lambda: "UnsupportedGang" in job_events(gpuq, ns, unsupported), 30, "UnsupportedGang Event")
        wait_for_gang(custom, ns, "job.orphan", lambda s: s.get("reason") == "QueueNotFound")
        wait_for(
            lambda: "QueueNotFound" in job_events(gpuq, ns, orphan), 30, "QueueNotFound Event on the Job"
        )

        def stray_told() -> bool:
            events = gpuq.core.list_namespaced_event(ns, field_selector="involvedObject.name=stray").items
            return any(e.reason == "NoOwner" and e.involved_object.kind == "Pod" for e in events)

        wait_for(stray_told, 30, "NoOwner Event on the pod without an owner")
        assert not bound(gpuq, ns, unsupported) and not bound(gpuq, ns, orphan)
        assert gpuq.core.read_namespaced_pod("stray", ns).spec.node_name is None
    finally:
        gpuq.core.delete_namespaced_pod("stray", ns, grace_period_seconds=0)


def test_gpuq_stop_and_resume_suspend_and_resume_an_indexed_job(
    cluster: E2ECluster,
    gpuq: GpuqClient,
    operator: OperatorProcess,
    ns: str,
    queue: Callable[..., str],
    jobs: Callable[[dict[str, Any]], str],
    batch: k8s.BatchV1Api,
    custom: k8s.CustomObjectsApi,
) -> None:
    q = queue(16)
    job = jobs(indexed_job("paused", q, 2, 8, seconds=300))
    wait_for(lambda: len(bound(gpuq, ns, job)) == 2, 60, "the Indexed Job's gang bound")
    out = ctl(cluster, "stop", f"{ns}/job.paused")
    assert out.returncode == 0 and "Job" in out.stdout, out.stderr
    body = batch.read_namespaced_job(job, ns)
    assert body.spec.suspend and meta.ANNOTATION_SUSPENDED_BY not in (body.metadata.annotations or {})
    wait_for_gang(custom, ns, "job.paused", lambda s: s.get("phase") == "Suspended")
    assert stays_unbound(gpuq, ns, job)  # the user's suspension: gpuq does not lift it
    out = ctl(cluster, "resume", f"{ns}/job.paused")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: len(bound(gpuq, ns, job)) == 2, 60, "the gang bound again after resume")
    bad = ctl(cluster, "stop", f"{ns}/jobset.x")
    assert bad.returncode == 2 and "job.NAME or pytorchjob.NAME" in bad.stderr
