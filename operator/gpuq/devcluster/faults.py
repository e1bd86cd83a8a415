"""Node faults on a local cluster and the gangs they hit, as the failover benches measure them
(bench/failover.py: gpuq against stock Kubernetes; bench/incidents.py: gpuq against Kueue).

A fault stops a node's kwok heartbeat (`Cluster.fail_node`), which is what a dead machine looks like to
the control plane; the controller-manager marks it NotReady after its node-monitor grace period.
Times are on the API server's clock where it records them (the Ready condition's
lastTransitionTime, one-second resolution) and on this host's clock otherwise (same host: loopback).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuq.api import meta
from gpuq.devcluster.cluster import Cluster
from gpuq.devcluster.shape import Shape
from gpuq.devcluster.testing import wait_for

# The failover benches' cluster: 16 nodes x 8 GPUs in 4 racks and 2 blocks (128 GPUs).
SHAPE = Shape(racks=4, nodes_per_rack=4, gpus_per_node=8, blocks=2, zones=1)
UNREADY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
PROGRESS_EVERY = 30.0


@dataclass(frozen=True)
class Sample:
    """One node failure: seconds from NotReady, and from the fault, to the workload Running again."""

    from_not_ready: float
    from_fault: float


def load() -> str:
    """The 1/5/15-minute load averages, as `uptime` prints them: printed beside every figure, since
    the benches share a 2-core machine."""
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def not_ready_since(core: Any, node: str) -> float:
    """The Ready condition's lastTransitionTime (epoch seconds) when it is not True, else 0."""
    cond = next(c for c in core.read_node(node).status.conditions if c.type == "Ready")
    if cond.status == "True" or cond.last_transition_time is None:
        return 0.0
    return float(cond.last_transition_time.timestamp())


def fail(dev: Cluster, core: Any, victim: str, failures: dict[str, int]) -> tuple[float, float]:
    """Stop the victim's heartbeat; (fault time, NotReady time) on the local / API server clock."""
    failures[victim] = failures.get(victim, 0) + 1
    fault = time.time()
    dev.fail_node(victim)
    down: float = wait_for(lambda: not_ready_since(core, victim), 60, f"{victim} NotReady", interval=0.1)
    return fault, down


def pick_victim(nodes: set[str], failures: dict[str, int]) -> str:
    """The node of `nodes` that failed least often so far (so none is damped for flapping)."""
    return min(sorted(nodes), key=lambda n: failures.get(n, 0))


def tainted_at(core: Any, node: str) -> float:
    """timeAdded of the node's NoExecute NotReady taint (NaN: none)."""
    for t in core.read_node(node).spec.taints or []:
        if t.key in UNREADY_TAINTS and t.effect == "NoExecute" and t.time_added is not None:
            return float(t.time_added.timestamp())
    return float("nan")


def with_progress(
    check: Callable[[], bool],
    label: str,
    since: float,
    state: Callable[[], str],
    say: Callable[[str], None],
) -> Callable[[], bool]:
    """check, saying `label: <s> s since NotReady, <state>` every PROGRESS_EVERY seconds."""
    last = [time.time()]

    def wrapped() -> bool:
        now = time.time()
        if now - last[0] >= PROGRESS_EVERY:
            last[0] = now
            say(f"    {label}: {now - since:4.0f} s since NotReady, {state()}")
        return check()

    return wrapped


# -- gpuq's gangs ---------------------------------------------------------------------------------
def gang_running(gpuq: Any, namespace: str, job: str, attempt: int, replicas: int) -> bool:
    """Every worker of the TrainingJob's `attempt` Running (gpuq: a GpuqClient)."""
    pods = [p for p in gpuq.pods(namespace, job) if p.metadata.labels[meta.LABEL_ATTEMPT] == str(attempt)]
    return len(pods) == replicas and all(p.status.phase == "Running" for p in pods)


