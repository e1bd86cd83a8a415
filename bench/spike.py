"""A traffic spike: --jobs TrainingJobs (default 5,000) created as fast as --threads clients can, on a
local cluster of --nodes kwok nodes (default 1,024 x 8 GPUs), against one `gpuq operator run`; then,
on the same cluster once gpuq's jobs are gone, the same mix as a Kueue user submits it: Indexed Jobs
with the queue-name label through Kueue v0.17.0's manager with TAS (built by hack/kueue.sh; its
webhooks on every create), the Job controller and kube-scheduler (`--no-kueue` skips it).

Prints the submission time, admissions per second over time (5 s buckets, a job counted when all
its pods are bound), submit-to-bound p50/p99 (likewise), the operator's API answers by HTTP code
(429/5xx/no answer are retried by its client; what matters is that every job still gets admitted),
its CPU seconds and peak RSS. The job mix fits the cluster at once (mostly 1 GPU, some 2-GPU and
2x4 gangs), so every job must be admitted; jobs never finish.

Kueue's manager gets the client budget of the cluster's own controllers, 200 qps / burst 400
(its default, 50/100, would hold it back and flatter gpuq), as does gpuq by default.

The nodes renew their Leases every 10 s (Kubernetes' defaults: lease 40 s, grace 50 s), not the
dev cluster's 1.5 s, so that 1,024 heartbeats do not drown the API server.

Reproduce: .venv/bin/python bench/spike.py [--nodes 1024] [--jobs 5000] [--threads 32] [--no-kueue]
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from e2e_throughput import (
    NS_GPUQ,
    QUEUE,
    KueuePath,
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
from gpuq.devcluster import Cluster, Shape, ensure_binaries
from gpuq.devcluster.components import UPSTREAM_TIMING
from gpuq.peers.kueue_binaries import KueueBuild, ensure_kueue
from gpuq.peers.kueue_stack import BENCH_CLIENT, KueueStack
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


def spike_gpuq(
    dev: Cluster,
    gpuq: GpuqClient,
    gpus: int,
    mix: list[tuple[int, int]],
    threads: int,
    timeout: float,
) -> dict[str, Any]:
    """The spike through `gpuq operator run`: TrainingJobs created as fast as `threads` clients can."""
    create_namespace(gpuq.core, NS_GPUQ)
    gpuq.create_queue(QUEUE, gpus)
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="gpuq-bench-spike-"))
    op = OperatorProcess(
        dev.kubeconfig,
        work / "operator.log",
        log_level="WARNING",
        extra_args=("--metrics-port", str(port)),
        tie_to_parent=True,
    ).start()
    try:
        time.sleep(5)  # the operator lists the cluster before the spike
        assert op.proc is not None
        pid, cpu0 = op.proc.pid, cpu_seconds(op.proc.pid)

        def list_jobs(namespace: str, **kw: Any) -> Any:
            return gpuq.custom.list_namespaced_custom_object(
                meta.GROUP, meta.VERSION, namespace, "trainingjobs", **kw
            )

        admitted = Watcher(list_jobs, NS_GPUQ, job_seen(("Admitted", "Running")))
        out = run_spike(gpuq.core, NS_GPUQ, mix, threads, timeout,
                        lambda name, r, g: gpuq.submit(NS_GPUQ, name, QUEUE, r, g))  # fmt: skip
        out["status_s"] = max(admitted.first.values(), default=out["start"]) - out["start"]
        out["statuses"] = len(admitted.first)
        out["cpu"] = cpu_seconds(pid) - cpu0
        out["rss"] = peak_rss_mib(pid)
        out["answers"] = api_answers(port)
        out["server"] = server_latencies(gpuq)
        admitted.stop()
    finally:
        op.stop()
    gpuq.clear_namespace(NS_GPUQ, timeout=600)  # its GPUs, for the Kueue spike
    return out


def spike_kueue(
    dev: Cluster,
    api: k8s.ApiClient,
    build: KueueBuild,
    gpus: int,
    mix: list[tuple[int, int]],
    threads: int,
    timeout: float,
) -> dict[str, Any]:
    """The spike as a Kueue user lives it: the same mix as Indexed Jobs with the queue-name label,
    created as fast as `threads` clients can (each create goes through Kueue's webhooks), Kueue with
    TAS admitting them, the Job controller creating the pods and kube-scheduler binding them."""
    ns = "bench-kueue"
    create_namespace(k8s.CoreV1Api(api), ns)
    stack = KueueStack(
        build,
        ensure_binaries() / "kubectl",
        dev.kubeconfig,
        Path(tempfile.mkdtemp(prefix="gpuq-bench-spike-kueue-")),
        config=BENCH_CLIENT,
    )
    path = KueuePath(api, stack, ns, gpus, held=False)
    path.up()
    try:
        return run_spike(path.core, ns, mix, threads, timeout, path.submit)
    finally:
        # The last phase: the cluster goes next, so only the manager is stopped (deleting 5,000
        # Jobs in one call outlasts the API server's request timeout and would lose the figures).
        stack.down()


def run_spike(
    core: k8s.CoreV1Api,
    ns: str,
    mix: list[tuple[int, int]],
    threads: int,
    timeout: float,
    submit_one: Callable[[str, int, int], None],
) -> dict[str, Any]:
    """Submit the mix from `threads` clients at once; per job, submit-to-bound (its whole gang)."""
    bound = Watcher(pod_lister(core), ns, pod_bound)
    submitted: dict[str, float] = {}

    def submit(item: tuple[int, tuple[int, int]]) -> None:
        i, (replicas, g) = item
        name = f"s{i:05d}"
        submitted[name] = time.monotonic()
        submit_one(name, replicas, g)

    start = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(submit, enumerate(mix)))
    submit_s = time.monotonic() - start
    print(f"  submitted {len(mix)} jobs in {submit_s:.1f} s", flush=True)
    want_pods = sum(r for r, _ in mix)
    deadline = start + timeout
    while time.monotonic() < deadline and len(bound.first) < want_pods:
        time.sleep(1)
    bound.stop()
    replicas = {f"s{i:05d}": r for i, (r, _) in enumerate(mix)}
    pods_of: dict[str, list[float]] = {}
    for pod, t in bound.first.items():
        pods_of.setdefault(pod.rsplit("-", 2)[0], []).append(t)
    done = {j: max(ts) for j, ts in pods_of.items() if len(ts) >= replicas.get(j, 1 << 30)}
    return {
        "start": start,
        "submit_s": submit_s,
        "done": done,
        "latency": [done[j] - submitted[j] for j in done],
        "relists": bound.relists,
    }


def report(label: str, jobs: int, r: dict[str, Any]) -> None:
    done, latency, start = r["done"], r["latency"], r["start"]
    last_bound = max(done.values(), default=start) - start
    print(
        f"\n{label}: submitted {jobs} jobs in {r['submit_s']:.1f} s; all pods bound for {len(done)} jobs, "
        f"the last {last_bound:.0f} s after the first submission"
    )
    # Timed from the pods: a gang's status follows its pods, up to 10 s later in a burst
    # (gpuq.controller.record), so status times would show the burst's admissions late.
    buckets = Counter(int((t - start) // 5) for t in done.values())
    series = ", ".join(f"{5 * b}-{5 * b + 5}s {n / 5:.0f}" for b, n in sorted(buckets.items()))
    print(f"  admissions/s over time (jobs whose whole gang became bound): {series}")
    if latency:
        print(f"  submit-to-bound: p50 {percentile(latency, 50):.1f} s, p99 {percentile(latency, 99):.1f} s, "
              f"max {max(latency):.1f} s")  # fmt: skip
    print(f"  watch relists (a broken watch times pods late): {r['relists']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=1024, help="kwok nodes x 8 GPUs, racks of 16")
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=32, help="client threads creating the jobs")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for all admissions")
    ap.add_argument("--no-kueue", action="store_true", help="skip Kueue's spike (no Kueue build needed)")
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
    kueue_build = None if args.no_kueue else ensure_kueue()
    t0 = time.monotonic()
    name = f"bench-spike-{os.getpid()}"
    dev = Cluster.up(name, shape, timing=UPSTREAM_TIMING, tie_to_process=True, timeout=900)
    print(f"cluster up in {time.monotonic() - t0:.0f} s", flush=True)
    try:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(dev.kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
        cfg.connection_pool_maxsize = args.threads + 8
        api = k8s.ApiClient(cfg)
        install_crds(api)
        gpuq = GpuqClient(api)
        print("gpuq:", flush=True)
        g = spike_gpuq(dev, gpuq, shape.gpu_count, mix, args.threads, args.timeout)
        k = None
        if kueue_build is not None:
            print("Kueue + Jobs + kube-scheduler:", flush=True)
            k = spike_kueue(dev, api, kueue_build, shape.gpu_count, mix, args.threads, args.timeout)
    finally:
        dev.down()

    report("gpuq", args.jobs, g)
    print(
        f"  statuses: {g['statuses']}/{args.jobs} jobs shown Admitted or Running, the last "
        f"{g['status_s']:.0f} s after the first submission"
    )
    server_side = g["server"]
    if server_side:
        print(
            f"  the same from the API server's creationTimestamps (gpuq creates its pods bound; 1 s "
            f"resolution): p50 {percentile(server_side, 50):.0f} s, p99 {percentile(server_side, 99):.0f} s, "
            f"max {max(server_side):.0f} s for {len(server_side)} jobs"
        )
    errors = {c: n for c, n in g["answers"].items() if not c.startswith("2")}
    print(
        f"  operator API answers: {dict(sorted(g['answers'].items()))} "
        f"(non-2xx, retried or handled: {errors or 'none'})"
    )
    print(f"  operator CPU {g['cpu']:.0f} s, peak RSS {g['rss']:.0f} MiB")
    if k is not None:
        report("Kueue + Jobs + kube-scheduler", args.jobs, k)
        if g["latency"] and k["latency"]:
            g_rate = len(g["done"]) / max(max(g["done"].values()) - g["start"], 1e-9)
            k_rate = len(k["done"]) / max(max(k["done"].values()) - k["start"], 1e-9)
            print(
                f"\nratio gpuq / Kueue + Jobs + kube-scheduler: jobs bound/s {g_rate / k_rate:.2f} "
                "(goal >= 2), "
                f"submit-to-bound p99 {percentile(g['latency'], 99) / percentile(k['latency'], 99):.2f} "
                "(goal <= 0.5)"
            )
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
