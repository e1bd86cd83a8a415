"""A slice of a real trace replayed on a real API server, once per scheduler, and through the
simulator beside it (issue 32; docs/simulator.md, "Replay"):

  gpuq            TrainingJobs, the operator as deployed (two replicas, leader election)
  kueue           Kueue v0.17.0's full manager as its users run it for training: TAS (a Topology of
                  the cluster's block / rack / node labels, a ResourceFlavor over the GPU nodes),
                  ClusterQueues and LocalQueues mirroring the GPUQueues (cohort, quota, preemption),
                  WorkloadPriorityClasses, waitForPodsReady; batch/v1 Indexed Jobs with the
                  podset-preferred-topology annotation at rack level for gangs
  kube-scheduler  the same Indexed Jobs without Kueue: no queueing, no gangs

Each side gets a freshly started local cluster of the same shape (kwok GPU nodes; a pod runs for its
job's compressed duration, `gpuq.dev/sim-duration`). Everything is measured from the API server
alone, the same way for each side (gpuq.peers.replay_tracker: creation, each run of all workers
started, the finish), and turned into the simulator's figures (gpuq.peers.replay_figures). The same
slice then runs through `gpuq simulate` for the gpuq and kueue-tas policies, with the costs the
replay has (no slowdown, no checkpoints, no restart overhead: a pod killed starts over).

  .venv/bin/python bench/replay.py ../shared/traces/philly-2017-09-10.csv --jobs 200 --start 864000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch

from gpuq import logs
from gpuq.api import meta
from gpuq.config import load_config
from gpuq.controller.resources import parse_quantity
from gpuq.controller.testing import GpuqClient, OperatorProcess, install_crds
from gpuq.core.model import Queue
from gpuq.devcluster import SIM_DURATION, Cluster, Shape, ensure_binaries
from gpuq.devcluster.shape import NODE_ALLOCATABLE, RACK_LABEL
from gpuq.devcluster.testing import wait_for
from gpuq.peers import kueue_stack
from gpuq.peers.kueue_binaries import ensure_kueue
from gpuq.peers.kueue_stack import KueueStack
from gpuq.peers.replay_figures import Cluster as FigureCluster
from gpuq.peers.replay_figures import figures
from gpuq.peers.replay_slice import (
    SliceError,
    compressed_rules,
    dns_label,
    replay_jobs,
    rules_yaml,
    slice_trace,
)
from gpuq.peers.replay_tracker import ReplayJob, Tracker
from gpuq.sim.cluster import GIB, ClusterShape, build_nodes, shape_for_gpus
from gpuq.sim.engine import SimOptions, requests_per_gpu
from gpuq.sim.metrics import percentile
from gpuq.sim.queues import derive_queues
from gpuq.sim.readers import read_trace
from gpuq.sim.scenario import Scenario
from gpuq.sim.speed import SpeedModel
from gpuq.sim.trace import TraceError

NS = "replay"
SIDES = ("gpuq", "kueue", "kube-scheduler")
TARGET_SECONDS = 900.0  # --compress's default: the slice back to back in 15 minutes
TIMEOUT_FLOOR = 900.0  # --timeout's least default
SIM_POLICIES = {"gpuq": "gpuq", "kueue": "kueue-tas"}
IMAGE = "registry.k8s.io/pause:3.10"
JOB_LABELS = {"gpuq": meta.LABEL_JOB_NAME, "kueue": "batch.kubernetes.io/job-name"}
# The replay's pods run their duration whatever happened before: a killed pod starts over, no
# checkpoint, no slowdown, no start-up cost. The simulator is given the same costs.
SIM_OPTIONS = SimOptions(
    speed=SpeedModel(enabled=False),
    checkpoint_minutes=None,
    checkpoint_save_seconds=1.0,  # longer than the grace: a victim asked to save is killed at once
    checkpoint_grace_seconds=0.0,
    restart_overhead_seconds=0.0,
)
FIGURES = (
    ("avg JCT (s)", lambda f: f["jct"]["avg"]),
    ("p50 JCT (s)", lambda f: f["jct"]["p50"]),
    ("p99 JCT (s)", lambda f: f["jct"]["p99"]),
    ("avg queueing (s)", lambda f: f["queueing_delay"]["avg"]),
    ("p99 queueing (s)", lambda f: f["queueing_delay"]["p99"]),
    ("comm cost per pair", lambda f: f["comm_multi_gpu"]["cost_per_pair"]),
    ("fragmentation (%)", lambda f: 100 * f["fragmentation"]),
    ("utilization (%)", lambda f: 100 * f["gpu_allocation"]),
    ("makespan (s)", lambda f: f["makespan"]),
    ("evictions", lambda f: f["preemptions"]),
    ("unfinished", lambda f: f["unfinished"]),
)


def sim_cluster(gpus: int, gpus_per_node: int, nodes_per_rack: int, racks_per_block: int) -> ClusterShape:
    """The simulator's cluster: the shape asked for, each node with the CPU and memory a kwok node of
    the local cluster offers (so the same CPU-heavy job fits the same nodes in both)."""
    shape = shape_for_gpus(gpus, gpus_per_node, nodes_per_rack, racks_per_block)
    cpu, memory = (parse_quantity(NODE_ALLOCATABLE[name]) for name in ("cpu", "memory"))
    return replace(shape, cpu_per_node=int(cpu), memory_gib_per_node=int(memory / GIB))


def dev_shape(shape: ClusterShape) -> Shape:
    """The local cluster of the simulator's shape (racks counted over the whole cluster)."""
    blocks = shape.zones * shape.blocks_per_zone
    return Shape(
        racks=blocks * shape.racks_per_block,
        nodes_per_rack=shape.nodes_per_rack,
        gpus_per_node=shape.gpus_per_node,
        blocks=blocks,
        zones=shape.zones,
    ).validate()


