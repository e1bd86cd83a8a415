"""Node failure and preemption, gpuq against the real Kueue, on the same local cluster (issue 32, item 3).

One cluster of 16 kwok nodes x 8 GPUs (4 racks, 2 blocks), one queue of 128 GPUs on each side; gpuq's
phase first (the operator as deployed, default config but --grace), then Kueue's (its operator
stopped, Kueue v0.17.0's full manager started as its users install it, see KUEUE_CONFIG).

a) Node failure: a fresh 4 x 8-GPU gang per failure (gpuq: a TrainingJob; Kueue: an Indexed Job of 4
   pods with the rack-level preferred-topology annotation), one of its nodes fails (the kwok heartbeat
   stops, Cluster.fail_node), timed from the fault and from NotReady to the whole gang Running again
   (gpuq: every worker of the new attempt; Kueue: 4 pods of the Job Running off the dead node, none
   terminating). Kueue's pods tolerate the NotReady taints for --toleration seconds (gpuq's grace);
   --kueue-default-failures adds failures with the API server's default 300 s tolerations.
b) Preemption: eight priority-0 2 x 8-GPU jobs fill the cluster, then a priority-100 4 x 8-GPU job
   arrives; timed from its creation to its admission (gpuq: its pods, created bound; Kueue: its
   Workload's Admitted condition) and to all 4 pods Running. gpuq asks its victims to checkpoint:
   this bench plays their training script and reports a checkpoint --save-seconds after it sees the
   request (the save counts against gpuq's time to admission). Kueue's victims are killed at once.

Progress lost, one model for both (gpuq.peers.incident_figures): a checkpoint every --interval seconds
to shared storage, resumed from on restart; a failure costs the gang's GPUs the work since the last
checkpoint (interval / 2 on average, interval at worst) plus the recovery time; a victim killed without
a checkpoint loses the work since its last one; a victim that saved loses the save and what ran after.

Reproduce: .venv/bin/python bench/incidents.py [--failures 3] [--preemptions 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpuq import logs
from gpuq.api import meta
from gpuq.controller.testing import DEFAULT_IMAGE, GpuqClient, OperatorProcess, install_crds
from gpuq.core.model import Queue
from gpuq.demo.trainer import Trainer, checkpoint_requested_at
from gpuq.devcluster import Cluster, ensure_binaries
from gpuq.devcluster.components import Timing
from gpuq.devcluster.faults import (
    JOB_NAME_LABEL,
    SHAPE,
    JobSample,
    Sample,
    gpuq_failure,
    job_failure,
    job_line,
    load,
    unready_toleration_spec,
)
from gpuq.devcluster.shape import RACK_LABEL
from gpuq.devcluster.testing import wait_for
from gpuq.peers import kueue_stack
from gpuq.peers.incident_figures import CHECKPOINT_INTERVAL_S, NONE, Loss, failure_loss, victim_loss
from gpuq.peers.kueue_binaries import ensure_kueue
from gpuq.peers.kueue_stack import KueueStack

NS = "bench-incidents"
QUEUE = "bench"
GANG = (4, 8)  # workers x GPUs: the failing gang and the preemptor
FILLER = (2, 8)  # the low-priority jobs that fill the cluster
FILLERS = SHAPE.racks * SHAPE.nodes_per_rack * SHAPE.gpus_per_node // (FILLER[0] * FILLER[1])
HIGH, LOW = 100, 0
# Kueue as its docs tell a user to set it up for this: TAS's failed-node replacement ("hot swap",
# site/content/en/docs/concepts/topology_aware_scheduling.md) with waitForPodsReady and a
# recoveryTimeout, so a gang whose replacement does not come is requeued whole; the values are the
# example of site/content/en/docs/tasks/manage/setup_wait_for_pods_ready.md. The four gates are
# v0.17.0's defaults (beta, on: pkg/features/kube_features.go), set explicitly so the run says so.
KUEUE_CONFIG = {
    **kueue_stack.BENCH_CLIENT,
    "featureGates": {
        "TASFailedNodeReplacement": True,
        "TASFailedNodeReplacementFailFast": True,
        "TASReplaceNodeOnPodTermination": True,
        "TASReplaceNodeOnNodeTaints": True,
    },
    "waitForPodsReady": {
        "timeout": "30m",
        "recoveryTimeout": "5m",
        "blockAdmission": False,
        "requeuingStrategy": {
            "timestamp": "Eviction",
            "backoffLimitCount": 5,
            "backoffBaseSeconds": 60,
            "backoffMaxSeconds": 3600,
        },
    },
}


def say(message: str) -> None:
    print(message, flush=True)


# -- a) node failure ------------------------------------------------------------------------------
def kueue_gang(name: str, toleration: int | None, priority: int = LOW) -> dict[str, Any]:
    """The 4 x 8 gang as a Kueue user writes it: an Indexed Job with the queue and priority-class
    labels and the rack-level preferred topology. backoffLimit is Kubernetes' default (6), not 0: a
    user who counts on Kueue replacing a failed node must let the Job replace a pod."""
    body = kueue_stack.indexed_job(name, QUEUE, *GANG, DEFAULT_IMAGE, ("preferred", RACK_LABEL))
    body["metadata"]["labels"][kueue_stack.PRIORITY_CLASS_LABEL] = kueue_stack.priority_class(priority)
    body["spec"]["backoffLimit"] = 6
    if toleration is not None:
        body["spec"]["template"]["spec"]["tolerations"] = unready_toleration_spec(toleration)
    return body


# -- b) preemption --------------------------------------------------------------------------------
@dataclass
class Preemption:
    """One preemption, seconds after the priority-100 job's creation (this host's clock)."""

    admitted: float = float("nan")
    running: float = float("nan")
    victims: dict[str, int] = field(default_factory=dict)  # victim -> its GPUs
    evicted: dict[str, float] = field(default_factory=dict)  # victim -> its pods going
    save_started: dict[str, float] = field(default_factory=dict)  # victim -> its save starting
    interval: float = CHECKPOINT_INTERVAL_S

    def loss(self) -> Loss:
        total = NONE
        for victim, gpus in self.victims.items():
            start = self.save_started.get(victim)
            saved = (
                (start, self.evicted[victim]) if start is not None and start <= self.evicted[victim] else None
            )
            total = total + victim_loss(gpus, saved, self.interval)
        return total

    def line(self) -> str:
        loss = self.loss()
        victims = ", ".join(f"{v} ({g} GPUs)" for v, g in sorted(self.victims.items()))
        saves = "".join(
            f"; {v} saved from +{s:.1f} s, evicted +{self.evicted[v]:.1f} s"
            for v, s in self.save_started.items()
        )
        return (
            f"admitted +{self.admitted:.1f} s, all pods Running +{self.running:.1f} s ({load()})\n"
            f"      victims: {victims}{saves}; lost {loss.expected_gpu_hours:.2f} GPU-h expected, "
            f"{loss.worst_gpu_hours:.2f} at worst"
        )


class Saver:
    """The victims' training script on gpuq's side: on a checkpoint request it saves for `seconds`
    (training stops) and reports the checkpoint; when each save started, on this host's clock."""

    def __init__(self, gpuq: GpuqClient, seconds: float) -> None:
        self.gpuq, self.seconds = gpuq, seconds
        self.trainer = Trainer(gpuq, NS, lambda _m: None)
        self.started: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._timers: list[threading.Timer] = []

    def __enter__(self) -> Saver:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for t in self._timers:
            t.cancel()

    def _run(self) -> None:
        while not self._stop.is_set():
            for obj in self.gpuq.jobs(NS):
                name = obj["metadata"]["name"]
                if name not in self.started and checkpoint_requested_at(obj) is not None:
                    self.started[name] = time.time()
                    timer = threading.Timer(self.seconds, self.trainer.save, args=(obj,))
                    timer.daemon = True
                    timer.start()
                    self._timers.append(timer)
            self._stop.wait(0.1)


