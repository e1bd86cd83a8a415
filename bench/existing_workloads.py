"""Jobs teams already have, scheduled by gpuq: a 4 x 8-GPU TrainingJob, Indexed Job and PyTorchJob in
one run on one local cluster (docs/existing-workloads.md).

For each kind, --runs times (a fresh workload each time, one at a time):
  bound     submit (the create call) -> every pod of the gang bound to a node (attempt 1);
  running   submit -> every pod Running;
  failover  a node of the gang fails (its kwok heartbeat stopped) -> every pod of attempt 2 Running
            on other nodes, measured from NotReady (the API server's transition time, 1 s
            resolution) and from the fault; failover.notReadyGraceSeconds is --grace.
A TrainingJob's pods are created by gpuq, already bound; an Indexed Job's by the Job controller and a
PyTorchJob's by Kubeflow's training-operator v1.8.1 (built from its Go module, installed as its users
install it), then bound by gpuq: their submit-to-bound time includes their controller's work, as a
user sees it. Pods are polled every 20 ms.

Reproduce: .venv/bin/python bench/existing_workloads.py [--runs 5] [--grace 5]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from failover import _client, fail, pick_victim
from gpuq import logs
from gpuq.api import meta
from gpuq.controller.testing import (
    GpuqClient,
    OperatorProcess,
    indexed_job_body,
    install_crds,
    pytorchjob_body,
)
from gpuq.devcluster import Cluster, Shape, ensure_binaries
from gpuq.devcluster.testing import wait_for
from gpuq.peers.training_operator import TrainingOperatorStack, ensure_training_operator

SHAPE = Shape(racks=4, nodes_per_rack=4, gpus_per_node=8, blocks=2, zones=1)
NS = "bench-workloads"
QUEUE = "bench"
REPLICAS, GPUS = 4, 8
POLL = 0.02


@dataclass
class Figures:
    bound: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)
    failover_not_ready: list[float] = field(default_factory=list)
    failover_fault: list[float] = field(default_factory=list)


RUNS_FOR = {"gpuq.dev/sim-duration": "3600s"}  # the gangs run until the bench deletes them


@dataclass(frozen=True)
class Workload:
    """How to submit one kind, find its pods, and delete it."""

    kind: str
    submit: Callable[[str], None]
    pods: Callable[[str], list[Any]]
    delete: Callable[[str], None]


def attempt_of(pod: Any) -> str | None:
    return (pod.metadata.labels or {}).get(meta.LABEL_ATTEMPT) or (pod.metadata.annotations or {}).get(
        meta.LABEL_ATTEMPT
    )


def live(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def workloads(gpuq: GpuqClient, api: Any) -> list[Workload]:
    batch, custom, core = k8s.BatchV1Api(api), k8s.CustomObjectsApi(api), gpuq.core

    def by_label(label: str) -> Callable[[str], list[Any]]:
        return lambda name: live(core.list_namespaced_pod(NS, label_selector=f"{label}={name}").items)

    def indexed(name: str) -> None:
        body = indexed_job_body(name, QUEUE, REPLICAS, GPUS, RUNS_FOR, backoff_limit=100)
        batch.create_namespaced_job(NS, body)

    def pytorch(name: str) -> None:
        body = pytorchjob_body(name, QUEUE, REPLICAS, GPUS, RUNS_FOR)
        custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", body)

    def training_job(name: str) -> None:
        body = gpuq.job_body(name, QUEUE, REPLICAS, GPUS)
        body["metadata"]["annotations"] = dict(RUNS_FOR)
        gpuq.create_job(NS, body)

    return [
        Workload(
            "TrainingJob", training_job, lambda n: live(gpuq.pods(NS, n)), lambda n: gpuq.delete_job(NS, n)
        ),
        Workload(
            "Indexed Job",
            indexed,
            by_label("batch.kubernetes.io/job-name"),
            lambda n: batch.delete_namespaced_job(n, NS, propagation_policy="Background"),
        ),
        Workload(
            "PyTorchJob",
            pytorch,
            by_label("training.kubeflow.org/job-name"),
            lambda n: custom.delete_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", n),
        ),
    ]


def gang(w: Workload, name: str, attempt: int, running: bool, avoid: str = "") -> bool:
    pods = [
        p
        for p in w.pods(name)
        if attempt_of(p) == str(attempt) and p.spec.node_name and p.spec.node_name != avoid
    ]
    return len(pods) == REPLICAS and (not running or all(p.status.phase == "Running" for p in pods))


def one_run(
    dev: Cluster, gpuq: GpuqClient, w: Workload, name: str, f: Figures, failures: dict[str, int]
) -> None:
    t0 = time.time()
    w.submit(name)
    wait_for(lambda: gang(w, name, 1, False), 120, f"{name} bound", POLL)
    f.bound.append(time.time() - t0)
    wait_for(lambda: gang(w, name, 1, True), 120, f"{name} running", POLL)
    f.running.append(time.time() - t0)
    victim = pick_victim({p.spec.node_name for p in w.pods(name)}, failures)
    fault, down = fail(dev, gpuq.core, victim, failures)
    wait_for(lambda: gang(w, name, 2, True, avoid=victim), 180, f"{name} running again", POLL)
    back = time.time()
    f.failover_not_ready.append(back - down)
    f.failover_fault.append(back - fault)
    w.delete(name)
    dev.recover_node(victim)
    wait_for(lambda: not w.pods(name), 120, f"pods of {name} gone")


def line(label: str, xs: list[float]) -> str:
    if not xs:
        return f"  {label:28s} -"
    return (
        f"  {label:28s} median {statistics.median(xs):6.2f} s   min {min(xs):6.2f} s   max {max(xs):6.2f} s"
        f"   ({len(xs)} runs)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="workloads of each kind (default 5)")
    ap.add_argument("--grace", type=float, default=5.0, help="failover.notReadyGraceSeconds (default 5)")
    args = ap.parse_args(argv)
    logs.configure("WARNING")
    cmd = "bench/existing_workloads.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"# existing workloads benchmark   reproduce: .venv/bin/python {cmd}".rstrip(), flush=True)
    build = ensure_training_operator()
    dev = Cluster.up(f"bench-workloads-{os.getpid()}", SHAPE, tie_to_process=True)
    work = Path(tempfile.mkdtemp(prefix="gpuq-bench-workloads-"))
    figures: dict[str, Figures] = {}
    stack = TrainingOperatorStack(build, ensure_binaries() / "kubectl", dev.kubeconfig, work)
    try:
        api = _client(dev.kubeconfig)
        install_crds(api)
        gpuq = GpuqClient(api)
        gpuq.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
        stack.up(lambda m: print(f"  {m}", flush=True))
        (work / "config.yaml").write_text(f"failover: {{notReadyGraceSeconds: {args.grace:g}}}\n")
        op = OperatorProcess(dev.kubeconfig, work / "operator.log", work / "config.yaml").start()
        try:
            gpuq.create_queue(QUEUE, 1000)
            failures: dict[str, int] = {}
            for i in range(args.runs):  # the kinds interleaved: drift on the machine hits all alike
                for w in workloads(gpuq, api):
                    f = figures.setdefault(w.kind, Figures())
                    name = f"{w.kind.split()[0].lower()}-{i}"
                    one_run(dev, gpuq, w, name, f, failures)
                    print(
                        f"  run {i + 1} {w.kind:12s} bound {f.bound[-1]:5.2f} s"
                        f"  running {f.running[-1]:5.2f} s"
                        f"  failover {f.failover_not_ready[-1]:5.2f} s from NotReady",
                        flush=True,
                    )
        finally:
            op.stop()
    finally:
        stack.down()
        dev.down()
    nodes = SHAPE.racks * SHAPE.nodes_per_rack
    print(f"\n{REPLICAS} x {GPUS}-GPU gangs, one at a time, on {nodes} kwok nodes; grace {args.grace:g} s")
    for kind, f in figures.items():
        print(f"{kind}:")
        print(line("submit -> all pods bound", f.bound))
        print(line("submit -> all pods Running", f.running))
        print(line("failover, from NotReady", f.failover_not_ready))
        print(line("failover, from the fault", f.failover_fault))
    base = statistics.median(figures["TrainingJob"].bound) if figures.get("TrainingJob") else None
    if base:
        for kind in ("Indexed Job", "PyTorchJob"):
            if figures.get(kind):
                ratio = statistics.median(figures[kind].bound) / base
                print(f"{kind} / TrainingJob, median submit -> bound: {ratio:.2f}x")
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
