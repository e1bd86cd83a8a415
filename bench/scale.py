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

Reproduce: .venv/bin/python bench/scale.py [--nodes 10000] [--pods 100000] [--cycles 200]
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


def build_bodies(nodes: int, pods: int) -> dict[str, list[dict[str, Any]]]:
    from gpuq.controller import bodies as b

    names = [f"node-{i:05d}" for i in range(nodes)]
    node_bodies = [
        b.node(n, rack=f"rack-{i // 16}", block=f"block-{i // 256}", zone=f"zone-{i // 4096}")
        for i, n in enumerate(names)
    ]
    slots = [n for n in names for _ in range(GPU_PODS_PER_NODE)]
    gangs = min(len(slots), pods) // WORKERS
    jobs, pod_bodies = [], []
    for g in range(gangs):
        placed = slots[g * WORKERS : (g + 1) * WORKERS]
        name = f"job-{g:06d}"
        ns = f"team-{g % 8}"
        jobs.append(b.job(name, ns=ns, replicas=WORKERS, gpus=1, status=b.placed_status(placed)))
        for r, n in enumerate(placed):
            pod_bodies.append(b.pod(f"{name}-1-{r}", ns, n, "Running", name, 1, r, gpus=1))
    for i in range(pods - len(pod_bodies)):
        node, other = names[i % nodes], "default-scheduler"
        pod_bodies.append(b.pod(f"web-{i:06d}", "web", node, "Running", gpus=0, scheduler=other))
    queues = [b.queue("q", nominal=nodes * 8)]
    namespaces = [b.namespace(f"team-{i}") for i in range(8)] + [b.namespace("web")]
    return {"node": node_bodies, "queue": queues, "namespace": namespaces, "job": jobs, "pod": pod_bodies}


async def child(nodes: int, pods: int, cycles: int) -> dict[str, Any]:
    from gpuq.controller import bodies as b
    from gpuq.controller.cache import ClusterCache
    from gpuq.controller.loop import SchedulingLoop
    from gpuq.controller.metrics import Metrics
    from gpuq.controller.writer import Writer
    from gpuq.core import SchedulerConfig

    baseline_rss = rss_mib("VmRSS")
    t0 = time.perf_counter()
    objects = build_bodies(nodes, pods)
    t_bodies = time.perf_counter() - t0

    class RecordingWriter(Writer):
        def submit(self, key: str, work: Any, minor: bool = False) -> bool:
            self.dispatched += 1
            return True

    cache = ClusterCache()
    t0 = time.perf_counter()
    for kind in ("namespace", "node", "queue", "job", "pod"):
        cache.replace(kind, objects[kind], "1")
    t_load = time.perf_counter() - t0
    n_pods = len(objects["pod"])
    del objects
    gc.collect()
    metrics = Metrics()
    writer = RecordingWriter(None, cache, metrics, on_done=lambda: None)  # type: ignore[arg-type]
    writer.dispatched = 0  # type: ignore[attr-defined]
    now = b.T0 + 1000
    loop = SchedulingLoop(cache, writer, SchedulerConfig(), metrics, clock=lambda: now)
    t0 = time.perf_counter()
    loop.cycle()
    first = time.perf_counter() - t0
    first_writes = writer.dispatched  # type: ignore[attr-defined]
    times, writes = [], []
    for i in range(cycles):
        now += 1.0
        arrival = b.job(f"new-{i:05d}", ns="team-0", replicas=1, gpus=1)
        cache.upsert_job(arrival)
        g = (i * 7919) % (len(cache.jobs) - 1)
        ckpt = {"gpuq.dev/checkpoint": json.dumps({"step": i, "time": b.iso(now), "path": f"/ck/{i}"})}
        pod = b.pod(f"job-{g:06d}-1-0", f"team-{g % 8}", "node-00000", "Running", f"job-{g:06d}", gpus=1)
        pod["metadata"]["annotations"] = ckpt
        cache.upsert_pod(pod)
        before = writer.dispatched  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        loop.cycle()
        times.append(time.perf_counter() - t0)
        writes.append(writer.dispatched - before)  # type: ignore[attr-defined]
        cache.delete_job(arrival)  # admitted and done: the next cycle starts from the same state
    return {
        "nodes": len(cache.nodes),
        "pods": n_pods,
        "jobs": len(cache.jobs),
        "bodies_s": t_bodies,
        "load_s": t_load,
        "first_cycle_s": first,
        "first_writes": first_writes,
        "p50": percentile(times, 50),
        "p99": percentile(times, 99),
        "max": max(times),
        "writes_per_cycle": sum(writes) / len(writes),
        "rss_peak_mib": rss_mib(),
        "rss_baseline_mib": baseline_rss,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--pods", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=200, help="incremental cycles measured")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        from gpuq import logs

        logs.configure("ERROR")
        out = asyncio.run(child(args.nodes, args.pods, args.cycles))
        sys.stdout.write(json.dumps(out) + "\n")
        return 0
    cmd = "bench/scale.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"# operator at scale   reproduce: .venv/bin/python {cmd}".rstrip(), flush=True)
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    child_argv = [sys.executable, __file__, "--child", "--nodes", str(args.nodes), "--pods", str(args.pods)]
    done = subprocess.run([*child_argv, "--cycles", str(args.cycles)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    r = json.loads(done.stdout.strip().splitlines()[-1])
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
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