def pods_by_job(core: Any, label: str) -> dict[str, list[Any]]:
    """The namespace's live pods (not terminating) by the value of their job label."""
    out: dict[str, list[Any]] = {}
    for p in core.list_namespaced_pod(NS).items:
        job = (p.metadata.labels or {}).get(label)
        if job is not None and p.metadata.deletion_timestamp is None:
            out.setdefault(job, []).append(p)
    return out


def watch_preemption(
    core: Any,
    label: str,
    admitted: Callable[[dict[str, list[Any]]], bool],
    t0: float,
    timeout: float,
) -> Preemption:
    """Poll until the preemptor (job "high") has all its workers Running: when it was admitted, and
    which fillers lost their pods, when."""
    out = Preemption()
    deadline = time.time() + timeout
    while time.time() < deadline:
        now = time.time() - t0
        pods = pods_by_job(core, label)
        if out.admitted != out.admitted and admitted(pods):
            out.admitted = now
        for i in range(FILLERS):
            name = f"low-{i}"
            if name not in out.evicted and len(pods.get(name, [])) < FILLER[0]:
                out.evicted[name] = now
                out.victims[name] = FILLER[0] * FILLER[1]
        high = pods.get("high", [])
        if len(high) == GANG[0] and all(p.status.phase == "Running" for p in high):
            out.running = now
            return out
        time.sleep(0.1)
    raise TimeoutError(f"the priority-{HIGH} job not running {timeout:.0f} s after its creation")


