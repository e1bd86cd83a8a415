"""Failover latency on the local cluster, gpuq against stock Kubernetes, measured in the same run.

gpuq: time from a node turning NotReady (the Ready condition's lastTransitionTime, as the API server
records it) to every pod of the job's gang Running again on other nodes, over --failures node failures
(a fresh 4x8 gang each time, so every failure is a first restart without back-off; the victim nodes
rotate so none is damped for flapping).

Stock Kubernetes (the operator stopped first): an Indexed batch/v1 Job of 4 pods x 8 GPUs placed by
kube-scheduler, over --stock-failures node failures each (a fresh Job each time), in two variants:
  default  the tolerations the DefaultTolerationSeconds admission plugin adds (read back from the pods)
  tuned    not-ready/unreachable tolerations of 10 s in the pod template
Measured from NotReady to 4 pods of the Job Running that are not terminating and not on the failed
node: the taint eviction controller deletes the lost pod once its toleration expires, it stays
Terminating (no kubelet confirms it), and the Job controller creates a replacement for its index.
Each stock sample also shows when, after NotReady, the node got its NoExecute taint, the lost pod was
evicted and its replacement created (API server timestamps), and how many of the Job's pods survived.

Both are also measured from the fault itself (the moment the node's heartbeat is stopped). Nodes fail as
for gpuq: the kwok heartbeat stops (Cluster.fail_node), the controller-manager marks the node NotReady
after its node-monitor grace period. lastTransitionTime has one-second resolution, so each sample
carries up to 1 s of quantisation.

Reproduce: .venv/bin/python bench/failover.py [--failures 20] [--grace 10] [--stock-failures 2]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq import logs
from gpuq.api import meta
from gpuq.controller.testing import DEFAULT_IMAGE, GpuqClient, OperatorProcess, install_crds
from gpuq.devcluster import Cluster, Shape
from gpuq.devcluster.components import Timing
from gpuq.devcluster.shape import GPU_RESOURCE
from gpuq.devcluster.testing import wait_for
from gpuq.sim.metrics import percentile

SHAPE = Shape(racks=4, nodes_per_rack=4, gpus_per_node=8, blocks=2, zones=1)
NS = "bench-failover"
REPLICAS, GPUS = 4, 8
UNREADY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
TUNED_TOLERATION = 10
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
PROGRESS_EVERY = 30.0


@dataclass(frozen=True)
class Sample:
    """One node failure: seconds from NotReady, and from the fault, to the workload Running again."""

    from_not_ready: float
    from_fault: float


@dataclass(frozen=True)
class StockSample(Sample):
    tolerations: dict[str, float | None]  # taint key -> tolerationSeconds on the pod that was lost
    tainted: float  # NotReady -> the node's NoExecute NotReady taint (its timeAdded)
    evicted: float  # NotReady -> the lost pod's deletion (API server timestamps)
    replaced: float  # NotReady -> its replacement created
    kept: int  # pods of the Job that survived the failure (not recreated)


def not_ready_since(core: Any, node: str) -> float:
    cond = next(c for c in core.read_node(node).status.conditions if c.type == "Ready")
    if cond.status == "True" or cond.last_transition_time is None:
        return 0.0
    return float(cond.last_transition_time.timestamp())


def fail(dev: Cluster, core: Any, victim: str, failures: dict[str, int]) -> tuple[float, float]:
    """Stop the victim's heartbeat; (fault time, NotReady time) on the local / API server clock."""
    failures[victim] = failures.get(victim, 0) + 1
    fault = time.time()
    dev.fail_node(victim)
    down = wait_for(lambda: not_ready_since(core, victim), 60, f"{victim} NotReady", interval=0.1)
    return fault, down


def pick_victim(nodes: set[str], failures: dict[str, int]) -> str:
    return min(sorted(nodes), key=lambda n: failures.get(n, 0))


def with_progress(
    check: Callable[[], bool], label: str, since: float, state: Callable[[], str]
) -> Callable[[], bool]:
    """check, printing `label: <s> s since NotReady, <state>` every PROGRESS_EVERY seconds."""
    last = [time.time()]

    def wrapped() -> bool:
        now = time.time()
        if now - last[0] >= PROGRESS_EVERY:
            last[0] = now
            print(f"    {label}: {now - since:4.0f} s since NotReady, {state()}", flush=True)
        return check()

    return wrapped


