"""The operator end to end on a real API server: admission, quota, gangs, topology, cohorts,
preemption, completion, failures and bad input. One operator process serves the whole module."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
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


def run_operator(
    cluster: E2ECluster,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    config: str,
    extra_args: tuple[str, ...] = (),
) -> Iterator[OperatorProcess]:
    """Body of a module-scoped operator fixture: `gpuq operator run` with `config`, stopped afterwards."""
    work = tmp_path_factory.mktemp(name)
    (work / "config.yaml").write_text(config)
    op = OperatorProcess(
        cluster.kubeconfig, work / "operator.log", work / "config.yaml", extra_args, log_level="DEBUG"
    ).start()
    yield op
    op.stop()
    print(f"operator log: {op.log_path}")


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster, gpuq: GpuqClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    yield from run_operator(cluster, tmp_path_factory, "operator", FAST_CONFIG)


@pytest.fixture
def ns(namespace: str, gpuq: GpuqClient, operator: OperatorProcess) -> Iterator[str]:
    """A namespace whose jobs (and so their pods) are gone after the test, freeing the GPUs."""
    yield namespace
    for job in gpuq.jobs(namespace):
        gpuq.delete_job(namespace, job["metadata"]["name"])
    # Finished pods hold no GPUs; delete them rather than wait for garbage collection.
    gpuq.core.delete_collection_namespaced_pod(namespace, field_selector="status.phase=Succeeded")
    gpuq.core.delete_collection_namespaced_pod(namespace, field_selector="status.phase=Failed")
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


def wait_events(gpuq: GpuqClient, ns: str, job: str, reasons: set[str], timeout: float = 30) -> None:
    """Events with these reasons on the job. An Event follows the status write it reports, so a test
    that has just seen the new status waits for it instead of racing it."""
    wait_for(
        lambda: reasons <= {e.reason for e in gpuq.events(ns, job)},
        timeout,
        f"Events {sorted(reasons)} on {job}",
    )


def checkpoint_asked(gpuq: GpuqClient, ns: str, job: str) -> list[bool]:
    """Whether each pod of the job carries the checkpoint-requested annotation."""
    return [
        meta.ANNOTATION_CHECKPOINT_REQUESTED in (p.metadata.annotations or {}) for p in gpuq.pods(ns, job)
    ]


def phase(
    gpuq: GpuqClient,
    op: OperatorProcess,
    ns: str,
    name: str,
    phases: str | tuple[str, ...],
    timeout: float = 60,
) -> dict[str, Any]:
    try:
        return gpuq.wait_phase(ns, name, phases, timeout)
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}; status={gpuq.status(ns, name)}\n--- operator log ---\n{op.log_tail()}"
        ) from None


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
    assert "Admitted" in reasons
    wait_for(lambda: gpuq.queue(q).get("status", {}).get("usedGPUs") == 16, 20, "queue usage published")


def running_nodes(gpuq: GpuqClient, ns: str, job: str) -> list[str]:
    return [p["node"] for p in sorted(gpuq.status(ns, job).get("placement") or [], key=lambda p: p["rank"])]


def labels_of(cluster: E2ECluster) -> dict[str, dict[str, str]]:
    return {n.metadata.name: n.metadata.labels for n in cluster.gpu_nodes()}


def test_quota_admission_order_and_waiting_position(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    cluster.require_simulated_pods("a job that finishes on time")
    q = queue(16, preemption={"withinQueue": "Never"})
    # Long enough to outlast the operator's position refresh interval (5 s) with room to spare.
    gpuq.submit(ns, "first", q, 2, 8, annotations={SIM_DURATION: "20s"})
    phase(gpuq, operator, ns, "first", "Running")
    gpuq.submit(ns, "low", q, 2, 8, priority=0)
    gpuq.submit(ns, "high", q, 2, 8, priority=10)
    gpuq.wait_status(ns, "low", lambda s: s.get("queuePosition") == 2, 30, "low at position 2")
    high = gpuq.wait_status(ns, "high", lambda s: s.get("queuePosition") == 1, 30, "high at position 1")
    assert high["phase"] == "Queued" and high["message"]
    admitted = gpuq.condition(ns, "high", "Admitted")
    assert admitted is not None and admitted["status"] == "False"
    assert not gpuq.pods(ns, "high") and not gpuq.pods(ns, "low")
    phase(gpuq, operator, ns, "first", "Succeeded", timeout=45)
    phase(gpuq, operator, ns, "high", "Running", timeout=30)
    low = gpuq.wait_status(ns, "low", lambda s: s.get("queuePosition") == 1, 30, "low moves up")
    assert low["phase"] == "Queued"


def test_gang_is_all_or_nothing_under_scarcity(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    """Two gangs that each need more than half the cluster: one runs whole, the other binds nothing."""
    q = queue(1000)
    workers = len(cluster.node_names) // 2 + 2
    gpuq.submit(ns, "gang-a", q, workers, cluster.gpus_per_node)
    gpuq.submit(ns, "gang-b", q, workers, cluster.gpus_per_node)
    wait_for(
        lambda: any(gpuq.status(ns, j).get("phase") == "Running" for j in ("gang-a", "gang-b")),
        60,
        "one gang running",
    )
    statuses = {j: gpuq.status(ns, j) for j in ("gang-a", "gang-b")}
    runner = next(j for j, s in statuses.items() if s["phase"] == "Running")
    waiter = next(j for j in statuses if j != runner)
    waiting = gpuq.wait_status(
        ns, waiter, lambda s: bool(s.get("message")), 20, "waiting gang explains itself"
    )
    assert waiting["phase"] == "Queued" and not waiting.get("placement")
    assert gpuq.pods(ns, waiter) == []  # not a single worker created, let alone bound
    assert len([p for p in gpuq.pods(ns, runner) if p.spec.node_name]) == workers


def test_topology_required_and_preferred(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    q = queue(1000)
    g = cluster.gpus_per_node
    per_rack = min(len(n) for n in cluster.nodes_by_rack.values())
    gpuq.submit(ns, "in-rack", q, per_rack, g, topology={"level": "rack", "mode": "Required"})
    gpuq.submit(ns, "in-block", q, per_rack * 2, g, topology={"level": "block", "mode": "Required"})
    gpuq.submit(ns, "too-wide", q, per_rack + 1, g, topology={"level": "rack", "mode": "Required"})
    gpuq.submit(ns, "preferred", q, per_rack + 1, g)
    labels = labels_of(cluster)
    for job, level_label in (("in-rack", "gpuq.dev/rack"), ("in-block", "gpuq.dev/block")):
        phase(gpuq, operator, ns, job, "Running")
        domains = {labels[n][level_label] for n in running_nodes(gpuq, ns, job)}
        assert len(domains) == 1, (job, domains)
    phase(gpuq, operator, ns, "preferred", "Running")
    assert len({labels[n]["gpuq.dev/block"] for n in running_nodes(gpuq, ns, "preferred")}) == 1
    wide = gpuq.wait_status(ns, "too-wide", lambda s: bool(s.get("message")), 20, "too-wide explains itself")
    assert wide["phase"] == "Queued" and gpuq.pods(ns, "too-wide") == []


def test_cohort_borrowing_and_reclaim(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    """A queue borrows its cohort peer's idle quota; when the lender needs it back and the cluster
    has no room left, the borrower is preempted (reclaimWithinCohort: Any)."""
    g = cluster.gpus_per_node
    cohort = f"c-{uuid.uuid4().hex[:6]}"
    qa = queue(4 * g, cohort=cohort)
    qb = queue(4 * g, cohort=cohort)
    no_wait = {"requestOnPreemption": False}
    gpuq.submit(ns, "borrower", qb, 6, g, checkpoint=no_wait)  # 6 nodes: 2 nodes' worth borrowed from qa
    phase(gpuq, operator, ns, "borrower", "Running")
    admitted = gpuq.condition(ns, "borrower", "Admitted")
    assert admitted is not None and f"borrowing {2 * g} GPUs" in admitted["message"]
    wait_for(
        lambda: gpuq.queue(qb).get("status", {}).get("borrowedGPUs") == 2 * g, 20, "qb reports borrowing"
    )
    # Fill the rest of the cluster but two nodes from an unrelated queue, so reclaiming is needed.
    filler = len(cluster.node_names) - 6 - 2
    gpuq.submit(ns, "filler", queue(filler * g), filler, g)
    phase(gpuq, operator, ns, "filler", "Running")
    gpuq.submit(ns, "owner", qa, 4, g)  # qa wants its nominal back: needs 4 nodes, 2 are free
    phase(gpuq, operator, ns, "owner", "Running", timeout=60)
    b = phase(gpuq, operator, ns, "borrower", ("Preempted", "Queued"))
    assert b["preemptions"] == 1 and b.get("restarts", 0) == 0
    wait_events(gpuq, ns, "borrower", {"Preempted"})
    assert gpuq.status(ns, "filler")["phase"] == "Running"  # never a victim: not in the cohort


def test_priority_preemption_with_checkpoint_request(
    gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    import json
    import time

    q = queue(16)
    gpuq.submit(
        ns, "low", q, 2, 8, priority=0, checkpoint={"requestOnPreemption": True, "gracePeriodSeconds": 120}
    )
    phase(gpuq, operator, ns, "low", "Running")
    gpuq.submit(ns, "high", q, 2, 8, priority=100)
    wait_for(lambda: all(checkpoint_asked(gpuq, ns, "low")), 30, "checkpoint requested on the victim's pods")
    requested = gpuq.condition(ns, "low", "PreemptionRequested")
    assert requested is not None and requested["status"] == "True" and "high" in requested["message"]
    report = {"step": 42, "path": "s3://ckpt/low/42", "time": time.time()}
    started = time.monotonic()
    gpuq.patch_job(ns, "low", {"metadata": {"annotations": {meta.ANNOTATION_CHECKPOINT: json.dumps(report)}}})
    low = phase(gpuq, operator, ns, "low", ("Preempted", "Queued"), timeout=60)
    assert time.monotonic() - started < 60  # evicted on the report, well inside the 120 s grace period
    phase(gpuq, operator, ns, "high", "Running", timeout=60)
    assert low["lastCheckpoint"]["step"] == 42 and low["preemptions"] == 1 and low.get("restarts", 0) == 0
    # Each Event follows the status write it reports: wait for them rather than race them (kind is slower).
    wait_events(gpuq, ns, "low", {"CheckpointRequested", "Preempted"})
    wait_events(gpuq, ns, "high", {"Preempting", "PreemptedVictim"})
    # When the preemptor is gone the victim resumes from its checkpoint.
    gpuq.delete_job(ns, "high")
    st = phase(gpuq, operator, ns, "low", "Running", timeout=60)
    assert st["attempt"] == 2
    pod = next(p for p in gpuq.pods(ns, "low") if p.metadata.labels[meta.LABEL_ATTEMPT] == "2")
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["GPUQ_RESUME_FROM"] == "s3://ckpt/low/42" and env["GPUQ_RESUME_STEP"] == "42"


def test_completion_releases_quota_and_cleans_up(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    cluster.require_simulated_pods("a job that finishes")
    q = queue(16)
    gpuq.submit(ns, "short", q, 2, 8, annotations={SIM_DURATION: "2s"})
    st = phase(gpuq, operator, ns, "short", "Succeeded", timeout=60)
    assert st["finishedAt"] and "succeeded" in st["message"]
    wait_for(lambda: gpuq.queue(q).get("status", {}).get("usedGPUs") == 0, 20, "quota released")
    gpuq.submit(ns, "next", q, 2, 8)  # the whole quota is available again
    phase(gpuq, operator, ns, "next", "Running")
    gpuq.delete_job(ns, "short")
    wait_for(lambda: not gpuq.pods(ns, "short"), 60, "pods of the deleted job gone")


def test_failed_worker_restarts_the_gang_then_fails(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    cluster.require_simulated_pods("a worker that fails on cue")
    from gpuq.devcluster import SIM_FAIL_AFTER

    q = queue(16)
    gpuq.submit(ns, "flaky", q, 2, 8, maxRestarts=1, annotations={SIM_FAIL_AFTER: "2s"})
    st = phase(gpuq, operator, ns, "flaky", "Failed", timeout=90)
    assert st["restarts"] == 1 and st["attempt"] == 2
    assert "no restarts left" in st["message"] and "failed" in st["message"]
    wait_events(gpuq, ns, "flaky", {"WorkerFailed", "Failed"})
    assert not [p for p in gpuq.pods(ns, "flaky") if p.status.phase in ("Pending", "Running")]
    wait_for(lambda: gpuq.queue(q).get("status", {}).get("usedGPUs") == 0, 20, "quota released")


def test_queue_edit_takes_effect(
    gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    q = queue(8)
    gpuq.submit(ns, "big", q, 2, 8)
    gpuq.wait_status(ns, "big", lambda s: s.get("queuePosition") == 1, 30, "big queued on quota")
    gpuq.patch_queue(q, {"nominalGPUs": 16})
    phase(gpuq, operator, ns, "big", "Running", timeout=30)


def test_deleted_queue_leaves_jobs_queued_with_a_condition(
    gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    q = queue(8)
    gpuq.submit(ns, "runs", q, 1, 8)
    phase(gpuq, operator, ns, "runs", "Running")
    gpuq.submit(ns, "waits", q, 1, 8)
    gpuq.wait_status(ns, "waits", lambda s: s.get("queuePosition") == 1, 30, "waits queued")
    gpuq.delete_queue(q)
    cond = wait_for(lambda: gpuq.condition(ns, "waits", "Blocked"), 30, "Blocked condition")
    assert cond["reason"] == "QueueNotFound" and q in cond["message"]
    assert gpuq.status(ns, "waits")["phase"] == "Queued"
    assert gpuq.status(ns, "runs")["phase"] == "Running"  # running work is not killed
    assert all(p.status.phase == "Running" for p in gpuq.pods(ns, "runs"))
    gpuq.create_queue(q, 16)
    phase(gpuq, operator, ns, "waits", "Running", timeout=30)
    assert gpuq.condition(ns, "waits", "Blocked") is None


def api_rejects(gpuq: GpuqClient, ns: str, body: dict[str, Any]) -> str:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        gpuq.create_job(ns, body)
    assert err.value.status == 422
    return str(err.value.body)


def warnings(gpuq: GpuqClient, ns: str, job: str) -> set[str]:
    return {e.reason for e in gpuq.events(ns, job) if e.type == "Warning"}


def test_invalid_objects_are_rejected_or_explained(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    q = queue(64)
    # The schema and its CEL rules refuse what they can see, naming the field.
    assert "replicas" in api_rejects(gpuq, ns, gpuq.job_body("zero", q, 0, 8))
    assert "mode Required needs a level" in api_rejects(
        gpuq, ns, gpuq.job_body("nolevel", q, 1, 8, topology={"mode": "Required"})
    )
    refusal = api_rejects(gpuq, ns, gpuq.job_body("9lives", q, 1, 8))
    assert "metadata.name: Invalid value" in refusal and "DNS-1035" in refusal and "<nil>" not in refusal
    no_template = gpuq.job_body("notemplate", q, 1, 8)
    del no_template["spec"]["workers"]["template"]
    assert "spec.workers.template: Required value" in api_rejects(gpuq, ns, no_template)
    no_containers = gpuq.job_body("nocontainers", q, 1, 8)
    no_containers["spec"]["workers"]["template"] = {"spec": {"containers": []}}
    assert "spec.workers.template.spec.containers" in api_rejects(gpuq, ns, no_containers)
    placed = gpuq.job_body("placed", q, 1, 8)
    placed["spec"]["workers"]["template"]["spec"]["nodeName"] = cluster.node_names[0]
    assert "spec.workers.template.spec.nodeName" in api_rejects(gpuq, ns, placed)
    # The operator explains what only it can see, and keeps running.
    locked = queue(64, namespaceSelector={"matchLabels": {"team": "nobody"}})
    gpuq.submit(ns, "orphan", "no-such-queue", 1, 8)
    gpuq.submit(ns, "outsider", locked, 1, 8)
    gpuq.submit(ns, "badlevel", q, 1, 8, topology={"level": "pod", "mode": "Required"})
    gpuq.submit(ns, "huge", q, len(cluster.node_names) + 1, cluster.gpus_per_node)
    # Quantities are Kubernetes' to check, but gpuq reads them first: the message names the field.
    bad_cpu = gpuq.job_body("lots", q, 1, 8)
    (container,) = bad_cpu["spec"]["workers"]["template"]["spec"]["containers"]
    container["resources"] = {"requests": {"cpu": "lots"}}
    gpuq.create_job(ns, bad_cpu)
    expected = {
        "orphan": ("QueueNotFound", "no-such-queue"),
        "outsider": ("NamespaceNotAllowed", "team=nobody"),
        "badlevel": ("UnknownTopologyLevel", "'pod'"),
        "huge": ("ExceedsCapacity", "GPUs"),
        "lots": (
            "InvalidPodTemplate",
            "spec.workers.template.spec.containers[0].resources.requests.cpu: not a Kubernetes quantity",
        ),
    }
    for job, (reason, fragment) in expected.items():
        cond = wait_for(lambda job=job: gpuq.condition(ns, job, "Blocked"), 30, f"{job} Blocked")
        assert cond["reason"] == reason and fragment in cond["message"], (job, cond)
        assert gpuq.status(ns, job)["phase"] == "Queued" and not gpuq.pods(ns, job)
        # The Event is written after the status, so it may land a moment later.
        wait_for(lambda j=job, r=reason: r in warnings(gpuq, ns, j), 10, f"{job}: a Warning Event {reason}")
    # Fixing the cause unblocks the job.
    gpuq.create_queue("no-such-queue", 8)
    try:
        phase(gpuq, operator, ns, "orphan", "Running", timeout=30)
    finally:
        gpuq.delete_queue("no-such-queue")
    # The gang is frozen once admitted.
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        gpuq.patch_job(ns, "orphan", {"spec": {"workers": {"replicas": 3}}})
    assert err.value.status == 422 and "immutable" in str(err.value.body)
    assert operator.alive


def queue_rejects(gpuq: GpuqClient, name: str, **spec: Any) -> str:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        gpuq.create_queue(name, 8, **spec)
    assert err.value.status == 422
    return str(err.value.body)


def queue_condition(gpuq: GpuqClient, name: str, type_: str) -> dict[str, Any] | None:
    conditions = (gpuq.queue(name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), None)


def queue_warnings(gpuq: GpuqClient, name: str) -> set[str]:
    return {e.reason for e in gpuq.events("default", name) if e.type == "Warning"}


def test_invalid_queues_are_rejected_or_explained(
    gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    # The schema refuses a selector no namespace could match and a model no node could have.
    body = queue_rejects(gpuq, "badsel", namespaceSelector={"matchLabels": {"bad key!": "x y"}})
    assert "spec.namespaceSelector.matchLabels" in body and "key 'bad key!' must be a label key" in body
    assert "x y" in queue_rejects(gpuq, "badval", namespaceSelector={"matchLabels": {"team": "x y"}})
    body = queue_rejects(gpuq, "badmodel", modelQuotas={"": 4})
    assert "spec.modelQuotas" in body and "key '' must be a GPU model" in body
    # A queue that can admit nothing is not Active, and says why.
    empty = queue(0)
    cond = wait_for(lambda: queue_condition(gpuq, empty, "Active"), 30, "Active on the empty queue")
    assert (cond["status"], cond["reason"]) == ("False", "CannotAdmit")
    assert "nominalGPUs is 0" in cond["message"]
    wait_for(lambda: "CannotAdmit" in queue_warnings(gpuq, empty), 10, "a Warning Event CannotAdmit")
    # A quota lowered under running jobs: the queue says it holds more than it may, nothing is evicted.
    q = queue(16)
    gpuq.submit(ns, "held", q, 2, 8)
    phase(gpuq, operator, ns, "held", "Running")
    assert queue_condition(gpuq, q, "OverQuota") is None
    gpuq.patch_queue(q, {"nominalGPUs": 8})
    cond = wait_for(lambda: queue_condition(gpuq, q, "OverQuota"), 30, "OverQuota after lowering the quota")
    assert cond["status"] == "True" and cond["reason"] == "NominalLowered"
    assert "holds 16 GPUs, above its nominalGPUs 8" in cond["message"]
    wait_for(lambda: "NominalLowered" in queue_warnings(gpuq, q), 10, "a Warning Event NominalLowered")
    assert gpuq.status(ns, "held")["phase"] == "Running"
    assert queue_condition(gpuq, q, "Active")["status"] == "True"  # type: ignore[index]
    gpuq.patch_queue(q, {"nominalGPUs": 16})
    wait_for(lambda: queue_condition(gpuq, q, "OverQuota") is None, 30, "OverQuota gone with the quota back")
    # In a cohort: a lender's quota lowered under what its peer borrows. The borrower says so.
    cohort = f"c-{q}"
    borrower, lender = queue(8, cohort=cohort), queue(16, cohort=cohort)
    gpuq.submit(ns, "borrows", borrower, 2, 8)
    phase(gpuq, operator, ns, "borrows", "Running")
    assert queue_condition(gpuq, borrower, "OverQuota") is None
    gpuq.patch_queue(lender, {"nominalGPUs": 0})
    cond = wait_for(lambda: queue_condition(gpuq, borrower, "OverQuota"), 30, "OverQuota on the borrower")
    assert cond["reason"] == "CohortQuotaLowered" and "lends 0 GPUs for the 8" in cond["message"], cond
    wait_for(lambda: "CohortQuotaLowered" in queue_warnings(gpuq, borrower), 10, "a CohortQuotaLowered Event")
    assert gpuq.status(ns, "borrows")["phase"] == "Running"  # nothing is evicted for it
    assert queue_condition(gpuq, lender, "OverQuota") is None  # the lender borrows nothing
    gpuq.patch_queue(lender, {"nominalGPUs": 16})
    wait_for(lambda: queue_condition(gpuq, borrower, "OverQuota") is None, 30, "OverQuota gone, lender back")
    assert operator.alive


def test_node_failure_restarts_the_gang_elsewhere_from_its_checkpoint(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Callable[..., str]
) -> None:
    import json
    import time

    if not cluster.can_fail_nodes:
        pytest.skip("backend cannot fail nodes")
    q = queue(64)
    report = json.dumps({"step": 7, "path": "s3://ckpt/ft/7", "time": time.time()})
    body = gpuq.job_body("ft", q, 2, cluster.gpus_per_node)
    body["metadata"]["annotations"] = {meta.ANNOTATION_CHECKPOINT: report}
    gpuq.create_job(ns, body)
    first = phase(gpuq, operator, ns, "ft", "Running")
    victim = first["placement"][0]["node"]
    cluster.fail_node(victim)
    try:
        st = gpuq.wait_status(
            ns, "ft", lambda s: s.get("phase") == "Running" and s.get("attempt") == 2, 60, "ft running again"
        )
        assert victim not in {p["node"] for p in st["placement"]}
        assert st["restarts"] == 1 and victim in st["failedNodes"]
        pods = [p for p in gpuq.pods(ns, "ft") if p.metadata.labels[meta.LABEL_ATTEMPT] == "2"]
        assert len(pods) == 2
        env = {e.name: e.value for e in pods[0].spec.containers[0].env}
        assert env["GPUQ_RESUME_FROM"] == "s3://ckpt/ft/7" and env["GPUQ_RESTART_COUNT"] == "1"
        assert "NodeFailed" in {e.reason for e in gpuq.events(ns, "ft")}
    finally:
        cluster.recover_node(victim)