def fill(core: Any, label: str, submit: Callable[[str], None]) -> None:
    for i in range(FILLERS):
        submit(f"low-{i}")

    def running() -> bool:
        pods = [p for v in pods_by_job(core, label).values() for p in v]
        return len(pods) == FILLERS * FILLER[0] and all(p.status.phase == "Running" for p in pods)

    wait_for(running, 120, f"{FILLERS} low-priority jobs running")


def gpuq_preemption(gpuq: GpuqClient, save_seconds: float, interval: float) -> Preemption:
    def submit(name: str) -> None:
        gpuq.submit(NS, name, QUEUE, *FILLER, priority=LOW)

    fill(gpuq.core, meta.LABEL_JOB_NAME, submit)
    with Saver(gpuq, save_seconds) as saver:
        t0 = time.time()
        gpuq.submit(NS, "high", QUEUE, *GANG, priority=HIGH)
        out = watch_preemption(gpuq.core, meta.LABEL_JOB_NAME, lambda p: bool(p.get("high")), t0, 300)
        out.save_started = {v: s - t0 for v, s in saver.started.items() if v in out.victims}
    out.interval = interval
    gpuq.clear_namespace(NS)
    return out


def kueue_admitted(custom: Any, job: str) -> bool:
    """The Job's Workload has condition Admitted=True."""
    for wl in custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", NS, "workloads")["items"]:
        owners = {o.get("name") for o in wl["metadata"].get("ownerReferences") or []}
        if job in owners:
            conds = (wl.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Admitted" and c["status"] == "True" for c in conds)
    return False


def kueue_preemption(core: Any, batch: Any, custom: Any, interval: float) -> Preemption:
    def submit(name: str) -> None:
        body = kueue_stack.indexed_job(name, QUEUE, *FILLER, DEFAULT_IMAGE, ("preferred", RACK_LABEL))
        body["metadata"]["labels"][kueue_stack.PRIORITY_CLASS_LABEL] = kueue_stack.priority_class(LOW)
        batch.create_namespaced_job(NS, body)

    fill(core, JOB_NAME_LABEL, submit)
    t0 = time.time()
    body = kueue_gang("high", None, HIGH)
    body["spec"]["backoffLimit"] = 0
    batch.create_namespaced_job(NS, body)
    out = watch_preemption(core, JOB_NAME_LABEL, lambda _p: kueue_admitted(custom, "high"), t0, 300)
    out.interval = interval
    delete_jobs(core, batch)
    return out


def delete_jobs(core: Any, batch: Any) -> None:
    for job in batch.list_namespaced_job(NS).items:
        batch.delete_namespaced_job(job.metadata.name, NS, propagation_policy="Background")
    core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(NS).items, 120, f"pods of {NS} gone")


# -- the two sides --------------------------------------------------------------------------------
@dataclass
class Side:
    failures: dict[str, list[Sample | None]] = field(default_factory=dict)  # variant -> samples
    preemptions: list[Preemption] = field(default_factory=list)


def run_gpuq(dev: Cluster, api: Any, args: argparse.Namespace, failed: dict[str, int]) -> Side:
    install_crds(api)
    gpuq = GpuqClient(api)
    work = Path(tempfile.mkdtemp(prefix="gpuq-bench-incidents-"))
    (work / "config.yaml").write_text(f"failover: {{notReadyGraceSeconds: {args.grace:g}}}\n")
    op = OperatorProcess(dev.kubeconfig, work / "operator.log", work / "config.yaml").start()
    side = Side()
    try:
        gpuq.create_queue(QUEUE, SHAPE.racks * SHAPE.nodes_per_rack * SHAPE.gpus_per_node)
        samples: list[Sample | None] = []
        for i in range(args.failures):
            sample = gpuq_failure(dev, gpuq, NS, f"g{i}", QUEUE, GANG, failed)
            samples.append(sample)
            say(
                f"  gpuq failure {i + 1}: {sample.from_not_ready:5.1f} s from NotReady, "
                f"{sample.from_fault:5.1f} s from the fault ({load()})"
            )
        side.failures[f"grace {args.grace:g} s"] = samples
        for i in range(args.preemptions):
            side.preemptions.append(gpuq_preemption(gpuq, args.save_seconds, args.interval))
            say(f"  gpuq preemption {i + 1}: {side.preemptions[-1].line()}")
    finally:
        op.stop()
        say(f"  gpuq operator log: {work / 'operator.log'}")
    return side