def gpuq_failure(
    dev: Cluster,
    gpuq: Any,
    namespace: str,
    job: str,
    queue: str,
    shape: tuple[int, int],
    failures: dict[str, int],
) -> Sample:
    """One node failure under a fresh TrainingJob of `shape` (workers, GPUs each): submitted, Running,
    one of its nodes failed, until every worker of attempt 2 runs; then the job is deleted and the node
    recovered."""
    replicas, gpus = shape
    gpuq.submit(namespace, job, queue, replicas, gpus)
    st = gpuq.wait_phase(namespace, job, "Running", 60)
    victim = pick_victim({p["node"] for p in st["placement"]}, failures)
    fault, down = fail(dev, gpuq.core, victim, failures)
    wait_for(
        lambda: gang_running(gpuq, namespace, job, 2, replicas), 120, f"{job} running again", interval=0.05
    )
    recovered = time.time()
    gpuq.delete_job(namespace, job)
    dev.recover_node(victim)
    wait_for(lambda: not gpuq.pods(namespace, job), 60, f"pods of {job} gone")
    return Sample(recovered - down, recovered - fault)


# -- batch/v1 Jobs (stock Kubernetes, Kueue) ------------------------------------------------------
def job_pods(core: Any, namespace: str, job: str) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={job}").items)


def live_running(pods: list[Any], avoid: str = "") -> list[Any]:
    """Running pods that are not terminating and not on `avoid` (the failed node)."""
    return [
        p
        for p in pods
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None and p.spec.node_name != avoid
    ]


def whole(pods: list[Any], replicas: int, avoid: str = "") -> list[Any] | None:
    """The Job's pods when all `replicas` run (not terminating, not on `avoid`), else None."""
    running = live_running(pods, avoid)
    return running if len(running) == replicas else None


def describe(pods: list[Any], replicas: int, avoid: str) -> str:
    terminating = sum(p.metadata.deletion_timestamp is not None for p in pods)
    running = len(live_running(pods, avoid))
    return f"{running}/{replicas} Running off the failed node, {terminating} terminating"


def kept(pods: list[Any], before: list[Any]) -> int:
    """How many of `before` (the pods running before the fault) still run among `pods`."""
    uids = {p.metadata.uid for p in before}
    return sum(p.metadata.uid in uids for p in live_running(pods))


def clean_up_job(dev: Cluster, core: Any, batch: Any, namespace: str, name: str, victim: str) -> None:
    """Delete the Job and its pods, and bring the victim back. Pods are force-deleted: kwok acts on pod
    events only, so a pod evicted from the dead node would stay Terminating on it forever."""
    batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
    selector = f"{JOB_NAME_LABEL}={name}"
    core.delete_collection_namespaced_pod(namespace, label_selector=selector, grace_period_seconds=0)
    dev.recover_node(victim)
    wait_for(lambda: not job_pods(core, namespace, name), 120, f"pods of Job {name} gone")


@dataclass(frozen=True)
class JobSample(Sample):
    """One node failure under a batch/v1 Indexed Job, with what happened after NotReady (API server
    timestamps)."""

    tolerations: dict[str, float | None]  # taint key -> tolerationSeconds on the pod that was lost
    tainted: float  # NotReady -> the node's NoExecute NotReady taint (its timeAdded)
    evicted: float  # NotReady -> the lost pod's deletion
    replaced: float  # NotReady -> its replacement created
    kept: int  # pods of the Job that survived the failure (not recreated)


def unready_toleration_spec(seconds: int) -> list[dict[str, Any]]:
    """Pod tolerations of the NotReady taints for `seconds` (the pod is evicted that long after)."""
    return [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        for key in UNREADY_TAINTS
    ]


def unready_tolerations(pod: Any) -> dict[str, float | None]:
    """tolerationSeconds of the pod's NoExecute tolerations for the NotReady taints (None: forever;
    a key missing: not tolerated)."""
    found: dict[str, float | None] = {}
    for t in pod.spec.tolerations or []:
        if t.key in UNREADY_TAINTS and t.effect in ("NoExecute", None):
            found[t.key] = None if t.toleration_seconds is None else float(t.toleration_seconds)
    return found