def figure_cluster(shape: Shape) -> FigureCluster:
    nodes = shape.nodes()
    return FigureCluster(
        {n.name: shape.gpus_per_node for n in nodes},
        {n.name: (n.zone, n.block, n.rack, n.name) for n in nodes},
    )


# -- what each side submits -------------------------------------------------------------------------
def worker_requests(job: ReplayJob) -> dict[str, str]:
    """The CPU and memory each worker asks for, as the simulator has them."""
    out = {}
    if job.cpu_millis:
        out["cpu"] = f"{job.cpu_millis}m"
    if job.memory_bytes:
        out["memory"] = str(job.memory_bytes)
    return out


def training_job(job: ReplayJob) -> dict[str, Any]:
    body = GpuqClient.job_body(
        job.name,
        job.queue,
        job.workers,
        job.gpus_per_worker,
        annotations={SIM_DURATION: f"{job.duration:.3f}s"},
        priority=job.priority,
        # Nothing in the replay saves checkpoints: a victim goes at once, as Kueue's does.
        checkpoint={"requestOnPreemption": False},
    )
    if requests := worker_requests(job):
        body["spec"]["workers"]["template"]["spec"]["containers"][0]["resources"] = {"requests": requests}
    return body


def indexed_job(job: ReplayJob, kueue: bool) -> dict[str, Any]:
    """The Job a Kueue user writes (queue and priority-class labels, rack-level preferred topology
    for a gang), or without Kueue the same Job bare."""
    topology = ("preferred", RACK_LABEL) if kueue and job.workers > 1 else None
    body = kueue_stack.indexed_job(
        job.name,
        job.queue,
        job.workers,
        job.gpus_per_worker,
        IMAGE,
        topology,
        {SIM_DURATION: f"{job.duration:.3f}s"},
        worker_requests(job),
    )
    labels = body["metadata"]["labels"]
    if kueue:
        labels[kueue_stack.PRIORITY_CLASS_LABEL] = kueue_stack.priority_class(job.priority)
    else:
        labels.clear()
    return body