# -- gpuq -----------------------------------------------------------------------------------------
def gang_running(gpuq: GpuqClient, job: str, attempt: int, replicas: int) -> bool:
    pods = [p for p in gpuq.pods(NS, job) if p.metadata.labels[meta.LABEL_ATTEMPT] == str(attempt)]
    return len(pods) == replicas and all(p.status.phase == "Running" for p in pods)


def one_failure(dev: Cluster, gpuq: GpuqClient, queue: str, i: int, failures: dict[str, int]) -> Sample:
    job = f"b{i}"
    gpuq.submit(NS, job, queue, REPLICAS, GPUS)
    st = gpuq.wait_phase(NS, job, "Running", 60)
    victim = pick_victim({p["node"] for p in st["placement"]}, failures)
    fault, down = fail(dev, gpuq.core, victim, failures)
    wait_for(lambda: gang_running(gpuq, job, 2, REPLICAS), 120, f"{job} running again", interval=0.05)
    recovered = time.time()
    gpuq.delete_job(NS, job)
    dev.recover_node(victim)
    wait_for(lambda: not gpuq.pods(NS, job), 60, f"pods of {job} gone")
    return Sample(recovered - down, recovered - fault)


def run_gpuq(
    dev: Cluster, gpuq: GpuqClient, args: argparse.Namespace, failures: dict[str, int]
) -> list[Sample]:
    work = Path(tempfile.mkdtemp(prefix="gpuq-bench-failover-"))
    (work / "config.yaml").write_text(f"failover: {{notReadyGraceSeconds: {args.grace:g}}}\n")
    op = OperatorProcess(dev.kubeconfig, work / "operator.log", work / "config.yaml").start()
    try:
        queue = "bench"
        gpuq.create_queue(queue, 1000)
        samples = []
        for i in range(args.failures):
            samples.append(one_failure(dev, gpuq, queue, i, failures))
            print(f"  gpuq failure {i + 1:2d}: {samples[-1].from_not_ready:5.1f} s", flush=True)
        return samples
    finally:
        op.stop()


# -- stock Kubernetes -----------------------------------------------------------------------------
def stock_job(name: str, toleration: int | None) -> dict[str, Any]:
    """An Indexed Job shaped like gpuq's 4x8 gang; toleration None leaves the tolerations to the API
    server's defaults."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "trainer", "image": DEFAULT_IMAGE, "resources": {"limits": {GPU_RESOURCE: str(GPUS)}}}
        ],
    }
    if toleration is not None:
        pod["tolerations"] = [
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": toleration}
            for key in UNREADY_TAINTS
        ]
    spec = {"completions": REPLICAS, "parallelism": REPLICAS, "completionMode": "Indexed"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {**spec, "template": {"spec": pod}},
    }


def job_pods(core: Any, job: str) -> list[Any]:
    return list(core.list_namespaced_pod(NS, label_selector=f"{JOB_NAME_LABEL}={job}").items)


def live_running(pods: list[Any], avoid: str = "") -> list[Any]:
    """Running pods that are not terminating and not on `avoid` (the failed node)."""
    return [
        p
        for p in pods
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None and p.spec.node_name != avoid
    ]


def describe(pods: list[Any], avoid: str) -> str:
    terminating = sum(p.metadata.deletion_timestamp is not None for p in pods)
    return (
        f"{len(live_running(pods, avoid))}/{REPLICAS} Running off the failed node, {terminating} terminating"
    )


def unready_tolerations(pod: Any) -> dict[str, float | None]:
    """tolerationSeconds of the pod's NoExecute tolerations for the NotReady taints (None: forever;
    a key missing: not tolerated)."""
    found: dict[str, float | None] = {}
    for t in pod.spec.tolerations or []:
        if t.key in UNREADY_TAINTS and t.effect in ("NoExecute", None):
            found[t.key] = None if t.toleration_seconds is None else float(t.toleration_seconds)
    return found


def stock_failure(
    dev: Cluster, core: Any, batch: Any, name: str, toleration: int | None, failures: dict[str, int]
) -> StockSample | None:
    """One node failure under a fresh Job; None when the Job is not whole again within its tolerations
    plus 180 s."""
    batch.create_namespaced_job(NS, stock_job(name, toleration))
    pods = wait_for(lambda: whole(job_pods(core, name)), 120, f"Job {name} running")
    victim = pick_victim({p.spec.node_name for p in pods}, failures)
    lost = next(p for p in pods if p.spec.node_name == victim)
    tolerations = unready_tolerations(lost)
    fault, down = fail(dev, core, victim, failures)
    timeout = max((s or 0.0 for s in tolerations.values()), default=0.0) + 180
    check = with_progress(
        lambda: bool(whole(job_pods(core, name), victim)),
        name,
        down,
        lambda: describe(job_pods(core, name), victim),
    )
    sample = None
    try:
        wait_for(check, timeout, f"Job {name} whole again", interval=0.1)
        recovered = time.time()
        times = (fault, down, tainted_at(core, victim), recovered)
        sample = stock_sample(job_pods(core, name), pods, lost, tolerations, times)
    except TimeoutError:
        state = describe(job_pods(core, name), victim)
        print(f"    {name}: not whole again {timeout:.0f} s after NotReady: {state}", flush=True)
    clean_up_stock(dev, core, batch, name, victim)
    return sample


def whole(pods: list[Any], avoid: str = "") -> list[Any] | None:
    """The Job's pods when all REPLICAS run (not terminating, not on `avoid`), else None."""
    running = live_running(pods, avoid)
    return running if len(running) == REPLICAS else None


