"""Benchmark of gpuq.core.schedule: full cycle, incremental cycle, preemption search, memory, growth.

Clusters of 8-GPU nodes in zones (4,096 nodes) > blocks (256 nodes) > racks (16 nodes); workloads with a
Philly-like size mix (mostly 1-GPU jobs, some 8- to 128-GPU gangs, half of the >= 16-GPU gangs Required
to one rack) spread over 15 queues sharing one cohort. Figures are printed, never asserted; ratios are
against baselines measured in the same run. Run it with:

    .venv/bin/python bench/core_bench.py                  # 1,024 / 4,096 / 16,384 nodes
    .venv/bin/python bench/core_bench.py --sizes 1024 --incremental 100   # quick
    .venv/bin/python bench/core_bench.py --sizes 1024 --only-rules   # the default rules on a deep backlog
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuq.core import ClusterIndex, SchedulerConfig, schedule
from gpuq.core.decisions import Decisions
from gpuq.core.model import (
    Job,
    Node,
    PreemptionPolicy,
    Queue,
    ReclaimPreemption,
    Resources,
    Running,
    Snapshot,
    Topology,
    TopologyMode,
    TopologyRequest,
    WithinQueuePreemption,
    WorkerSpec,
)

GI = 1 << 30
QUEUES = 15  # Philly had 15 virtual clusters
# GPUs per job and their weights: Philly-like (about 90% single-GPU), with a tail of 8..128-GPU gangs.
SIZE_MIX = (
    (1, 0.900),
    (2, 0.020),
    (4, 0.020),
    (8, 0.035),
    (16, 0.012),
    (32, 0.008),
    (64, 0.003),
    (128, 0.002),
)
TOPOLOGY = Topology()


def build_nodes(n: int) -> list[Node]:
    nodes = []
    for i in range(n):
        name = f"node-{i:05d}"
        path = (f"zone-{i // 4096}", f"block-{i // 256}", f"rack-{i // 16}", name)
        nodes.append(Node(name, Resources(8, 96_000, 1024 * GI), path))
    return nodes


def build_queues(n_nodes: int) -> tuple[Queue, ...]:
    """Nominal quotas that add up to the cluster exactly (so a full cluster is within quota)."""
    share, extra = divmod(n_nodes * 8, QUEUES)
    return tuple(Queue(f"team-{i:02d}", share + (i < extra), cohort="all") for i in range(QUEUES))


class Workload:
    """Deterministic stream of jobs with the size mix above."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.count = 0

    def job(self, created: float, priority: int | None = None, gpus: int | None = None) -> Job:
        rnd = self.rnd
        size = gpus or rnd.choices([s for s, _ in SIZE_MIX], [w for _, w in SIZE_MIX])[0]
        if size >= 8:
            workers = WorkerSpec(size // 8, 8, 8_000, 64 * GI)
        else:
            workers = WorkerSpec(1, size, 4_000 * size, 32 * GI * size)
        topology = TopologyRequest()
        if size >= 16 and rnd.random() < 0.5:
            topology = TopologyRequest("rack", TopologyMode.REQUIRED)
        self.count += 1
        return Job(
            key=f"bench/job-{self.count:07d}",
            queue=f"team-{rnd.randrange(QUEUES):02d}",
            priority=rnd.choice((0, 0, 0, 1)) if priority is None else priority,
            created_at=created,
            workers=workers,
            topology=topology,
        )


def timed(fn: Callable[[], Decisions]) -> tuple[float, Decisions]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def ms(x: float) -> str:
    return f"{x * 1e3:8.2f} ms"


@dataclass
class Filled:
    nodes: list[Node]
    queues: tuple[Queue, ...]
    jobs: dict[str, Job]


def fill(n_nodes: int, target: float, work: Workload, priority: int | None = None) -> Filled:
    """A cluster whose GPUs are `target` used by running jobs placed by gpuq itself."""
    nodes = build_nodes(n_nodes)
    queues = build_queues(n_nodes)
    total = n_nodes * 8
    jobs: dict[str, Job] = {}
    used = 0
    big = SchedulerConfig(max_admissions_per_cycle=10**9)
    while used < target * total:
        batch = []
        want = target * total - used
        while want > 0:
            j = work.job(0.0, priority=priority)
            if j.workers.total_gpus > want and j.workers.total_gpus > 1:
                j = work.job(0.0, priority=priority, gpus=1)
            batch.append(j)
            want -= j.workers.total_gpus
        s = Snapshot(TOPOLOGY, tuple(nodes), queues, (*jobs.values(), *batch))
        d = schedule(s, 0.0, big)
        by_key = {j.key: j for j in batch}
        for a in d.admit:
            jobs[a.job] = replace(by_key[a.job], running=Running(a.placement, 0.0))
            used += by_key[a.job].workers.total_gpus
        if not d.admit:
            break
    return Filled(nodes, queues, jobs)


def bench_full_cycle(n_nodes: int, n_jobs: int, seed: int, repeat: int) -> dict[str, float]:
    nodes = build_nodes(n_nodes)
    queues = build_queues(n_nodes)
    work = Workload(seed)
    jobs = tuple(work.job(float(i)) for i in range(n_jobs))
    s = Snapshot(TOPOLOGY, tuple(nodes), queues, jobs)
    cfg = SchedulerConfig()
    times, index_times = [], []
    d = None
    for _ in range(repeat):
        gc.collect()
        t, d = timed(lambda: schedule(s, 10_000.0, cfg))
        times.append(t)
        t0 = time.perf_counter()
        ClusterIndex(s, cfg)
        index_times.append(time.perf_counter() - t0)
    assert d is not None
    gc.collect()
    tracemalloc.start()
    schedule(s, 10_000.0, cfg)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gpus = sum(n_nodes for _ in (0,)) * 8
    placed = sum(len(a.placement) * jobs_by(jobs)[a.job].workers.gpus_per_worker for a in d.admit)
    return {
        "time": statistics.median(times),
        "index": statistics.median(index_times),
        "admitted": len(d.admit),
        "pending": len(d.pending),
        "util": placed / gpus,
        "peak_mb": peak / 1e6,
    }


_JOBS_BY: dict[int, dict[str, Job]] = {}


def jobs_by(jobs: tuple[Job, ...]) -> dict[str, Job]:
    key = id(jobs)
    if key not in _JOBS_BY:
        _JOBS_BY[key] = {j.key: j for j in jobs}
    return _JOBS_BY[key]


def unfittable(queue: str) -> Job:
    """A high-priority gang no node could hold even empty: 8 GPUs with more CPU than any node has."""
    return Job("bench/unfittable", queue, 9, 0.0, WorkerSpec(1, 8, 200_000, 64 * GI), TopologyRequest())


def bench_incremental(
    n_nodes: int, iterations: int, seed: int, baseline_runs: int, stuck: bool = False
) -> dict[str, float]:
    """Cluster 90% full; each cycle one job arrives, gpuq admits it, one running job finishes.
    stuck: a job that can never fit waits at the head of a queue all along."""
    work = Workload(seed)
    filled = fill(n_nodes, 0.90, work)
    nodes, queues, jobs = filled.nodes, filled.queues, filled.jobs
    if stuck:
        jobs["bench/unfittable"] = unfittable(queues[0].name)
    cfg = SchedulerConfig()
    node_tuple = tuple(nodes)
    s = Snapshot(TOPOLOGY, node_tuple, queues, tuple(jobs.values()))
    gc.collect()
    tracemalloc.start()
    ix = ClusterIndex(s, cfg)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rnd = random.Random(seed + 1)
    cycle, apply_t, snap_t = [], [], []
    running_keys = sorted(jobs)
    now = 100.0
    for _ in range(iterations):
        now += 1.0
        arrival = work.job(now)
        jobs[arrival.key] = arrival
        t0 = time.perf_counter()
        s = Snapshot(TOPOLOGY, node_tuple, queues, tuple(jobs.values()))
        t1 = time.perf_counter()
        ix.apply(s, jobs=[arrival])
        t2 = time.perf_counter()
        t, d = timed(lambda s=s, now=now: schedule(s, now, cfg, index=ix))
        cycle.append(t)
        snap_t.append(t1 - t0)
        apply_t.append(t2 - t1)
        # The writer binds what was admitted; a random running job finishes.
        changed, removed = [], []
        for a in d.admit:
            jobs[a.job] = replace(jobs[a.job], running=Running(a.placement, now))
            changed.append(jobs[a.job])
            running_keys.append(a.job)
        if not d.admit:
            del jobs[arrival.key]
            removed.append(arrival.key)
        done = running_keys.pop(rnd.randrange(len(running_keys)))
        del jobs[done]
        removed.append(done)
        s = Snapshot(TOPOLOGY, node_tuple, queues, tuple(jobs.values()))
        ix.apply(s, jobs=changed, removed_jobs=removed)
    # Baseline: the same cycle without a kept index (rebuilt from the snapshot every time).
    arrival = work.job(now + 1)
    s = Snapshot(TOPOLOGY, node_tuple, queues, (*jobs.values(), arrival))
    fresh = [timed(lambda: schedule(s, now + 1, cfg))[0] for _ in range(baseline_runs)]
    used = sum(len(j.running.placement) * j.workers.gpus_per_worker for j in jobs.values() if j.running)
    return {
        "p50": pct(cycle, 50),
        "p99": pct(cycle, 99),
        "max": max(cycle),
        "apply_p50": pct(apply_t, 50),
        "snapshot_p50": pct(snap_t, 50),
        "fresh": statistics.median(fresh),
        "running": len(jobs),
        "util": used / (n_nodes * 8),
        "index_peak_mb": peak / 1e6,
        "rebuilds": ix.rebuilds,
    }


def _backlog_job(work: Workload, rnd: random.Random, now: float) -> Job:
    """A waiting job of a deep backlog: it waited up to two days (so heads starve, may have gangs
    moved for them, and multi-node gangs sit in their locality wait), and a third of them ran before
    (attained service: levels 1 and 2, as preempted jobs)."""
    created = now - rnd.uniform(0, 2 * 86_400)
    j = work.job(created)
    if rnd.random() < 1 / 3:
        served = rnd.choice((2.0, 150.0)) * 3600  # GPU-seconds: level 1 or 2 of the default config
        j = replace(j, attained_gpu_seconds=served, queued_since=rnd.uniform(created, now))
    return j


def _started_earlier(jobs: dict[str, Job], rnd: random.Random, now: float) -> None:
    """Running jobs started at random times over the last day: some are still in their minimum run,
    the others at attained-service levels 1 and 2 (victims of their queues' new work)."""
    for key, j in jobs.items():
        if j.running is not None:
            jobs[key] = replace(j, running=Running(j.running.placement, now - rnd.uniform(0, 86_400)))


def bench_rules(n_nodes: int, iterations: int, seed: int, backlog: int) -> dict[str, float]:
    """The default config's rules on a deep backlog: the cluster full of jobs at every attained-service
    level, `backlog` jobs waiting up to two days (starving heads, consolidation, locality waits). Each
    cycle 30 s pass, one job arrives, one running job finishes, and what the cycle decides is carried
    out (admissions run, victims leave and wait again with their service)."""
    work = Workload(seed)
    rnd = random.Random(seed + 3)
    now = 3 * 86_400.0
    jobs = fill(n_nodes, 0.97, work).jobs
    _started_earlier(jobs, rnd, now)
    for _ in range(backlog):
        j = _backlog_job(work, rnd, now)
        jobs[j.key] = j
    nodes, queues, cfg = tuple(build_nodes(n_nodes)), build_queues(n_nodes), SchedulerConfig()
    s = Snapshot(TOPOLOGY, nodes, queues, tuple(jobs.values()))
    ix = ClusterIndex(s, cfg)
    cycle: list[float] = []
    counts = {"admitted": 0, "preempted": 0}
    for _ in range(iterations):
        now += 30.0
        arrival = work.job(now)
        jobs[arrival.key] = arrival
        s = Snapshot(TOPOLOGY, nodes, queues, tuple(jobs.values()))
        ix.apply(s, jobs=[arrival])
        t, d = timed(lambda s=s, now=now: schedule(s, now, cfg, index=ix, explain=False))
        cycle.append(t)
        changed, removed = _carry_out(jobs, d, now, rnd)
        s = Snapshot(TOPOLOGY, nodes, queues, tuple(jobs.values()))
        ix.apply(s, jobs=changed, removed_jobs=removed)
        counts["admitted"] += len(d.admit)
        counts["preempted"] += len(d.preempt)
    fresh = [timed(lambda: schedule(s, now, cfg, explain=False))[0] for _ in range(3)]
    explained = timed(lambda: schedule(s, now, cfg))[0]
    pending = sum(1 for j in jobs.values() if j.running is None)
    return {
        "p50": pct(cycle, 50),
        "p99": pct(cycle, 99),
        "max": max(cycle),
        "fresh": statistics.median(fresh),
        "explained": explained,
        "pending": pending,
        "rebuilds": ix.rebuilds,
        **counts,
    }


def _carry_out(
    jobs: dict[str, Job], d: Decisions, now: float, rnd: random.Random
) -> tuple[list[Job], list[str]]:
    """What the writer and the cluster do with a cycle's decisions, in one step: admitted jobs run,
    victims stop and wait again (their service kept), and one running job finishes."""
    changed: dict[str, Job] = {}
    for a in d.admit:
        started = replace(jobs[a.job], running=Running(a.placement, now), recovering=False)
        changed[a.job] = jobs[a.job] = started
    for p in d.preempt:
        v = jobs[p.victim]
        if v.running is not None:
            served = v.attained_gpu_seconds + len(v.running.placement) * v.workers.gpus_per_worker * (
                now - v.running.started_at
            )
            changed[v.key] = jobs[v.key] = replace(
                v, running=None, attained_gpu_seconds=served, queued_since=now, evicting=False
            )
    running = sorted(k for k, j in jobs.items() if j.running is not None and k not in changed)
    removed = [running[rnd.randrange(len(running))]] if running else []
    for key in removed:
        del jobs[key]
    return list(changed.values()), removed


def bench_preemption(n_nodes: int, trials: int, seed: int) -> dict[str, dict[str, float]]:
    """Cluster 100% full of priority-0 jobs; one high-priority job of each shape arrives."""
    work = Workload(seed)
    filled = fill(n_nodes, 1.0, work, priority=0)
    nodes, queues, jobs = filled.nodes, filled.queues, filled.jobs
    cfg = SchedulerConfig()
    node_tuple = tuple(nodes)
    base = Snapshot(TOPOLOGY, node_tuple, queues, tuple(jobs.values()))
    ix = ClusterIndex(base, cfg)
    shapes = {
        "1 GPU": (WorkerSpec(1, 1, 4_000, 32 * GI), TopologyRequest()),
        "8 GPUs": (WorkerSpec(1, 8, 8_000, 64 * GI), TopologyRequest()),
        "64 GPUs, Required rack": (
            WorkerSpec(8, 8, 8_000, 64 * GI),
            TopologyRequest("rack", TopologyMode.REQUIRED),
        ),
        "128 GPUs, Preferred": (WorkerSpec(16, 8, 8_000, 64 * GI), TopologyRequest()),
    }
    never = tuple(
        replace(q, preemption=PreemptionPolicy(WithinQueuePreemption.NEVER, ReclaimPreemption.NEVER))
        for q in queues
    )
    out: dict[str, dict[str, float]] = {}
    rnd = random.Random(seed + 2)
    for label, (workers, topo) in shapes.items():
        with_p, without_p, victims = [], [], []
        for t in range(trials):
            team = f"team-{rnd.randrange(QUEUES):02d}"
            for priority, sink in ((5, with_p), (0, without_p)):
                j = Job(f"bench/arrival-{t}-{priority}", team, priority, 50.0, workers, topo)
                # Baseline: the same arrival in queues that may not preempt at all.
                qs = queues if priority else never
                s = Snapshot(TOPOLOGY, node_tuple, qs, (*base.jobs, j))
                ix.apply(s, jobs=[j])
                dt, d = timed(lambda s=s: schedule(s, 100.0, cfg, index=ix))
                sink.append(dt)
                if priority == 5:
                    victims.append(len(d.preempt))
                ix.apply(base, removed_jobs=[j.key])
        out[label] = {
            "p50": pct(with_p, 50),
            "p99": pct(with_p, 99),
            "no_preempt_p50": pct(without_p, 50),
            "victims": statistics.mean(victims),
        }
    return out


def print_rules(n: int, args: argparse.Namespace) -> None:
    r = bench_rules(n, args.rules_cycles, args.seed, args.backlog)
    print(
        f"default rules (attained-service levels, consolidation, locality wait), {args.backlog:,} "
        f"waiting up to 2 days, cluster 97% full, {args.rules_cycles} cycles of one arrival and one "
        f"finish 30 s apart: p50 {ms(r['p50']).strip()}, p99 {ms(r['p99']).strip()}, "
        f"max {ms(r['max']).strip()} (explain=False; {r['admitted']:.0f} admitted, "
        f"{r['preempted']:.0f} preempted, {r['pending']:,.0f} waiting at the end)\n"
        f"  the last cycle without a kept index: {ms(r['fresh']).strip()}; explained "
        f"(every waiting job's reason): {ms(r['explained']).strip()}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default="1024,4096,16384", help="cluster sizes in nodes, comma-separated")
    ap.add_argument("--jobs", type=int, default=5000, help="pending jobs of the full cycle")
    ap.add_argument("--incremental", type=int, default=300, help="incremental cycles per size")
    ap.add_argument("--preempt-trials", type=int, default=20, help="arrivals per preemption shape")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of the full cycle (median)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--backlog", type=int, default=5000, help="waiting jobs of the default-rules case")
    ap.add_argument("--rules-cycles", type=int, default=200, help="cycles of the default-rules case")
    ap.add_argument("--only-rules", action="store_true", help="only the default-rules case")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    cmd = " ".join(["bench/core_bench.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"# gpuq.core benchmark   reproduce: .venv/bin/python {cmd}")
    print(f"# Python {sys.version.split()[0]}; size mix {', '.join(f'{s}:{w:.1%}' for s, w in SIZE_MIX)}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {os.cpu_count()} CPUs, load average {load:.1f} at start (wall-clock figures grow with load)")
    full: dict[int, dict[str, float]] = {}
    incr: dict[int, dict[str, float]] = {}
    for n in sizes:
        if args.only_rules:
            print(f"\n## {n:,} nodes x 8 GPUs")
            print_rules(n, args)
            continue
        full[n] = f = bench_full_cycle(n, args.jobs, args.seed, args.repeat)
        print(
            f"\n## {n:,} nodes x 8 GPUs\n"
            f"full cycle, {args.jobs:,} pending on an empty cluster: {ms(f['time'])} "
            f"(index build {ms(f['index']).strip()}; admitted {f['admitted']:.0f}, "
            f"pending {f['pending']:.0f}, "
            f"{f['util']:.0%} of GPUs placed); peak memory {f['peak_mb']:.1f} MB"
        )
        incr[n] = i = bench_incremental(n, args.incremental, args.seed, baseline_runs=3)
        print(
            f"incremental cycle, {i['util']:.0%} full ({i['running']:,.0f} running jobs), one arrival, "
            f"{args.incremental} cycles: p50 {ms(i['p50']).strip()}, p99 {ms(i['p99']).strip()}, "
            f"max {ms(i['max']).strip()}\n"
            f"  index.apply p50 {ms(i['apply_p50']).strip()}; caller's Snapshot tuple p50 "
            f"{ms(i['snapshot_p50']).strip()}; index peak memory {i['index_peak_mb']:.1f} MB\n"
            f"  baseline without a kept index (rebuilt each cycle): {ms(i['fresh']).strip()} "
            f"-> kept index is {i['fresh'] / i['p50']:.0f}x faster at p50"
        )
        u = bench_incremental(n, args.incremental, args.seed, baseline_runs=1, stuck=True)
        print(
            f"incremental cycle with a never-fitting gang at a queue's head (8 GPUs, 200 CPUs): "
            f"p50 {ms(u['p50']).strip()}, p99 {ms(u['p99']).strip()} -> x{u['p50'] / i['p50']:.2f} "
            f"of the same cycles without it at p50, x{u['p99'] / i['p99']:.2f} at p99"
        )
        print_rules(n, args)
        for label, p in bench_preemption(n, args.preempt_trials, args.seed).items():
            print(
                f"preemption, full cluster, {label:<24} p50 {ms(p['p50']).strip()}, "
                f"p99 {ms(p['p99']).strip()} "
                f"({p['victims']:.1f} victims); same arrival in queues that never preempt "
                f"{ms(p['no_preempt_p50']).strip()} -> search costs {p['p50'] / p['no_preempt_p50']:.1f}x"
            )
    if len(sizes) > 1 and not args.only_rules:
        print("\n## growth with cluster size (measured ratio vs n log n ratio)")
        a = sizes[0]
        for b in sizes[1:]:
            nlogn = (b * math.log(b)) / (a * math.log(a))
            print(
                f"{a:,} -> {b:,} nodes: full cycle x{full[b]['time'] / full[a]['time']:.2f}, "
                f"index build x{full[b]['index'] / full[a]['index']:.2f}, "
                f"incremental p50 x{incr[b]['p50'] / incr[a]['p50']:.2f}, "
                f"peak memory x{full[b]['peak_mb'] / full[a]['peak_mb']:.2f}; n log n x{nlogn:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
