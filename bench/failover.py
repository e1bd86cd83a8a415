"""Failover latency on the local cluster: time from a node turning NotReady (the Ready condition's
lastTransitionTime, as the API server records it) to every pod of the job's gang Running again on
other nodes, over --failures node failures (a fresh 4x8 gang each time, so every failure is a first
restart without back-off; the victim nodes rotate so none is damped for flapping). Printed beside it:
what stock Kubernetes would take, computed from this cluster's node-monitor grace period and the
unreachable toleration the API server really put on the job's pods, and with upstream defaults.

lastTransitionTime has one-second resolution, so each sample carries up to 1 s of quantisation.

Reproduce: .venv/bin/python bench/failover.py [--failures 20] [--grace 10]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuq import logs
from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, OperatorProcess, install_crds
from gpuq.devcluster import Cluster, Shape
from gpuq.devcluster.components import Timing
from gpuq.devcluster.testing import wait_for
from gpuq.sim.metrics import percentile

SHAPE = Shape(racks=4, nodes_per_rack=4, gpus_per_node=8, blocks=2, zones=1)
NS = "bench-failover"
# Upstream defaults: kube-controller-manager --node-monitor-grace-period (50 s since v1.32, 40 s before)
# and the DefaultTolerationSeconds admission plugin's 300 s for not-ready/unreachable.
STOCK_GRACE = (40.0, 50.0)
STOCK_TOLERATION = 300.0


def not_ready_since(gpuq: GpuqClient, node: str) -> float:
    cond = next(c for c in gpuq.core.read_node(node).status.conditions if c.type == "Ready")
    if cond.status == "True" or cond.last_transition_time is None:
        return 0.0
    return float(cond.last_transition_time.timestamp())


def gang_running(gpuq: GpuqClient, job: str, attempt: int, replicas: int) -> bool:
    pods = [p for p in gpuq.pods(NS, job) if p.metadata.labels[meta.LABEL_ATTEMPT] == str(attempt)]
    return len(pods) == replicas and all(p.status.phase == "Running" for p in pods)


def unreachable_toleration(pod: Any) -> float | None:
    for t in pod.spec.tolerations or []:
        if t.key == "node.kubernetes.io/unreachable" and t.toleration_seconds is not None:
            return float(t.toleration_seconds)
    return None


def one_failure(
    dev: Cluster, gpuq: GpuqClient, queue: str, i: int, failures: dict[str, int]
) -> tuple[float, Any]:
    job = f"b{i}"
    gpuq.submit(NS, job, queue, 4, 8)
    st = gpuq.wait_phase(NS, job, "Running", 60)
    pod = gpuq.pods(NS, job)[0]
    victim = min(sorted({p["node"] for p in st["placement"]}), key=lambda n: failures.get(n, 0))
    failures[victim] = failures.get(victim, 0) + 1
    dev.fail_node(victim)
    down = wait_for(lambda: not_ready_since(gpuq, victim), 60, f"{victim} NotReady", interval=0.1)
    wait_for(lambda: gang_running(gpuq, job, 2, 4), 120, f"{job} running again", interval=0.05)
    recovered = time.time()
    gpuq.delete_job(NS, job)
    dev.recover_node(victim)
    wait_for(lambda: not gpuq.pods(NS, job), 60, f"pods of {job} gone")
    return recovered - down, pod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", type=int, default=20)
    ap.add_argument("--grace", type=float, default=10.0, help="failover.notReadyGraceSeconds (default 10)")
    args = ap.parse_args(argv)
    logs.configure("WARNING")
    cmd = "bench/failover.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"# failover benchmark   reproduce: .venv/bin/python {cmd}".rstrip())
    timing = Timing()
    dev = Cluster.up(f"bench-failover-{os.getpid()}", SHAPE, timing=timing, tie_to_process=True)
    op = None
    try:
        install_crds(_client(dev.kubeconfig))
        gpuq = GpuqClient(_client(dev.kubeconfig))
        work = Path(tempfile.mkdtemp(prefix="gpuq-bench-failover-"))
        (work / "config.yaml").write_text(f"failover: {{notReadyGraceSeconds: {args.grace:g}}}\n")
        op = OperatorProcess(dev.kubeconfig, work / "operator.log", work / "config.yaml").start()
        from kubernetes import client as k8s

        gpuq.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
        queue = "bench"
        gpuq.create_queue(queue, 1000)
        samples: list[float] = []
        failures: dict[str, int] = {}
        pod = None
        for i in range(args.failures):
            took, pod = one_failure(dev, gpuq, queue, i, failures)
            samples.append(took)
            print(f"  failure {i + 1:2d}: {took:5.1f} s", flush=True)
    finally:
        if op is not None:
            op.stop()
        dev.down()
    toleration = unreachable_toleration(pod) if pod is not None else None
    tol = toleration if toleration is not None else STOCK_TOLERATION
    monitor = float(timing.node_monitor_grace_seconds)
    p50, p99 = statistics.median(samples), percentile(samples, 99)
    print(
        f"\ncluster: {SHAPE.racks * SHAPE.nodes_per_rack} kwok nodes x {SHAPE.gpus_per_node} GPUs, gang 4x8, "
        f"notReadyGraceSeconds {args.grace:g}, node-monitor-grace-period {monitor:g} s"
    )
    print(f"{'':34s}{'from NotReady':>16s}{'from last heartbeat':>22s}")
    print(f"{'gpuq, p50':34s}{p50:14.1f} s{p50 + monitor:20.1f} s")
    print(f"{'gpuq, p99':34s}{p99:14.1f} s{p99 + monitor:20.1f} s")
    print(f"{'  of which the grace period':34s}{args.grace:14.1f} s")
    print(
        f"{'stock k8s, this cluster':34s}{tol:14.1f} s{tol + monitor:20.1f} s"
        f"   (pod toleration {tol:g} s{' read from the pod' if toleration is not None else ''})"
    )
    for g in STOCK_GRACE:
        print(
            f"{f'stock k8s, defaults (grace {g:g} s)':34s}"
            f"{STOCK_TOLERATION:14.1f} s{STOCK_TOLERATION + g:20.1f} s"
        )
    print(
        f"ratio stock/gpuq (p50, from NotReady): {tol / p50:.0f}x; and stock k8s evicts only the lost pod: "
        "the gang is not restarted, nor resumed from a checkpoint"
    )
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())
    return 0


def _client(kubeconfig: Path) -> Any:
    from kubernetes import config as k8s_config

    return k8s_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