# -- one side ------------------------------------------------------------------------------------------
class PodWatch:
    """Pods of the replay's namespace, fed to the tracker as the watch delivers them."""

    def __init__(self, core: k8s.CoreV1Api, tracker: Tracker, label: str, t0: float) -> None:
        self.core, self.tracker, self.label, self.t0 = core, tracker, label, t0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=15)

    def _see(self, kind: str, pod: Any) -> None:
        job = (pod.metadata.labels or {}).get(self.label)
        if job is None:
            return
        with self.lock:
            self.tracker.pod(
                job,
                pod.metadata.name,
                pod.spec.node_name,
                pod.status.phase or "Pending",
                time.monotonic() - self.t0,
                deleted=kind == "DELETED",
            )

    def _run(self) -> None:
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listing = self.core.list_namespaced_pod(NS)
                    for pod in listing.items:
                        self._see("ADDED", pod)
                    version = listing.metadata.resource_version
                for event in watch.Watch().stream(
                    self.core.list_namespaced_pod, NS, resource_version=version, timeout_seconds=5
                ):
                    version = event["object"].metadata.resource_version
                    self._see(event["type"], event["object"])
            except k8s.ApiException as exc:
                if exc.status == 410:
                    version = None  # expired: list again (a pod seen twice changes nothing)
                else:
                    time.sleep(0.5)