def job_failure(
    dev: Cluster,
    core: Any,
    batch: Any,
    namespace: str,
    body: dict[str, Any],
    failures: dict[str, int],
    say: Callable[[str], None],
    slack: float = 180.0,
) -> JobSample | None:
    """One node failure under a fresh Indexed Job (`body`; its parallelism is the gang): created,
    whole, one of its nodes failed, until as many pods run again off that node, none terminating.
    None when that takes longer than the lost pod's tolerations plus `slack` seconds. The Job is
    deleted and the node recovered after."""
    name, replicas = body["metadata"]["name"], int(body["spec"]["parallelism"])
    batch.create_namespaced_job(namespace, body)
    pods = wait_for(lambda: whole(job_pods(core, namespace, name), replicas), 120, f"Job {name} running")
    victim = pick_victim({p.spec.node_name for p in pods}, failures)
    lost = next(p for p in pods if p.spec.node_name == victim)
    tolerations = unready_tolerations(lost)
    fault, down = fail(dev, core, victim, failures)
    timeout = max((s or 0.0 for s in tolerations.values()), default=0.0) + slack
    check = with_progress(
        lambda: bool(whole(job_pods(core, namespace, name), replicas, victim)),
        name,
        down,
        lambda: describe(job_pods(core, namespace, name), replicas, victim),
        say,
    )
    sample = None
    try:
        wait_for(check, timeout, f"Job {name} whole again", interval=0.1)
        recovered = time.time()
        times = (fault, down, tainted_at(core, victim), recovered)
        sample = job_sample(job_pods(core, namespace, name), pods, lost, tolerations, times)
    except TimeoutError:
        state = describe(job_pods(core, namespace, name), replicas, victim)
        say(f"    {name}: not whole again {timeout:.0f} s after NotReady: {state}")
    clean_up_job(dev, core, batch, namespace, name, victim)
    return sample


def job_sample(
    pods: list[Any],
    before: list[Any],
    lost: Any,
    tolerations: dict[str, float | None],
    times: tuple[float, float, float, float],
) -> JobSample:
    """times: the fault, NotReady, the NoExecute taint and the Job whole again."""
    fault, down, tainted, recovered = times
    old = next((p for p in pods if p.metadata.uid == lost.metadata.uid), None)
    md = old.metadata if old is not None else None
    evicted = (
        md.deletion_timestamp.timestamp() - (md.deletion_grace_period_seconds or 0) - down
        if md is not None and md.deletion_timestamp is not None
        else float("nan")
    )
    index = lost.metadata.labels[JOB_INDEX_LABEL]
    new = next(p for p in live_running(pods) if p.metadata.labels[JOB_INDEX_LABEL] == index)
    replaced = new.metadata.creation_timestamp.timestamp() - down
    return JobSample(
        recovered - down,
        recovered - fault,
        tolerations,
        tainted - down,
        evicted,
        replaced,
        kept(pods, before),
    )


def job_line(sample: JobSample | None, replicas: int) -> str:
    """A sample as the benches print it (two lines)."""
    if sample is None:
        return "not recovered"
    after = (
        f"tainted +{sample.tainted:.0f} s, evicted +{sample.evicted:.0f} s, "
        f"replacement created +{sample.replaced:.0f} s"
    )
    return (
        f"{sample.from_not_ready:5.1f} s from NotReady, {sample.from_fault:5.1f} s from the fault ({load()})"
        f"\n      tolerations {fmt_tolerations(sample.tolerations)}; after NotReady: {after}; "
        f"{sample.kept} of {replicas} pods kept"
    )


def fmt_tolerations(tolerations: dict[str, float | None]) -> str:
    def one(key: str) -> str:
        if key not in tolerations:
            return "none"
        seconds = tolerations[key]
        return "forever" if seconds is None else f"{seconds:g} s"

    return ", ".join(f"{key.rsplit('/', 1)[-1]} {one(key)}" for key in UNREADY_TAINTS)