def stock_sample(
    pods: list[Any],
    before: list[Any],
    lost: Any,
    tolerations: dict[str, float | None],
    times: tuple[float, float, float, float],
) -> StockSample:
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
    uids = {p.metadata.uid for p in before}
    kept = sum(p.metadata.uid in uids for p in live_running(pods))
    replaced = new.metadata.creation_timestamp.timestamp() - down
    return StockSample(
        recovered - down, recovered - fault, tolerations, tainted - down, evicted, replaced, kept
    )


def tainted_at(core: Any, node: str) -> float:
    """timeAdded of the node's NoExecute NotReady taint (NaN: none)."""
    for t in core.read_node(node).spec.taints or []:
        if t.key in UNREADY_TAINTS and t.effect == "NoExecute" and t.time_added is not None:
            return float(t.time_added.timestamp())
    return float("nan")


def clean_up_stock(dev: Cluster, core: Any, batch: Any, name: str, victim: str) -> None:
    """Delete the Job and its pods, and bring the victim back. The evicted pod is force-deleted: kwok
    acts on pod events only, so it would stay Terminating on the recovered node forever."""
    batch.delete_namespaced_job(name, NS, propagation_policy="Background")
    selector = f"{JOB_NAME_LABEL}={name}"
    core.delete_collection_namespaced_pod(NS, label_selector=selector, grace_period_seconds=0)
    dev.recover_node(victim)
    wait_for(lambda: not job_pods(core, name), 120, f"pods of Job {name} gone")


def run_stock(
    dev: Cluster,
    core: Any,
    batch: Any,
    variant: str,
    toleration: int | None,
    n: int,
    failures: dict[str, int],
) -> list[StockSample | None]:
    samples = []
    for i in range(n):
        samples.append(stock_failure(dev, core, batch, f"stock-{variant}-{i}", toleration, failures))
        print(f"  stock {variant} failure {i + 1}: {stock_line(samples[-1])}", flush=True)
    return samples


def stock_line(sample: StockSample | None) -> str:
    if sample is None:
        return "not recovered"
    after = (
        f"tainted +{sample.tainted:.0f} s, evicted +{sample.evicted:.0f} s, "
        f"replacement created +{sample.replaced:.0f} s"
    )
    return (
        f"{sample.from_not_ready:5.1f} s\n      tolerations {fmt_tolerations(sample.tolerations)}; "
        f"after NotReady: {after}; {sample.kept} of {REPLICAS} pods kept"
    )


def fmt_tolerations(tolerations: dict[str, float | None]) -> str:
    def one(key: str) -> str:
        if key not in tolerations:
            return "none"
        seconds = tolerations[key]
        return "forever" if seconds is None else f"{seconds:g} s"

    return ", ".join(f"{key.rsplit('/', 1)[-1]} {one(key)}" for key in UNREADY_TAINTS)