def run_kueue(dev: Cluster, api: Any, args: argparse.Namespace, failed: dict[str, int]) -> Side:
    core, batch, custom = k8s.CoreV1Api(api), k8s.BatchV1Api(api), k8s.CustomObjectsApi(api)
    work = Path(tempfile.mkdtemp(prefix="gpuq-bench-incidents-kueue-"))
    stack = KueueStack(
        ensure_kueue(binaries=("manager",)), ensure_binaries() / "kubectl", dev.kubeconfig, work, KUEUE_CONFIG
    )
    stack.up(say=lambda m: say(f"  {m}"))
    side = Side()
    try:
        total = SHAPE.racks * SHAPE.nodes_per_rack * SHAPE.gpus_per_node
        for obj in kueue_stack.kueue_objects([Queue(name=QUEUE, nominal_gpus=total)], {LOW, HIGH}, NS):
            kueue_stack.create(custom, obj, NS)
        variants = [(f"tolerations {args.toleration} s", args.toleration, args.failures)]
        variants.append(("default tolerations", None, args.kueue_default_failures))
        for v, (variant, toleration, n) in enumerate(variants):
            samples: list[Sample | None] = []
            for i in range(n):
                body = kueue_gang(f"k{v}-{i}", toleration)
                job_sample = job_failure(dev, core, batch, NS, body, failed, say, slack=600)
                samples.append(job_sample)
                say(f"  kueue {variant} failure {i + 1}: {job_line(job_sample, GANG[0])}")
            if n:
                side.failures[variant] = samples
        for i in range(args.preemptions):
            side.preemptions.append(kueue_preemption(core, batch, custom, args.interval))
            say(f"  kueue preemption {i + 1}: {side.preemptions[-1].line()}")
    finally:
        stack.down()
        say(f"  kueue manager log: {work / 'kueue-manager.log'}")
    return side


# -- report ---------------------------------------------------------------------------------------
def p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def failure_figures(samples: Sequence[Sample | None], interval: float) -> dict[str, Any]:
    done = [s for s in samples if s is not None]
    fault = p50([s.from_fault for s in done])
    loss = failure_loss(GANG[0] * GANG[1], fault, interval) if done else None
    out: dict[str, Any] = {
        "failures": len(samples),
        "recovered": len(done),
        "from_fault_s": [round(s.from_fault, 2) for s in done],
        "from_not_ready_s": [round(s.from_not_ready, 2) for s in done],
        "p50_from_fault_s": fault,
        "p50_from_not_ready_s": p50([s.from_not_ready for s in done]),
        "lost_gpu_hours_expected": loss.expected_gpu_hours if loss else None,
        "lost_gpu_hours_worst": loss.worst_gpu_hours if loss else None,
    }
    if done and isinstance(done[0], JobSample):
        out["pods_kept"] = [s.kept for s in done if isinstance(s, JobSample)]
    return out


def preemption_figures(runs: Sequence[Preemption]) -> dict[str, Any]:
    return {
        "runs": [asdict(r) for r in runs],
        "p50_admitted_s": p50([r.admitted for r in runs]),
        "p50_running_s": p50([r.running for r in runs]),
        "victim_gpus": p50([sum(r.victims.values()) for r in runs]),
        "lost_gpu_hours_expected": p50([r.loss().expected_gpu_hours for r in runs]),
        "lost_gpu_hours_worst": p50([r.loss().worst_gpu_hours for r in runs]),
    }


