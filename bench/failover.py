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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuq import logs
from gpuq.controller.testing import DEFAULT_IMAGE, GpuqClient, OperatorProcess, install_crds
from gpuq.devcluster import Cluster
from gpuq.devcluster.components import Timing
from gpuq.devcluster.faults import (
    SHAPE,
    JobSample,
    Sample,
    gpuq_failure,
    job_failure,
    job_line,
    load,
    unready_toleration_spec,
)
from gpuq.devcluster.shape import GPU_RESOURCE
from gpuq.sim.metrics import percentile

NS = "bench-failover"
REPLICAS, GPUS = 4, 8
TUNED_TOLERATION = 10


# -- gpuq -----------------------------------------------------------------------------------------
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
            samples.append(gpuq_failure(dev, gpuq, NS, f"b{i}", queue, (REPLICAS, GPUS), failures))
            print(f"  gpuq failure {i + 1:2d}: {samples[-1].from_not_ready:5.1f} s ({load()})", flush=True)
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
        pod["tolerations"] = unready_toleration_spec(toleration)
    spec = {"completions": REPLICAS, "parallelism": REPLICAS, "completionMode": "Indexed"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {**spec, "template": {"spec": pod}},
    }


def run_stock(
    dev: Cluster,
    core: Any,
    batch: Any,
    variant: str,
    toleration: int | None,
    n: int,
    failures: dict[str, int],
) -> list[JobSample | None]:
    samples = []
    for i in range(n):
        body = stock_job(f"stock-{variant}-{i}", toleration)
        samples.append(job_failure(dev, core, batch, NS, body, failures, say))
        print(f"  stock {variant} failure {i + 1}: {job_line(samples[-1], REPLICAS)}", flush=True)
    return samples


def say(message: str) -> None:
    print(message, flush=True)


# -- report ---------------------------------------------------------------------------------------
LABEL_WIDTH = 46


def row(label: str, samples: Sequence[Sample]) -> str:
    if not samples:
        return f"{label:{LABEL_WIDTH}s}{'not recovered':>16s}"
    a = statistics.median(s.from_not_ready for s in samples)
    b = statistics.median(s.from_fault for s in samples)
    return f"{label:{LABEL_WIDTH}s}{a:14.1f} s{b:14.1f} s"


def ratio(gpuq_p50: float, variant: str, samples: list[JobSample]) -> str:
    if not samples:
        return f"  {variant:24s}stock k8s never recovered"
    p50 = statistics.median(s.from_not_ready for s in samples)
    return f"  {variant:24s}{gpuq_p50 / p50:8.3g}   (stock k8s {p50 / gpuq_p50:.3g}x slower)"


def report(
    args: argparse.Namespace, monitor: float, gpuq: list[Sample], stock: dict[str, list[JobSample | None]]
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