@contextlib.contextmanager
def side_cluster(side: str, shape: Shape) -> Iterator[tuple[Cluster, k8s.ApiClient]]:
    t = time.monotonic()
    dev = Cluster.up(f"replay-{side}-{os.getpid()}", shape, tie_to_process=True, timeout=600)
    print(f"{side}: cluster up in {time.monotonic() - t:.0f} s", flush=True)
    try:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(dev.kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
        cfg.connection_pool_maxsize = 16
        api = k8s.ApiClient(cfg)
        core = k8s.CoreV1Api(api)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
        wait_for(
            lambda: core.list_namespaced_service_account(NS, field_selector="metadata.name=default").items,
            30,
            "the replay namespace's service account",
        )
        yield dev, api
    finally:
        dev.down()


def set_up(
    side: str,
    dev: Cluster,
    api: k8s.ApiClient,
    queues: Sequence[Queue],
    jobs: Sequence[ReplayJob],
    work: Path,
    rules: Path | None,
) -> Callable[[], None]:
    """Install and start what `side` runs (gpuq with the config file `rules`); returns what stops it."""
    if side == "gpuq":
        install_crds(api)
        gpuq = GpuqClient(api)
        for q in queues:
            extra = {"cohort": q.cohort} if q.cohort else {}
            gpuq.create_queue(dns_label(q.name), q.nominal_gpus, **extra)
        work.mkdir(parents=True, exist_ok=True)
        replicas = [
            OperatorProcess(
                dev.kubeconfig,
                work / f"operator-{i}.log",
                config_path=rules,
                log_level="WARNING",
                tie_to_parent=True,
            ).start()
            for i in range(2)
        ]

        def stop_operators() -> None:
            for op in replicas:
                op.stop()

        return stop_operators
    if side == "kueue":
        stack = KueueStack(
            ensure_kueue(binaries=("manager",)),
            ensure_binaries() / "kubectl",
            dev.kubeconfig,
            work / "kueue",
            config={**kueue_stack.BENCH_CLIENT, "waitForPodsReady": {"timeout": "5m"}},
        )
        stack.up(say=lambda m: print(f"  {m}", flush=True))
        custom = k8s.CustomObjectsApi(api)
        nodes = dev.shape.node_count
        unbounded = {name: str(nodes * parse_quantity(NODE_ALLOCATABLE[name])) for name in ("cpu", "memory")}
        for obj in kueue_stack.kueue_objects(queues, {j.priority for j in jobs}, NS, unbounded):
            kueue_stack.create(custom, obj, NS)
        return stack.down
    return lambda: None


def submit(side: str, api: k8s.ApiClient, job: ReplayJob) -> None:
    if side == "gpuq":
        GpuqClient(api).create_job(NS, training_job(job))
    else:
        k8s.BatchV1Api(api).create_namespaced_job(NS, indexed_job(job, kueue=side == "kueue"))


def replay(
    side: str,
    shape: Shape,
    queues: Sequence[Queue],
    jobs: Sequence[ReplayJob],
    timeout: float,
    work: Path,
    rules: Path | None,
) -> dict[str, Any]:
    """Play the jobs on `side`'s own cluster on their compressed schedule; its figures."""
    with side_cluster(side, shape) as (dev, api):
        stop = set_up(side, dev, api, queues, jobs, work / side, rules)
        tracker = Tracker({j.name: j for j in jobs})
        t0 = time.monotonic()
        label = JOB_LABELS.get(side, "batch.kubernetes.io/job-name")
        pods = PodWatch(k8s.CoreV1Api(api), tracker, label, t0).start()
        late: list[float] = []
        try:
            for job in sorted(jobs, key=lambda j: j.submit):
                wait = job.submit - (time.monotonic() - t0)
                if wait > 0:
                    time.sleep(wait)
                late.append(max(0.0, -wait))
                submit(side, api, job)
                with pods.lock:
                    tracker.created(job.name, time.monotonic() - t0)
            deadline = t0 + timeout
            while time.monotonic() < deadline:
                with pods.lock:
                    left = tracker.unfinished()
                if not left:
                    break
                time.sleep(1.0)
            end = time.monotonic() - t0
        finally:
            pods.stop()
            stop()
        with pods.lock:
            observed = tracker.observed()
    out = figures(observed, figure_cluster(shape), until=end)
    out["queueing_fast_s"] = percentile([r.runs[0].start - r.created for r in observed if r.runs], 10)
    out["submit_late_p99_s"] = percentile(late, 99)
    out["queueing_by_job"] = {r.key: r.runs[0].start - r.created for r in observed if r.runs}
    out["wall_s"] = end
    print(f"{side}: {out['finished']} of {len(jobs)} finished in {end:.0f} s", flush=True)
    return out


def auto_compression(
    trace: Sequence[Any], start: float, count: int, gpus: int, max_duration: float | None
) -> float:
    """The factor that fits the slice's arrivals and its longest job into TARGET_SECONDS."""
    uncompressed, _ = slice_trace(
        trace, start=start, count=count, compress=1.0, total_gpus=gpus, max_duration=max_duration
    )
    span = max(j.submit_time for j in uncompressed) + max(j.duration for j in uncompressed)
    return max(1.0, round(span / TARGET_SECONDS))


def gap(sim: float, real: float) -> str:
    """The simulation's relative error against the replay."""
    return f"{100 * (sim - real) / real:+.1f}%" if real else f"{sim - real:+.2f} s (replay 0)"


def divergences(
    real: dict[str, Any], sim: dict[str, Any], jobs: Sequence[ReplayJob], keys: Sequence[str], top: int = 5
) -> list[str]:
    """The jobs whose queueing delay the simulation got most wrong, and the mean gap per job: where to
    look for a rule the simulator plays differently from the scheduler it stands in for."""
    simulated = {o.key: o.queueing_delay for o in sim["outcomes"]}
    replayed = real["queueing_by_job"]
    gaps = [
        (simulated[key] - replayed[job.name], job, replayed[job.name], simulated[key])
        for job, key in zip(jobs, keys, strict=True)
        if key in simulated and job.name in replayed
    ]
    if not gaps:
        return []
    mean = sum(abs(g[0]) for g in gaps) / len(gaps)
    lines = [f"  mean |sim - replay| queueing per job {mean:.1f} s over {len(gaps)} jobs; largest:"]
    for _, job, r, s in sorted(gaps, key=lambda g: -abs(g[0]))[:top]:
        lines.append(
            f"    {job.name} ({job.queue}, {job.workers}x{job.gpus_per_worker} GPUs, priority "
            f"{job.priority}, submitted {job.submit:.0f} s, runs {job.duration:.0f} s): "
            f"replay {r:.1f} s, sim {s:.1f} s"
        )
    return lines


def latency_share(f: dict[str, Any], jobs: Sequence[ReplayJob]) -> str:
    """The scheduler's own latency (the fastest tenth of queueing delays: jobs that found room) over
    the median compressed duration: how much of a figure is the machinery rather than the policy."""
    fast = f["queueing_fast_s"]
    median = sorted(j.duration for j in jobs)[len(jobs) // 2]
    return f"{fast:.2f} s = {100 * fast / median:.1f}% of the median duration {median:.1f} s"


def simulate(
    sliced: Sequence[Any],
    nodes: Sequence[Any],
    queues: Sequence[Queue],
    config: Any,
    policy: str,
    start_latency: float = 0.0,
) -> dict[str, Any]:
    """The slice through the simulator with the replay's costs, every start `start_latency` late."""
    options = replace(SIM_OPTIONS, start_latency_seconds=start_latency) if start_latency else SIM_OPTIONS
    return Scenario(sliced, nodes, queues, config, options).run(policy)


def scan(
    trace: Sequence[Any], args: argparse.Namespace, nodes: Sequence[Any], config: Any, slices: int, rules: str
) -> list[str]:
    """gpuq against kueue-tas in the simulator alone, on `slices` slices spread evenly over the trace
    (each `--jobs` long, compressed like a replay of it, with the replay's costs): where a replay
    could show a difference, and how often it would."""
    lo = min(j.submit_time for j in trace)
    hi = max(j.submit_time for j in trace)
    lines = [
        "| start (s) | compression | kueue-tas utilization | JCT gpuq/kueue-tas | queueing gpuq/kueue-tas |"
    ]
    lines.append("| --- | --- | --- | --- | --- |")
    ratios: list[tuple[float, float]] = []
    for i in range(slices):
        start = lo + (hi - lo) * i / slices
        compress = args.compress or auto_compression(trace, start, args.jobs, args.gpus, args.max_duration)
        sliced, _ = slice_trace(
            trace,
            start=start,
            count=args.jobs,
            compress=compress,
            total_gpus=args.gpus,
            max_duration=args.max_duration,
        )
        queues = derive_queues(sliced, args.gpus)
        ours = compressed_rules(config, compress) if rules == "compressed" else config
        k = simulate(sliced, nodes, queues, config, "kueue-tas")
        g = simulate(sliced, nodes, queues, ours, "gpuq")
        jct = g["jct"]["avg"] / k["jct"]["avg"]
        waited = k["queueing_delay"]["avg"]
        queueing = g["queueing_delay"]["avg"] / waited if waited > 0 else math.nan
        ratios.append((jct, queueing))
        lines.append(
            f"| {start:.0f} | {compress:g}x | {100 * k['gpu_allocation']:.0f}% | {jct:.2f} | "
            + ("-" if math.isnan(queueing) else f"{queueing:.2f}")
            + " |"
        )
    jcts = sorted(r[0] for r in ratios)
    waits = sorted(r[1] for r in ratios if not math.isnan(r[1]))
    lines.append(
        f"gpuq/kueue-tas over {len(ratios)} slices ({rules} rules): avg JCT min {jcts[0]:.2f}, median "
        f"{jcts[len(jcts) // 2]:.2f}, max {jcts[-1]:.2f}; "
        + (
            f"avg queueing min {waits[0]:.2f}, median {waits[len(waits) // 2]:.2f}, max {waits[-1]:.2f}"
            if waits
            else "no slice had queueing"
        )
    )
    return lines


NUDGES = (0.001, 0.1)  # seconds every start is delayed by in the robustness check


def robustness(
    sliced: Sequence[Any],
    nodes: Sequence[Any],
    queues: Sequence[Queue],
    config: Any,
    simulated: dict[str, dict[str, Any]],
) -> list[str]:
    """The slice simulated again with every start a millisecond, then a tenth of a second, late: on a
    small cluster one early decision can decide a whole slice, and then the figures say which side
    won a coin toss, not which policy is better. Per policy: does its wait move? Head to head: does
    the winner change?"""
    lines, waits = [], {}
    for policy, base in simulated.items():
        waits[policy] = [base["queueing_delay"]["avg"]]
        for nudge in NUDGES:
            # Less the nudge itself, which every job's wait includes once.
            nudged = simulate(sliced, nodes, queues, config, policy, nudge)["queueing_delay"]["avg"]
            waits[policy].append(nudged - nudge)
        w = waits[policy]
        robust = max(w) - min(w) <= max(0.1 * min(w), 0.05)  # 10%, or below the replay's resolution
        verdict = "robust" if robust else "KNIFE-EDGE: it moves with the timing"
        lines.append(
            f"robustness of sim {policy}: avg queueing {' / '.join(f'{x:.2f}' for x in w)} s with "
            f"starts 0 / {' / '.join(f'{n:g}' for n in NUDGES)} s late, less the delay ({verdict})"
        )
    if len(waits) == 2 and all(x > 0 for x in waits[SIM_POLICIES["kueue"]]):
        ratios = [
            g / k for g, k in zip(waits[SIM_POLICIES["gpuq"]], waits[SIM_POLICIES["kueue"]], strict=True)
        ]
        holds = max(ratios) < 1 or min(ratios) > 1
        lines.append(
            "robustness of the comparison: avg queueing gpuq/kueue-tas "
            + " / ".join(f"{r:.2f}" for r in ratios)
            + (" (the winner holds)" if holds else " (COIN TOSS: the winner changes with the timing)")
        )
    return lines


# -- output -----------------------------------------------------------------------------------------
def table(columns: dict[str, dict[str, Any]]) -> list[str]:
    names = list(columns)
    lines = ["| figure | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for label, get in FIGURES:
        cells = []
        for name in names:
            try:
                value = float(get(columns[name]))
            except (KeyError, TypeError, ValueError):
                value = math.nan
            cells.append("-" if math.isnan(value) else f"{value:,.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def json_figures(f: dict[str, Any]) -> dict[str, Any]:
    return {
        "avg_jct_s": f["jct"]["avg"],
        "avg_queueing_s": f["queueing_delay"]["avg"],
        "comm_cost": f["comm_multi_gpu"]["cost_per_pair"],
        "fragmentation": f["fragmentation"],
        "utilization": f["gpu_allocation"],
        "makespan_s": f["makespan"],
        "evictions": f["preemptions"],
        "unfinished": f["unfinished"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("trace", type=Path, help="Philly, Alibaba or canonical CSV (what `gpuq simulate` reads)")
    ap.add_argument("--format", default="auto", help="trace format (default auto)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs in the slice (default 200)")
    ap.add_argument("--start", type=float, default=0.0, help="trace seconds where the slice begins")
    ap.add_argument(
        "--compress",
        type=float,
        help="submit times and durations divided by this (default: so that the slice's arrivals and "
        "its longest job fit 15 minutes)",
    )
    ap.add_argument(
        "--max-duration",
        type=float,
        help="cap trace durations at this many (uncompressed) seconds, for the replay and the simulation "
        "alike (default: none; a heavy tail otherwise sets the compression)",
    )
    ap.add_argument("--gpus", type=int, default=128, help="cluster GPUs (default 128)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--nodes-per-rack", type=int, default=4)
    ap.add_argument("--racks-per-block", type=int, default=2)
    ap.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    ap.add_argument(
        "--timeout",
        type=float,
        help="max seconds per side after the last submit (default: twice what the slowest simulated "
        f"policy needs after it, at least {TIMEOUT_FLOOR:g})",
    )
    ap.add_argument(
        "--rules",
        choices=("compressed", "absolute"),
        default="compressed",
        help="gpuq's workload-time thresholds (attained-service levels, min run, starvation, "
        "consolidation and locality waits) divided by the compression like the trace's times "
        "(default), or as configured",
    )
    ap.add_argument(
        "--scan",
        type=int,
        metavar="N",
        help="simulate N slices spread over the whole trace (gpuq against kueue-tas, no replay) and "
        "print the ratios: where a replay would show a difference",
    )
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    cmd = "bench/replay.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"# trace replay   reproduce: .venv/bin/python {cmd}", flush=True)
    if not args.trace.exists():
        print(f"skipped: trace {args.trace} not found (the dev traces live in ../shared/traces/)")
        return 0
    sides = [s for s in args.sides.split(",") if s]
    if unknown := [s for s in sides if s not in SIDES]:
        ap.error(f"--sides: unknown {', '.join(unknown)} (choose from {', '.join(SIDES)})")
    logs.configure("WARNING")
    config = load_config(None)
    try:
        sim_shape = sim_cluster(args.gpus, args.gpus_per_node, args.nodes_per_rack, args.racks_per_block)
    except ValueError as exc:  # a cluster the shape flags cannot make
        ap.error(str(exc))
    nodes = build_nodes(sim_shape, config)
    try:
        trace, report = read_trace(args.trace, args.format, True, None)
    except TraceError as exc:  # e.g. a pod list without times: nothing to replay
        ap.error(f"{exc} (`gpuq simulate` takes that flag; a replay needs the trace's own times)")
    if args.scan:
        print("\n".join(scan(trace, args, nodes, config, args.scan, args.rules)))
        return 0
    compress = args.compress or auto_compression(trace, args.start, args.jobs, args.gpus, args.max_duration)
    try:
        sliced, too_big = slice_trace(
            trace,
            start=args.start,
            count=args.jobs,
            compress=compress,
            total_gpus=args.gpus,
            max_duration=args.max_duration,
        )
    except SliceError as exc:
        ap.error(str(exc))
    queues = derive_queues(sliced, args.gpus)
    jobs = replay_jobs(sliced, args.gpus_per_node, per_gpu=requests_per_gpu(nodes))
    shape = dev_shape(sim_shape)
    span = max(j.submit for j in jobs)
    durations = sorted(j.duration for j in jobs)
    print(
        f"slice: {len(jobs)} jobs from {args.start:g} s of {report.summary()} ({too_big} larger than the "
        f"cluster left out), compressed {compress:g}x: submitted over {span:.0f} s, durations "
        f"{durations[0]:.1f}-{durations[-1]:.1f} s; {shape.describe()}; {len(queues)} queues in one cohort",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="gpuq-replay-"))
    rules = None
    if args.rules == "compressed":
        config = compressed_rules(config, compress)
        rules = work / "gpuq-config.yaml"
        rules.write_text(yaml.safe_dump(rules_yaml(config)))
    print(f"gpuq's rules: {args.rules} ({json.dumps(rules_yaml(config))})", flush=True)
    simulated = {}
    for policy in SIM_POLICIES.values():
        t = time.monotonic()
        simulated[policy] = simulate(sliced, nodes, queues, config, policy)
        print(f"simulated {policy} in {time.monotonic() - t:.1f} s", flush=True)
    # A side cut off by the clock reports jobs unfinished that were only slow: give each side twice
    # what the slower simulated policy needs after the last submit.
    needed = max(f["makespan"] for f in simulated.values()) - span
    timeout = args.timeout if args.timeout is not None else max(TIMEOUT_FLOOR, 2 * needed)
    print(f"each side may run {timeout:.0f} s after the last submit", flush=True)
    replayed = {side: replay(side, shape, queues, jobs, span + timeout, work, rules) for side in sides}
    columns = {f"replay {s}": f for s, f in replayed.items()} | {f"sim {p}": f for p, f in simulated.items()}
    print("\n".join(table(columns)))
    print("\n".join(robustness(sliced, nodes, queues, config, simulated)))
    for side, policy in SIM_POLICIES.items():
        if side in replayed:
            real, sim = replayed[side], simulated[policy]
            print(
                f"sim {policy} vs replay {side}: avg JCT {gap(sim['jct']['avg'], real['jct']['avg'])}, "
                f"avg queueing {gap(sim['queueing_delay']['avg'], real['queueing_delay']['avg'])}"
            )
            print("\n".join(divergences(replayed[side], simulated[policy], jobs, [j.key for j in sliced])))
            # The simulator starts a gang the instant it places it; the side's measured latency
            # (the fastest tenth of its queueing delays) put back says how much of the gap it is.
            latency = real["queueing_fast_s"]
            timed = simulate(sliced, nodes, queues, config, policy, latency)
            print(
                f"  with {side}'s start latency ({latency:.2f} s) in the simulation: avg JCT "
                f"{gap(timed['jct']['avg'], real['jct']['avg'])}, avg queueing "
                f"{gap(timed['queueing_delay']['avg'], real['queueing_delay']['avg'])}"
            )
    for side, f in replayed.items():
        print(
            f"{side}: scheduling latency {latency_share(f, jobs)}; submissions late by up to "
            f"{f['submit_late_p99_s']:.2f} s (p99); logs in {work / side}"
        )
    if not sides:  # a simulation alone leaves nothing worth keeping
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        out = {
            "replay": {s: json_figures(f) for s, f in replayed.items()},
            "sim": {p: json_figures(f) for p, f in simulated.items()},
        }
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