ROWS = (  # label, "failure" or "preemption", key
    ("node failure: fault -> gang Running again, p50 (s)", "failure", "p50_from_fault_s"),
    ("... from NotReady, p50 (s)", "failure", "p50_from_not_ready_s"),
    ("... each failure, from the fault (s)", "failure", "from_fault_s"),
    ("... pods of the gang kept running", "failure", "pods_kept"),
    ("... progress lost per failure, expected / worst (GPU-h)", "failure", "lost"),
    ("preemption: creation -> admitted, p50 (s)", "preemption", "p50_admitted_s"),
    ("... creation -> all 4 pods Running, p50 (s)", "preemption", "p50_running_s"),
    ("... GPUs taken from victims", "preemption", "victim_gpus"),
    ("... victims' progress lost, expected / worst (GPU-h)", "preemption", "lost"),
)


def cell(f: dict[str, Any] | None, key: str) -> str:
    if f is None:
        return ""
    if key == "lost":
        e, w = f.get("lost_gpu_hours_expected"), f.get("lost_gpu_hours_worst")
        return "-" if e is None or e != e else f"{e:.2f} / {w:.2f}"
    value = f.get(key)
    if isinstance(value, list):
        return ", ".join(f"{v:g}" for v in value)
    if value is None or value != value:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def table(figures: dict[str, Any]) -> list[str]:
    """One column per side and failure variant; a side's preemption figures in its first column."""
    cols: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    for side in ("gpuq", "kueue"):
        if side not in figures:
            continue
        variants = list(figures[side]["failure"].items()) or [("", None)]
        for k, (variant, f) in enumerate(variants):
            cols.append((f"{side} {variant}".strip(), f, figures[side]["preemption"] if k == 0 else None))
    lines = ["| | " + " | ".join(c[0] for c in cols) + " |", "| --- |" + " --- |" * len(cols)]
    for label, which, key in ROWS:
        cells = [cell(f if which == "failure" else p, key) for _, f, p in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", type=int, default=3, help="node failures per side (default 3)")
    ap.add_argument(
        "--kueue-default-failures",
        type=int,
        default=0,
        help="Kueue failures with the default 300 s tolerations as well (each ~6 min; default 0)",
    )
    ap.add_argument("--preemptions", type=int, default=1, help="preemptions per side (default 1)")
    ap.add_argument(
        "--grace", type=float, default=10.0, help="gpuq's failover.notReadyGraceSeconds (default 10)"
    )
    ap.add_argument(
        "--toleration", type=int, default=10, help="Kueue pods' NotReady tolerations, s (default 10)"
    )
    ap.add_argument(
        "--save-seconds", type=float, default=30.0, help="a gpuq victim's checkpoint save (default 30)"
    )
    ap.add_argument(
        "--interval", type=float, default=CHECKPOINT_INTERVAL_S, help="checkpoint interval, s (600)"
    )
    ap.add_argument("--sides", default="gpuq,kueue", help="comma-separated: gpuq, kueue")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    logs.configure("WARNING")
    cmd = "bench/incidents.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    say(f"# incidents: gpuq vs Kueue   reproduce: .venv/bin/python {cmd}".rstrip())
    say(f"start: {load()}")
    timing = Timing()
    dev = Cluster.up(f"bench-incidents-{os.getpid()}", SHAPE, timing=timing, tie_to_process=True)
    sides: dict[str, Side] = {}
    try:
        api = k8s_config.new_client_from_config(config_file=str(dev.kubeconfig))  # type: ignore[no-untyped-call]
        k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
        failed: dict[str, int] = {}
        runners = {"gpuq": run_gpuq, "kueue": run_kueue}
        for name in args.sides.split(","):
            say(f"{name}: ({load()})")
            sides[name] = runners[name](dev, api, args, failed)
    finally:
        dev.down()
    figures: dict[str, Any] = {
        name: {
            "failure": {v: failure_figures(s, args.interval) for v, s in side.failures.items()},
            "preemption": preemption_figures(side.preemptions),
        }
        for name, side in sides.items()
    }
    figures["settings"] = {
        "cluster": SHAPE.describe(),
        "node_monitor_grace_s": float(timing.node_monitor_grace_seconds),
        "gpuq_not_ready_grace_s": args.grace,
        "kueue_config": KUEUE_CONFIG,
        "kueue_pod_toleration_s": args.toleration,
        "gpuq_victim_save_s": args.save_seconds,
        "checkpoint_interval_s": args.interval,
        "end_load": load(),
        "command": f".venv/bin/python {cmd}",
    }
    say("")
    for line in table(figures):
        say(line)
    say(f"\nend: {load()}; node-monitor-grace-period {timing.node_monitor_grace_seconds} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    say(f"reproduce: .venv/bin/python {cmd}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
