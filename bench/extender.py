"""Scheduler extender latency: filter and prioritize calls as kube-scheduler makes them (one pod, every
candidate node's name, JSON over HTTP on loopback) against gpuq's extender server, at 1,024 and 4,096
nodes. Beside it, in the same run, a null extender on the same server stack that answers every node
unchanged: the floor of HTTP and JSON, so the ratio shows what gpuq's rules add. Also the cost of
building the extender's view once per scheduling cycle.

The view: nodes in racks of 8, a third of the GPUs used by other schedulers' pods at random, gangs of
2x8 holding a quarter of the nodes (some still binding), 200 pending gangs of mixed shapes.

Reproduce: .venv/bin/python bench/extender.py [--calls 2000] [--nodes 1024,4096]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from typing import Any

import aiohttp
from aiohttp import web

from gpuq import logs
from gpuq.controller.extender import ExtenderServer, filter_result, priority_result
from gpuq.core.extender import ExtenderView, extender_view
from gpuq.core.model import Job, Node, Queue, Resources, Running, Snapshot, Topology, WorkerSpec
from gpuq.sim.metrics import percentile


def snapshot(n: int, seed: int = 1) -> tuple[Snapshot, list[tuple[str, str]]]:
    rng = random.Random(seed)
    nodes = [
        Node(
            f"n{i:05d}",
            Resources(gpus=8, cpu_millis=96_000, memory_bytes=1 << 40),
            (f"z{i // 1024}", f"b{i // 256}", f"r{i // 8}", f"n{i:05d}"),
            used_by_others=Resources(gpus=rng.choice((0, 0, 1, 2, 4, 7))),
        )
        for i in range(n)
    ]
    jobs, bound = [], []
    for j in range(n // 8):
        a, b = nodes[(8 * j) % n].name, nodes[(8 * j + 1) % n].name
        key = f"ns/run-{j}"
        jobs.append(Job(key, "q", 0, 0.0, WorkerSpec(2, 8), running=Running((a, b), 0.0)))
        if j % 10:  # one gang in ten is still binding
            bound += [(key, a), (key, b)]
    for j in range(200):
        r, g = rng.choice(((1, 1), (1, 4), (2, 8), (4, 8), (8, 8)))
        jobs.append(Job(f"ns/wait-{j}", "q", 0, float(j), WorkerSpec(r, g)))
    return Snapshot(Topology(), tuple(nodes), (Queue("q", 10**6),), tuple(jobs)), bound


def body(names: list[str]) -> dict[str, Any]:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def null_app() -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        args = await request.json()
        if request.path == "/filter":
            return web.json_response(
                {"Nodes": None, "NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""}
            )
        return web.json_response([{"Host": n, "Score": 0} for n in args["NodeNames"]])

    app = web.Application()
    app.router.add_post("/filter", echo)
    app.router.add_post("/prioritize", echo)
    return app


async def timed_calls(app: web.Application, payload: dict[str, Any], calls: int) -> dict[str, list[float]]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    out: dict[str, list[float]] = {"/filter": [], "/prioritize": []}
    async with aiohttp.ClientSession() as session:
        for i in range(calls):
            path = "/filter" if i % 2 == 0 else "/prioritize"
            t0 = time.perf_counter()
            async with session.post(f"http://127.0.0.1:{port}{path}", json=payload) as resp:
                await resp.read()
            out[path].append((time.perf_counter() - t0) * 1000)
    await runner.cleanup()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="calls per size (half filter, half prioritize)")
    p.add_argument("--nodes", default="1024,4096")
    args = p.parse_args()
    logs.configure("WARNING")
    head = ("nodes", "call", "gpuq p50", "gpuq p99", "null p50", "null p99", "ratio p99")
    print(f"{head[0]:>6} {head[1]:>11} " + " ".join(f"{h:>9}" for h in head[2:]))
    for n in (int(x) for x in args.nodes.split(",")):
        snap, bound = snapshot(n)
        t0 = time.perf_counter()
        for _ in range(20):
            view: ExtenderView = extender_view(snap, bound)
        build_ms = (time.perf_counter() - t0) / 20 * 1000
        payload = body([nd.name for nd in snap.nodes])
        rules = {"/filter": [], "/prioritize": []}  # type: dict[str, list[float]]
        for _ in range(200):
            for path, fn in (("/filter", filter_result), ("/prioritize", priority_result)):
                t1 = time.perf_counter()
                fn(view, payload)
                rules[path].append((time.perf_counter() - t1) * 1000)
        gpuq = asyncio.run(
            timed_calls(ExtenderServer("127.0.0.1", 0, lambda v=view: v).app(), payload, args.calls)
        )
        null = asyncio.run(timed_calls(null_app(), payload, args.calls))
        for path in ("/filter", "/prioritize"):
            g, z = gpuq[path], null[path]
            print(
                f"{n:>6} {path:>11} {statistics.median(g):>8.2f}ms {percentile(g, 99):>8.2f}ms "
                f"{statistics.median(z):>8.2f}ms {percentile(z, 99):>8.2f}ms "
                f"{percentile(g, 99) / percentile(z, 99):>8.2f}x"
            )
        print(
            f"{n:>6} rules alone: filter p99 {percentile(rules['/filter'], 99):.2f} ms, prioritize p99 "
            f"{percentile(rules['/prioritize'], 99):.2f} ms; view built once per cycle in {build_ms:.1f} ms"
        )
    print(f"\nreproduce: .venv/bin/python bench/extender.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
