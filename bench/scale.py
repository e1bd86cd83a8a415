"""The operator's memory and cycle time at scale: 10,000 nodes and 100,000 pods in its cache.

What runs: a child process holds the operator's real ClusterCache, fed the way its informers feed it
(`ClusterCache.replace` with API-shaped bodies, i.e. a recorded list replayed into the same cache
code; no API server: one with 10k nodes and 100k pods does not fit this machine beside the rest),
and the real SchedulingLoop with its kept core index. Its writer records the writes a cycle dispatches
instead of sending them (so figures are the cycle's own compute, not API latency). Then:
  - the first cycle (a new leader's: every job's lifecycle, the index built);
  - incremental cycles, each after a few watch events: a 1-GPU job arrives (the cycle admits it; it
    is deleted after the cycle, so every cycle starts from the same state) and a running worker's
    pod reports a checkpoint;
  - the child's peak RSS (VmHWM) after all of it, and the RSS of an empty interpreter with the same
    imports as the baseline.
The cluster: racks of 16 nodes x 8 GPUs, 6 GPUs a node held by 1-GPU workers of 4-rank gangs, the
rest of the pods foreign (bound CPU pods of other schedulers, counted against node capacity).

Each cycle's time inside the core (gpuq.core.schedule on the kept index) is measured too, so the
share spent outside it (the shell: snapshot, lifecycles, status, metrics) is printed beside it. A
second child times a cold start: the lists an operator gets after a restart (as JSON, decoded and
replayed into an empty cache) up to its first decision; a third a takeover: a standby whose cache
is current lists everything again for its new term (the same versions) and makes its first cycle.

Shapes (issue 31): `--nodes 16384`; `--queues 1000 --jobs 50000` (Kueue's large-scale shape: 1,000
queues in cohorts of `--cohort-size`, each with the nominal quota its running gangs use, so the
jobs beyond the cluster's slots wait on quota). `--verify` runs every cycle in the debug mode
(GPUQ_VERIFY_SNAPSHOT=1: each build checked against a fresh builder, each cycle's decisions against
a fresh index; slow). `--profile N` prints where N incremental cycles spend their time (cProfile).

Reproduce: .venv/bin/python bench/scale.py [--nodes 10000] [--pods 100000] [--cycles 200]
  [--queues 1 --jobs N --cohort-size 10] [--no-cold-start] [--verify] [--profile N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuq.sim.metrics import percentile

WORKERS = 4  # ranks per gang
GPU_PODS_PER_NODE = 6  # 1-GPU workers on each node (of 8 GPUs)


def rss_mib(field: str = "VmHWM") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


KINDS = ("namespace", "node", "queue", "job", "pod")
PAGE = 500  # objects a list page holds (the informer's limit, gpuq.controller.kubeapi.list_pages)


@dataclass(frozen=True)
class Shape:
    nodes: int = 10_000
    pods: int = 100_000
    queues: int = 1  # 1: one queue "q" holding the whole cluster (the default run)
    jobs: int | None = None  # None: as many running gangs as the pods allow, and no more
    cohort_size: int = 10

    def queue_of(self, g: int) -> str:
        return "q" if self.queues == 1 else f"q-{g % self.queues:04d}"


def build_bodies(shape: Shape) -> dict[str, list[dict[str, Any]]]:
    from gpuq.controller import bodies as b

    nodes, pods = shape.nodes, shape.pods
    names = [f"node-{i:05d}" for i in range(nodes)]
    node_bodies = [
        b.node(n, rack=f"rack-{i // 16}", block=f"block-{i // 256}", zone=f"zone-{i // 4096}")
        for i, n in enumerate(names)
    ]
    slots = [n for n in names for _ in range(GPU_PODS_PER_NODE)]
    gangs = min(len(slots), pods) // WORKERS
    jobs, pod_bodies = [], []
    used: dict[str, int] = {}
    for g in range(gangs if shape.jobs is None else min(gangs, shape.jobs)):
        placed = slots[g * WORKERS : (g + 1) * WORKERS]
        name = f"job-{g:06d}"
        ns = f"team-{g % 8}"
        queue = shape.queue_of(g)
        used[queue] = used.get(queue, 0) + WORKERS
        status = b.placed_status(placed)
        jobs.append(b.job(name, ns=ns, queue_name=queue, replicas=WORKERS, gpus=1, status=status))
        for r, n in enumerate(placed):
            pod_bodies.append(b.pod(f"{name}-1-{r}", ns, n, "Running", name, 1, r, gpus=1))
    for g in range(len(jobs), shape.jobs or 0):  # waiting: their queues' quota is all in use
        queue = shape.queue_of(g)
        jobs.append(b.job(f"job-{g:06d}", ns=f"team-{g % 8}", queue_name=queue, replicas=WORKERS, gpus=1))
    for i in range(pods - len(pod_bodies)):
        node, other = names[i % nodes], "default-scheduler"
        pod_bodies.append(b.pod(f"web-{i:06d}", "web", node, "Running", gpus=0, scheduler=other))
    if shape.queues == 1:
        queues = [b.queue("q", nominal=nodes * 8)]
    else:
        queues = [
            b.queue(q, nominal=used.get(q, 0), cohort=f"cohort-{i // shape.cohort_size:03d}")
            for i, q in enumerate(shape.queue_of(i) for i in range(shape.queues))
        ]
    namespaces = [b.namespace(f"team-{i}") for i in range(8)] + [b.namespace("web")]
    return {"node": node_bodies, "queue": queues, "namespace": namespaces, "job": jobs, "pod": pod_bodies}


def job_body(shape: Shape, key: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A TrainingJob of the bench, as the API server would return it (by its key)."""
    from gpuq.controller import bodies as b

    ns, name = key.split("/")
    kind, _, n = name.partition("-")
    replicas = WORKERS if kind == "job" else 1
    return b.job(name, ns=ns, queue_name=shape.queue_of(int(n)), replicas=replicas, gpus=1, status=status)