# -- report ---------------------------------------------------------------------------------------
LABEL_WIDTH = 46


def row(label: str, samples: Sequence[Sample]) -> str:
    if not samples:
        return f"{label:{LABEL_WIDTH}s}{'not recovered':>16s}"
    a = statistics.median(s.from_not_ready for s in samples)
    b = statistics.median(s.from_fault for s in samples)
    return f"{label:{LABEL_WIDTH}s}{a:14.1f} s{b:14.1f} s"


def ratio(gpuq_p50: float, variant: str, samples: list[StockSample]) -> str:
    if not samples:
        return f"  {variant:24s}stock k8s never recovered"
    p50 = statistics.median(s.from_not_ready for s in samples)
    return f"  {variant:24s}{gpuq_p50 / p50:8.3g}   (stock k8s {p50 / gpuq_p50:.3g}x slower)"


def report(
    args: argparse.Namespace, monitor: float, gpuq: list[Sample], stock: dict[str, list[StockSample | None]]
) -> None:
    print(
        f"\ncluster: {SHAPE.racks * SHAPE.nodes_per_rack} kwok nodes x {SHAPE.gpus_per_node} GPUs, "
        f"workload {REPLICAS}x{GPUS}, gpuq notReadyGraceSeconds {args.grace:g}, "
        f"node-monitor-grace-period {monitor:g} s"
    )
    print(f"{'':{LABEL_WIDTH}s}{'from NotReady':>16s}{'from fault':>16s}")
    print(row(f"gpuq, p50 ({len(gpuq)} failures)", gpuq))
    p99 = percentile([s.from_not_ready for s in gpuq], 99), percentile([s.from_fault for s in gpuq], 99)
    print(f"{'gpuq, p99':{LABEL_WIDTH}s}{p99[0]:14.1f} s{p99[1]:14.1f} s")
    recovered = {variant: [s for s in samples if s is not None] for variant, samples in stock.items()}
    for variant, done in recovered.items():
        print(row(f"stock k8s, {variant}, p50 ({len(done)} of {len(stock[variant])})", done))
    gpuq_p50 = statistics.median(s.from_not_ready for s in gpuq)
    print("ratio gpuq / stock k8s (p50 from NotReady):")
    for variant, done in recovered.items():
        print(ratio(gpuq_p50, variant, done))
    if all(s.kept == REPLICAS - 1 for done in recovered.values() for s in done):
        print(
            f"stock k8s replaced only the lost pod each time: the other {REPLICAS - 1} kept running "
            "(no gang restart, no resume from a checkpoint)"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", type=int, default=20, help="gpuq node failures (default 20)")
    ap.add_argument("--grace", type=float, default=10.0, help="failover.notReadyGraceSeconds (default 10)")
    ap.add_argument(
        "--stock-failures",
        type=int,
        default=2,
        help="node failures for each stock Kubernetes variant (default 2; a default one takes ~5.5 min)",
    )
    args = ap.parse_args(argv)
    logs.configure("WARNING")
    cmd = "bench/failover.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"# failover benchmark   reproduce: .venv/bin/python {cmd}".rstrip())
    timing = Timing()
    dev = Cluster.up(f"bench-failover-{os.getpid()}", SHAPE, timing=timing, tie_to_process=True)
    try:
        api = _client(dev.kubeconfig)
        install_crds(api)
        gpuq = GpuqClient(api)
        from kubernetes import client as k8s

        gpuq.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
        failures: dict[str, int] = {}
        gpuq_samples = run_gpuq(dev, gpuq, args, failures)
        batch = k8s.BatchV1Api(api)
        # The tuned variant first: it shows within a minute that the stock path works at all.
        tuned = run_stock(dev, gpuq.core, batch, "tuned", TUNED_TOLERATION, args.stock_failures, failures)
        default = run_stock(dev, gpuq.core, batch, "default", None, args.stock_failures, failures)
        stock = {"default tolerations": default, f"tolerations {TUNED_TOLERATION} s": tuned}
    finally:
        dev.down()
    report(args, float(timing.node_monitor_grace_seconds), gpuq_samples, stock)
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())
    return 0


def _client(kubeconfig: Path) -> Any:
    from kubernetes import config as k8s_config

    return k8s_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
