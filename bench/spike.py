"""A traffic spike: --jobs TrainingJobs (default 5,000) created as fast as --threads clients can, on a
local cluster of --nodes kwok nodes (default 1,024 x 8 GPUs), against one `gpuq operator run`.

Prints the submission time, admissions per second over time (5 s buckets, a job counted when all
its pods are bound), submit-to-bound p50/p99 (likewise), the operator's API answers by HTTP code
(429/5xx/no answer are retried by its client; what matters is that every job still gets admitted),
its CPU seconds and peak RSS. The job mix fits the cluster at once (mostly 1 GPU, some 2-GPU and
2x4 gangs), so every job must be admitted; jobs never finish.

The nodes renew their Leases every 10 s (Kubernetes' defaults: lease 40 s, grace 50 s), not the
dev cluster's 1.5 s, so that 1,024 heartbeats do not drown the API server.

Reproduce: .venv/bin/python bench/spike.py [--nodes 1024] [--jobs 5000] [--threads 32]
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from e2e_throughput import (
    NS_GPUQ,
    QUEUE,
    Watcher,
    cpu_seconds,
    create_namespace,
    job_seen,
    peak_rss_mib,
    pod_bound,
    pod_lister,
)
from gpuq import logs
from gpuq.api import meta
from gpuq.controller.objects import parse_time
from gpuq.controller.testing import GpuqClient, OperatorProcess, install_crds
from gpuq.devcluster import Cluster, Shape
from gpuq.devcluster.components import UPSTREAM_TIMING
from gpuq.sim.metrics import percentile

MIX = ((1, 1, 0.85), (1, 2, 0.10), (2, 4, 0.05))  # (replicas, GPUs per worker, share): 1.45 GPUs a job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def api_answers(port: int) -> Counter[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("gpuq_api_requests_total{"):
            code = line.split('code="', 1)[1].split('"', 1)[0]
            out[code] += int(float(line.rsplit(" ", 1)[1]))
    return out


def server_latencies(gpuq: GpuqClient) -> list[float]:
    """Per job, its last pod's creationTimestamp minus the job's: submit-to-bound as the API server
    recorded it, independent of the benchmark's watches (gpuq creates pods with spec.nodeName)."""
    created = {
        j["metadata"]["name"]: parse_time(j["metadata"]["creationTimestamp"])
        for j in gpuq.custom.list_namespaced_custom_object(meta.GROUP, meta.VERSION, NS_GPUQ, "trainingjobs")[
            "items"
        ]
    }
    last: dict[str, float] = {}
    for pod in gpuq.core.list_namespaced_pod(NS_GPUQ).items:
        job = (pod.metadata.labels or {}).get(meta.LABEL_JOB_NAME)
        if job is not None and pod.spec.node_name:
            t = pod.metadata.creation_timestamp.timestamp()
            last[job] = max(last.get(job, 0.0), t)
    return [last[j] - c for j, c in created.items() if j in last and c is not None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=1024, help="kwok nodes x 8 GPUs, racks of 16")
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=32, help="client threads creating the jobs")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for all admissions")
    args = ap.parse_args(argv)
    logs.configure("WARNING")
    cmd = "bench/spike.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"# traffic spike   reproduce: .venv/bin/python {cmd}".rstrip(), flush=True)
    racks = max(1, args.nodes // 16)
    shape = Shape(
        racks=racks, nodes_per_rack=min(16, args.nodes), gpus_per_node=8, blocks=min(4, racks), zones=1
    )
    rng = random.Random(5)
    mix = rng.choices([(r, g) for r, g, _ in MIX], weights=[p for *_, p in MIX], k=args.jobs)
    gpus = sum(r * g for r, g in mix)
    print(f"cluster: {shape.describe()}; {args.jobs} jobs asking {gpus} GPUs", flush=True)
    t0 = time.monotonic()
    name = f"bench-spike-{os.getpid()}"
    dev = Cluster.up(name, shape, timing=UPSTREAM_TIMING, tie_to_process=True, timeout=900)
    print(f"cluster up in {time.monotonic() - t0:.0f} s", flush=True)
    op = None
    try:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(dev.kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
        cfg.connection_pool_maxsize = args.threads + 8
        api = k8s.ApiClient(cfg)
        install_crds(api)
        gpuq = GpuqClient(api)
        create_namespace(gpuq.core, NS_GPUQ)
        gpuq.create_queue(QUEUE, shape.gpu_count)
        port = free_port()
        work = Path(tempfile.mkdtemp(prefix="gpuq-bench-spike-"))
        op = OperatorProcess(
            dev.kubeconfig,
            work / "operator.log",
            log_level="WARNING",
            extra_args=("--metrics-port", str(port)),
        ).start()
        time.sleep(5)  # the operator lists the cluster before the spike
        assert op.proc is not None
        pid, cpu0 = op.proc.pid, cpu_seconds(op.proc.pid)

        def list_jobs(namespace: str, **kw: Any) -> Any:
            return gpuq.custom.list_namespaced_custom_object(
                meta.GROUP, meta.VERSION, namespace, "trainingjobs", **kw
            )

        admitted = Watcher(list_jobs, NS_GPUQ, job_seen(("Admitted", "Running")))
        bound = Watcher(pod_lister(gpuq.core), NS_GPUQ, pod_bound)
        submitted: dict[str, float] = {}

        def submit(item: tuple[int, tuple[int, int]]) -> None:
            i, (replicas, g) = item
            name = f"s{i:05d}"
            submitted[name] = time.monotonic()
            gpuq.submit(NS_GPUQ, name, QUEUE, replicas, g)

        start = time.monotonic()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(submit, enumerate(mix)))
        submit_s = time.monotonic() - start
        print(f"submitted {args.jobs} jobs in {submit_s:.1f} s", flush=True)
        deadline = start + args.timeout
        while time.monotonic() < deadline and len(admitted.first) < args.jobs:
            time.sleep(1)
        want_pods = sum(r for r, _ in mix)
        while time.monotonic() < deadline and len(bound.first) < want_pods:
            time.sleep(1)
        end = time.monotonic()
        cpu = cpu_seconds(pid) - cpu0
        rss = peak_rss_mib(pid)
        answers = api_answers(port)
        server_side = server_latencies(gpuq)
        admitted.stop()
        bound.stop()
    finally:
        if op is not None:
            op.stop()
        dev.down()

    replicas = {f"s{i:05d}": r for i, (r, _) in enumerate(mix)}
    pods_of: dict[str, list[float]] = {}
    for pod, t in bound.first.items():
        pods_of.setdefault(pod.rsplit("-", 2)[0], []).append(t)
    done = {j: max(ts) for j, ts in pods_of.items() if len(ts) >= replicas.get(j, 1 << 30)}
    latency = [done[j] - submitted[j] for j in done]
    last_bound = max(done.values(), default=start) - start
    print(
        f"\nadmitted {len(admitted.first)}/{args.jobs} jobs; all pods bound for {len(done)} jobs, the "
        f"last {last_bound:.0f} s after the first submission (every status written after {end - start:.0f} s)"
    )
    # Timed from the pods: a gang's status follows its pods, up to 10 s later in a burst
    # (gpuq.controller.record), so status times would show the burst's admissions late.
    buckets = Counter(int((t - start) // 5) for t in done.values())
    series = ", ".join(f"{5 * b}-{5 * b + 5}s {n / 5:.0f}" for b, n in sorted(buckets.items()))
    print(f"admissions/s over time (jobs whose whole gang became bound): {series}")
    if latency:
        print(
            f"submit-to-bound: p50 {percentile(latency, 50):.1f} s, p99 {percentile(latency, 99):.1f} s, "
            f"max {max(latency):.1f} s"
        )
    if server_side:
        print(
            f"  the same from the API server's creationTimestamps (gpuq creates its pods bound; 1 s "
            f"resolution): p50 {percentile(server_side, 50):.0f} s, p99 {percentile(server_side, 99):.0f} s, "
            f"max {max(server_side):.0f} s for {len(server_side)} jobs"
        )
    print(
        f"watch relists (a broken watch times objects late): admitted {admitted.relists}, "
        f"bound {bound.relists}"
    )
    errors = {c: n for c, n in answers.items() if not c.startswith("2")}
    print(
        f"operator API answers: {dict(sorted(answers.items()))} "
        f"(non-2xx, retried or handled: {errors or 'none'})"
    )
    print(f"operator CPU {cpu:.0f} s, peak RSS {rss:.0f} MiB")
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