def _loop(
    cache: Any, now: Callable[[], float], shape: Shape, queues: dict[str, dict[str, Any]]
) -> tuple[Any, Any]:
    """The real SchedulingLoop over `cache`, with a writer that records what a cycle hands it
    instead of writing; the status writes of waiting and blocked jobs land in the cache between
    cycles (`land`, untimed), as their watch events would."""
    from gpuq.controller.loop import SchedulingLoop
    from gpuq.controller.metrics import Metrics
    from gpuq.controller.objects import JobEntry, parse_job
    from gpuq.controller.writer import Writer
    from gpuq.core import SchedulerConfig

    class RecordingWriter(Writer):
        dispatched = 0
        landing: list[Any] = []

        def submit(self, key: str, work: Any, minor: bool = False) -> bool:
            self.dispatched += 1
            if getattr(work, "func", None) in (loop._patch, loop._patch_queue):
                self.landing.append(work)
            return True

        async def patch_queue_status(self, name: str, patch: dict[str, Any]) -> None:
            q = self.cache.queues[name]
            status = q.status.model_dump(by_alias=True, exclude_none=True, mode="json")
            status.update(patch)
            body = {**queues[name], "status": {k: v for k, v in status.items() if v is not None}}
            body["metadata"] = {
                **body["metadata"],
                "resourceVersion": str(int(body["metadata"]["resourceVersion"]) + 1),
            }
            queues[name] = body
            self.cache.upsert_queue(body)

        async def object_event(self, *args: Any, **kwargs: Any) -> None:
            return None

        async def patch_job_status(
            self, job: JobEntry, patch: dict[str, Any], routine: bool = False
        ) -> JobEntry:
            status = job.status.model_dump(by_alias=True, exclude_none=True, mode="json")
            status.update(patch)
            body = job_body(shape, job.key, {k: v for k, v in status.items() if v is not None})
            self.cache.upsert_job(body)
            return parse_job(body)

        async def event(self, job: JobEntry, ev: Any) -> None:
            return None

        async def land(self) -> None:
            work, self.landing = self.landing, []
            for w in work:
                await w()

    metrics = Metrics()
    writer = RecordingWriter(None, cache, metrics, on_done=lambda: None)  # type: ignore[arg-type]
    loop = SchedulingLoop(cache, writer, SchedulerConfig(), metrics, clock=now, freeze_first_cycle=True)
    return loop, writer


def _timed_core(loop: Any, spent: list[float]) -> None:
    """Record the time each cycle spends in the core (SchedulingLoop._core: gpuq.core.schedule)."""
    core = loop._core

    def timed(prep: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return core(prep)
        finally:
            spent.append(time.perf_counter() - t0)

    loop._core = timed


async def child(shape: Shape, cycles: int, profile: int = 0) -> dict[str, Any]:
    from gpuq.controller import bodies as b
    from gpuq.controller.cache import ClusterCache

    baseline_rss = rss_mib("VmRSS")
    t0 = time.perf_counter()
    objects = build_bodies(shape)
    t_bodies = time.perf_counter() - t0
    running = sum(1 for j in objects["job"] if j.get("status"))

    cache = ClusterCache()
    t0 = time.perf_counter()
    for kind in KINDS:
        cache.replace(kind, objects[kind], "1")
    t_load = time.perf_counter() - t0
    queues = {q["metadata"]["name"]: q for q in objects["queue"]}
    n_pods = len(objects["pod"])
    del objects
    gc.collect()
    gc.freeze()  # as the operator does once its first lists are in (gpuq.controller.operator)
    now = b.T0 + 1000
    loop, writer = _loop(cache, lambda: now, shape, queues)
    t0, c0 = time.perf_counter(), time.process_time()
    loop.cycle()
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    first_writes = writer.dispatched
    await writer.land()
    settling = 0  # cycles that only see the first cycle's status writes land (untimed)
    while settling < 5 and writer.dispatched > first_writes // 10 + 10:
        settling += 1
        now += 1.0
        writer.dispatched = 0
        loop.cycle()
        await writer.land()
    writer.dispatched = first_writes
    times: list[float] = []
    writes: list[int] = []
    core: list[float] = []
    _timed_core(loop, core)
    handed_before = getattr(loop.schedule, "handed", 0)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    for i in range(cycles):
        now += 1.0
        arrival = b.job(f"new-{i:05d}", ns="team-0", queue_name=shape.queue_of(i), replicas=1, gpus=1)
        cache.upsert_job(arrival)
        g = (i * 7919) % (running - 1)
        ckpt = {"gpuq.dev/checkpoint": json.dumps({"step": i, "time": b.iso(now), "path": f"/ck/{i}"})}
        pod = b.pod(f"job-{g:06d}-1-0", f"team-{g % 8}", "node-00000", "Running", f"job-{g:06d}", gpus=1)
        pod["metadata"]["annotations"] = ckpt
        cache.upsert_pod(pod)
        before = writer.dispatched
        if profiler is not None and i < profile:
            profiler.enable()
        t0 = time.perf_counter()
        loop.cycle()
        times.append(time.perf_counter() - t0)
        if profiler is not None:
            profiler.disable()
        writes.append(writer.dispatched - before)
        await writer.land()
        cache.delete_job(arrival)  # admitted and done: the next cycle starts from the same state
    if profiler is not None:
        import pstats

        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    outside = [(t - c) / t for t, c in zip(times, core, strict=True)]
    return {
        "nodes": len(cache.nodes),
        "pods": n_pods,
        "jobs": len(cache.jobs),
        "queues": len(cache.queues),
        "bodies_s": t_bodies,
        "load_s": t_load,
        "first_cycle_s": first,
        "first_cycle_cpu_s": first_cpu,
        "first_writes": first_writes,
        "settling": settling,
        "p50": percentile(times, 50),
        "p99": percentile(times, 99),
        "max": max(times),
        "core_p50": percentile(core, 50),
        "core_p99": percentile(core, 99),
        "outside_p50": percentile(outside, 50),
        "outside_min": min(outside),
        "handed": getattr(loop.schedule, "handed", 0) - handed_before,
        "writes_per_cycle": sum(writes) / len(writes),
        "rss_peak_mib": rss_mib(),
        "rss_baseline_mib": baseline_rss,
    }


def _listed_pages(shape: Shape) -> tuple[dict[str, list[bytes]], dict[str, Any]]:
    """Every kind's list as the API server sends it (JSON pages of PAGE objects), and the queues."""
    objects = build_bodies(shape)
    queues = {q["metadata"]["name"]: q for q in objects["queue"]}
    pages = {
        kind: [json.dumps(items[i : i + PAGE]).encode() for i in range(0, len(items), PAGE)]
        for kind, items in objects.items()
    }
    return pages, queues


def _replay(cache: Any, pages: dict[str, list[bytes]]) -> None:
    """The lists into the cache as the informers apply them: each page decoded and applied as it
    arrives, what no page had dropped at the end (gpuq.controller.informer)."""
    for kind in KINDS:
        listed: set[str] = set()
        for page in pages[kind]:
            cache.list_page(kind, json.loads(page), listed)
        cache.list_done(kind, listed, "1")


async def cold_start(shape: Shape) -> dict[str, Any]:
    """An operator restarted: every list (JSON pages, as the API server sends them) decoded and
    replayed into an empty cache, then the first cycle: the time to its first decision."""
    from gpuq.controller.cache import ClusterCache

    pages, queues = _listed_pages(shape)
    gc.collect()
    t0 = time.perf_counter()
    cache = ClusterCache()
    _replay(cache, pages)
    del pages
    gc.freeze()  # as the operator does once its first lists are in
    return {**_first_decision(cache, shape, queues, t0), "rss_peak_mib": rss_mib()}


async def takeover(shape: Shape) -> dict[str, Any]:
    """A standby replica taking over: its informers kept its cache current (the lists replayed once,
    untimed), then the new term lists every kind again (gpuq.controller.operator's fresh_lists: the
    same versions, decoded and replayed) and a new loop makes its first cycle."""
    from gpuq.controller.cache import ClusterCache

    pages, queues = _listed_pages(shape)
    cache = ClusterCache()
    _replay(cache, pages)
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    _replay(cache, pages)
    return _first_decision(cache, shape, queues, t0)


def _first_decision(cache: Any, shape: Shape, queues: dict[str, Any], t0: float) -> dict[str, float]:
    """A new loop's first cycle on the listed cache; the lists took from `t0` until now."""
    from gpuq.controller import bodies as b

    listed = time.perf_counter() - t0
    loop, _ = _loop(cache, lambda: b.T0 + 1000, shape, queues)
    t1 = time.perf_counter()
    loop.cycle()
    done = time.perf_counter()
    return {"listed_s": listed, "first_cycle_s": done - t1, "total_s": done - t0}


def pod_cost(pods: int) -> dict[str, Any]:
    """What one pod costs the cache: `pods` pods (a tenth of them gpuq's workers) listed as JSON,
    decoded and replayed, the list dropped; tracemalloc's count of what stays, per pod, by line."""
    import tracemalloc

    from gpuq.controller.cache import ClusterCache

    objects = build_bodies(Shape(nodes=max(1, pods // 10), pods=pods))
    cache = ClusterCache()
    for kind in ("namespace", "node", "queue", "job"):
        cache.replace(kind, objects[kind], "1")
    listed, n = json.dumps(objects["pod"]).encode(), len(objects["pod"])
    del objects
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    items = json.loads(listed)
    cache.replace("pod", items, "1")
    del items
    gc.collect()
    diff = tracemalloc.take_snapshot().compare_to(before, "lineno")
    top = [(str(d.traceback), d.size_diff / n) for d in diff[:8]]
    return {"pods": n, "bytes": sum(d.size_diff for d in diff) / n, "top": top}


def _run_child(args: argparse.Namespace, *extra: str) -> dict[str, Any] | None:
    shape = [f"--{k.replace('_', '-')}={v}" for k, v in asdict(_shape(args)).items() if v is not None]
    env = {**os.environ, **({"GPUQ_VERIFY_SNAPSHOT": "1"} if args.verify else {})}
    cmd = [
        sys.executable,
        __file__,
        "--child",
        *shape,
        f"--cycles={args.cycles}",
        f"--profile={args.profile}",
        *extra,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if args.profile:
        sys.stderr.write(done.stderr)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return None
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _shape(args: argparse.Namespace) -> Shape:
    return Shape(args.nodes, args.pods, args.queues, args.jobs, args.cohort_size)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--pods", type=int, default=100_000)
    ap.add_argument("--queues", type=int, default=1, help="GPUQueues (more than 1: in cohorts)")
    ap.add_argument("--jobs", type=int, default=None, help="TrainingJobs (beyond the running gangs: waiting)")
    ap.add_argument("--cohort-size", type=int, default=10, help="queues per cohort")
    ap.add_argument("--cycles", type=int, default=200, help="incremental cycles measured")
    ap.add_argument(
        "--no-cold-start", action="store_true", help="skip the cold start's and the takeover's children"
    )
    ap.add_argument("--verify", action="store_true", help="debug mode: every cycle checked (slow)")
    ap.add_argument("--profile", type=int, default=0, help="cProfile this many incremental cycles")
    ap.add_argument("--pod-cost", type=int, default=0, help="only measure what N cached pods cost")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--takeover", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        from gpuq import logs
        from gpuq.controller.cache import GC_THRESHOLDS

        logs.configure("ERROR")
        gc.set_threshold(*GC_THRESHOLDS)  # the operator's collector settings (run_operator)
        if args.cold:
            work = cold_start(_shape(args))
        elif args.takeover:
            work = takeover(_shape(args))
        else:
            work = child(_shape(args), args.cycles, args.profile)
        sys.stdout.write(json.dumps(asyncio.run(work)) + "\n")
        return 0
    if args.pod_cost:
        c = pod_cost(args.pod_cost)
        print(f"{c['pods']:,} pods listed as JSON and replayed: the cache keeps {c['bytes']:.0f} bytes a pod")
        for where, size in c["top"]:
            print(f"  {size:6.0f} B/pod  {where}")
        return 0
    given = argv if argv is not None else sys.argv[1:]
    cmd = ".venv/bin/python " + ("bench/scale.py " + shlex.join(given)).rstrip()
    print(f"# operator at scale   reproduce: {cmd}", flush=True)
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    r = _run_child(args)
    if r is None:
        return 1
    print(
        f"cache: {r['nodes']:,} nodes, {r['pods']:,} pods, {r['jobs']:,} TrainingJobs "
        f"(bodies built in {r['bodies_s']:.1f} s, replayed into the cache in {r['load_s']:.1f} s)"
    )
    first = f"{r['first_cycle_s'] * 1e3:.0f} ms, {r['first_writes']} writes"
    print(f"first cycle (every lifecycle, index built): {first}")
    print(
        f"incremental cycle, one arrival + one pod event each, {args.cycles} cycles: "
        f"p50 {r['p50'] * 1e3:.1f} ms, p99 {r['p99'] * 1e3:.1f} ms, max {r['max'] * 1e3:.1f} ms; "
        f"{r['writes_per_cycle']:.1f} writes dispatched a cycle"
    )
    print(
        f"peak RSS {r['rss_peak_mib']:.0f} MiB (interpreter with gpuq imported: "
        f"{r['rss_baseline_mib']:.0f} MiB)"
    )
    _print_more(args, r, cmd)
    return 0


def _print_more(args: argparse.Namespace, r: dict[str, Any], cmd: str) -> None:
    """The figures beside the default run's three: the core's own, the shell's share, the shape,
    the debug mode's verdict, the cold start and the takeover; each with the command that prints it."""
    print(
        f"  the first cycle's CPU time: {r['first_cycle_cpu_s'] * 1e3:.0f} ms (on a shared machine its "
        f"wall time above also counts other processes' turns on the CPUs)   [{cmd}]"
    )
    print(
        f"  the core alone in those cycles (gpuq.core.schedule on the kept index): p50 "
        f"{r['core_p50'] * 1e3:.1f} ms, p99 {r['core_p99'] * 1e3:.1f} ms; the operator's p99 is "
        f"{r['p99'] / max(r['core_p99'], 1e-9):.1f}x it"
    )
    print(
        f"  spent outside the core: {r['outside_p50']:.0%} of a cycle (median), at least "
        f"{r['outside_min']:.0%}; the core's index took the builder's delta in {r['handed']} of "
        f"{args.cycles} cycles   [{cmd}]"
    )
    if args.queues > 1:
        settled = f"; {r['settling']} untimed cycles first, while the first's status writes landed"
        print(f"  {r['queues']:,} queues in cohorts of {args.cohort_size}{settled}   [{cmd}]")
    if args.verify:
        print(
            f"  debug mode (GPUQ_VERIFY_SNAPSHOT=1): every build equal to a fresh builder's and "
            f"every cycle's decisions to a fresh index's, {args.cycles} cycles   [{cmd}]"
        )
    if not args.no_cold_start:
        c = _run_child(args, "--cold")
        if c is not None:
            print(
                f"cold start (restarted: lists decoded and replayed {c['listed_s']:.1f} s, first "
                f"cycle {c['first_cycle_s'] * 1e3:.0f} ms): first decision after {c['total_s']:.1f} s, "
                f"peak RSS {c['rss_peak_mib']:.0f} MiB   [{cmd}]"
            )
        t = _run_child(args, "--takeover")
        if t is not None:
            print(
                f"takeover by a warm standby (fresh lists decoded and replayed {t['listed_s']:.1f} s, "
                f"first cycle {t['first_cycle_s'] * 1e3:.0f} ms): first decision after "
                f"{t['total_s']:.1f} s   [{cmd}]"
            )
    print(f"\nreproduce: {cmd}")


if __name__ == "__main__":
    sys.exit(main())
