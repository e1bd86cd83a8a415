"""End-to-end throughput of the operator on the local cluster: submit --jobs TrainingJobs to one queue
big enough that quota never blocks, and measure jobs admitted/s, pods bound/s, submit-to-Running
p50/p99, API writes per bound pod, and the operator's CPU seconds and peak RSS. Jobs never finish
(no sim-duration), so the ones that do not fit stay Queued; figures are over the jobs that reached
Running. Mixes: `philly` (mostly 1 GPU, some 2/4/8, a few 16-64-GPU gangs of 8-GPU workers) and
`gangs` (1x1, 1x8 and 4x8 in equal parts).

Baselines, in the same run on the same API server, with as many pods as the mix has (1 CPU-only
pod each, so they fit beside gpuq's pods; the operator is stopped while they run), submitted by the
same pool of client threads as the TrainingJobs:
  raw        the pool creates pods with no scheduler and POSTs pods/binding itself: the API
             server's ceiling for create+bind at that concurrency
  scheduler  the pool creates plain pods for the default kube-scheduler (no gangs)
  jobs       the pool creates one Indexed batch/v1 Job per TrainingJob (parallelism = completions =
             its workers): kube-controller-manager's Job controller creates the pods and
             kube-scheduler binds them, as a kube-scheduler user runs training (no gangs)
  kueue      what a Kueue user runs: the same Indexed Jobs with GPU requests and the queue-name
             label, Kueue v0.17.0's manager (hack/kueue.sh; installed from its config/default,
             webhooks and TAS on, gpuq.peers.kueue_stack) admitting them from a ClusterQueue of all
             the GPUs, the Job controller creating the pods, kube-scheduler binding them: the peer
             gpuq is judged against (`--no-kueue` skips it). Installed before its phase and removed
             after it; its Jobs and pods are deleted, as are gpuq's after its phase (GPUs for the
             next one)
Submission (--submit): `backlog` (default) freezes the scheduler under test (SIGSTOP: kube-scheduler,
with kube-controller-manager too for `jobs`, or the operator, which runs without leader election
here) while the pool creates all its pods or TrainingJobs, then resumes it and times from the
resume to the last bind: this measures how fast each one drains a queue. Kueue cannot be frozen
(its webhooks must answer the creates): its ClusterQueue is held (stopPolicy Hold) until every Job
has its Workload, then released. `live` times from the first create, with the scheduler running:
then the pool's own pace bounds all three (TrainingJobs, checked against their CRD schema, are created
more slowly than pods), and gpuq was measured keeping pace (admission p50 1.3 s behind submission).
The cluster has room for every job (--nodes: by default the mix's GPUs + 15%, racks of 16), so
every pod counts. Nodes keep upstream's timings (lease 40 s renewed every 10 s, grace 50 s): with the
dev cluster's failover-tuned 1.5 s renewals, 464 fake nodes cost the API server ~300 lease writes/s
and flapped NotReady under every burst (302 NodeNotReady Events in one gpuq phase), which taxed
every phase and tainted nodes mid-drain.
Client limits: kube-scheduler runs with 200 qps, burst 400 (the dev cluster raises its 50/100
defaults so a burst of fake nodes and pods is not bound by them; it only binds, the pool creates its
pods), kube-controller-manager (the Job controller) and Kueue's manager with the same 200/400
(Kueue's default is 50/100), gpuq with its defaults, the same 200/400 (it creates the pods, writes
job status and places); the pool's clients are unlimited.
Order: raw, scheduler, jobs, kueue, gpuq, kueue, jobs, scheduler, raw. The store only grows during
a run, so each baseline runs once before and once after gpuq and the mean of the two is compared
(neither side gets the emptier API server). Each phase starts once the API server takes fewer than
20 writes a second, so no phase pays for the previous one's trailing Events and status writes.

Writes per bound pod: mutating requests (POST/PUT/PATCH/DELETE) the API server counted during each
phase (apiserver_request_total), from every client (the submitter, gpuq or kube-scheduler, kwok's
status updates, the controller-manager), Lease renewals excepted, divided by the pods bound; the
gpuq phase's are split by resource.
Rates are timed twice: client-side (watch events, so they include watch delivery, which lagged
seconds behind under a burst) and by the API server's clock: the cluster runs with an audit log of
pod creates and bindings (microsecond timestamps; one line per bind, in every phase alike), and
the last bind after the resume ends each drain.

Reproduce: .venv/bin/python bench/e2e_throughput.py [--jobs 1000] [--mix philly|gangs] [--submit backlog|live]
           [--no-kueue]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch

from gpuq import logs
from gpuq.api import meta
from gpuq.controller.testing import DEFAULT_IMAGE, GpuqClient, OperatorProcess, install_crds
from gpuq.devcluster import Cluster, Shape, ensure_binaries
from gpuq.devcluster.components import UPSTREAM_TIMING
from gpuq.devcluster.shape import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL
from gpuq.devcluster.testing import wait_for
from gpuq.peers import kueue_stack
from gpuq.peers.kueue_binaries import KueueBuild, ensure_kueue
from gpuq.peers.kueue_stack import KueueStack, queue_objects
from gpuq.sim.metrics import percentile

NS_GPUQ = "bench-gpuq"
QUEUE = "bench"
THREADS = 8
SETTLE_S = 10.0  # no new Running job nor bound pod for this long: the run has settled
QUIET_WRITES_PER_S = 20  # a phase starts once the API server takes fewer writes a second than this
# (GPUs per job, replicas, probability): Philly-like, mostly single-GPU jobs.
MIXES = {
    "philly": (
        (1, 1, 0.70),
        (2, 1, 0.10),
        (4, 1, 0.08),
        (8, 1, 0.08),
        (8, 2, 0.02),
        (8, 4, 0.015),
        (8, 8, 0.005),
    ),
    "gangs": ((1, 1, 1 / 3), (8, 1, 1 / 3), (8, 4, 1 / 3)),
}
SCHEDULER = "default-scheduler"


def shape_for(nodes: int) -> Shape:
    per_rack = min(16, nodes)
    if nodes % per_rack:
        raise SystemExit(f"--nodes {nodes}: must be < 16 or a multiple of 16 (racks of 16 nodes)")
    racks = nodes // per_rack
    return Shape(racks=racks, nodes_per_rack=per_rack, gpus_per_node=8, blocks=min(4, racks), zones=1)


def nodes_for(mix: list[tuple[int, int]], headroom: float = 1.15) -> int:
    """Nodes (racks of 16 x 8 GPUs) with room for every job of the mix, so all pods count."""
    gpus = sum(r * g for r, g in mix) * headroom
    return max(16, -(-int(gpus) // (8 * 16)) * 16)


def job_mix(n: int, mix: str = "philly", seed: int = 1) -> list[tuple[int, int]]:
    """(replicas, gpusPerWorker) per job."""
    rng = random.Random(seed)
    kinds = [(r, g) for g, r, _ in MIXES[mix]]
    return rng.choices(kinds, weights=[p for _, _, p in MIXES[mix]], k=n)


class Watcher:
    """Client-side time each object first satisfied each of the `seen` predicates (`firsts[i]`:
    name -> seconds, time.monotonic; `first` is the first predicate's). One watch serves them all,
    so a phase that times two stages costs the machine no more client work than one that times one.

    Lists, then watches from the list's resourceVersion; when the watch breaks (a 410 once the API
    server compacted past it, under load within seconds) it lists and watches again. An object seen
    first by such a relist is timed at the relist: late, never early."""

    def __init__(self, list_func: Callable[..., Any], namespace: str, *seen: Callable[[Any], bool]) -> None:
        self.firsts: list[dict[str, float]] = [{} for _ in seen]
        self.first = self.firsts[0]
        self.last_change = time.monotonic()
        self.relists = 0
        self._stopped = False
        self._watch = watch.Watch()
        self._args = (list_func, namespace, seen)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _see(self, obj: Any, seen: tuple[Callable[[Any], bool], ...]) -> None:
        name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
        for first, pred in zip(self.firsts, seen, strict=True):
            if name not in first and pred(obj):
                first[name] = self.last_change = time.monotonic()

    def _run(self) -> None:
        list_func, namespace, seen = self._args
        while not self._stopped:
            try:
                listed = list_func(namespace)
                if isinstance(listed, dict):
                    items, rv = listed["items"], listed["metadata"]["resourceVersion"]
                else:
                    items, rv = listed.items, listed.metadata.resource_version
                for obj in items:
                    self._see(obj, seen)
                self._watch = watch.Watch()
                for ev in self._watch.stream(list_func, namespace, resource_version=rv, timeout_seconds=300):
                    self._see(ev["object"], seen)
            except Exception:  # the stream was stopped or broke: stop, or list and watch again
                if self._stopped:
                    return
                time.sleep(0.2)
            self.relists += 1

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def pod_lister(core: k8s.CoreV1Api) -> Callable[..., Any]:
    """list_namespaced_pod returning plain dicts, also to the watch: deserializing every event into
    a V1Pod costs the client milliseconds of Python per event, and under a burst that delayed the
    watch by seconds behind the API server (pods created at ~200/s arrived in lumps). No docstring
    nor return annotation, so the watch does not deserialize."""

    def list_pods(namespace, **kw):  # type: ignore[no-untyped-def]
        if kw.get("watch"):
            return core.list_namespaced_pod(namespace, **kw)
        return json.loads(core.list_namespaced_pod(namespace, _preload_content=False, **kw).data)

    return list_pods  # type: ignore[no-any-return]


def gang_latencies(bound: dict[str, float], replicas: dict[str, int], since: dict[str, float]) -> list[float]:
    """Per job whose whole gang is bound, seconds from `since[job]` to its last pod's bind. Pods are
    named <job>-<x>-<y> (gpuq: attempt and rank; a Job's: index and a random suffix)."""
    pods_of: dict[str, list[float]] = {}
    for pod, t in bound.items():
        pods_of.setdefault(pod.rsplit("-", 2)[0], []).append(t)
    return [
        max(ts) - since[j] for j, ts in pods_of.items() if j in since and len(ts) >= replicas.get(j, 1 << 30)
    ]


def server_drain_s(audit_log: Path, ns: str, t0_wall: float, binding: bool) -> float:
    """Seconds from `t0_wall` to the last bind in `ns` by the API server's clock: its last successful
    pods/binding (`binding`), or create of a pod (gpuq creates its pods already bound), from the
    API server's audit log (microseconds; Cluster.up(audit_pod_writes=True)). Unlike the watch's
    times it has no delivery lag: under a burst the watch reached this client seconds behind the API
    server, in lumps. Same host, so the clocks agree."""
    last = 0.0
    with audit_log.open("rb") as f:
        for line in f:
            ev = json.loads(line)
            ref = ev.get("objectRef") or {}
            if (
                ev.get("stage") != "ResponseComplete"
                or ref.get("namespace") != ns
                or ref.get("resource") != "pods"
                or (ref.get("subresource") == "binding") != binding
                or (ev.get("responseStatus") or {}).get("code", 500) >= 300
            ):
                continue
            last = max(last, datetime.fromisoformat(ev["stageTimestamp"]).timestamp())
    return max(0.0, last - t0_wall)


def pod_bound(pod: Any) -> bool:
    return bool(pod["spec"].get("nodeName"))


def job_seen(phases: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda job: (job.get("status") or {}).get("phase") in phases


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def in_pool(func: Callable[[Any], Any], items: Iterable[Any]) -> None:
    with ThreadPoolExecutor(THREADS) as pool:
        for _ in pool.map(func, items):
            pass


def create_namespace(core: k8s.CoreV1Api, name: str) -> None:
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    wait_for(
        lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
        30,
        f"service account default in {name}",
    )


def plain_pod(name: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": DEFAULT_IMAGE, "resources": {"requests": {"cpu": "10m"}}}],
        },
    }


def wait_settled(watchers: list[Watcher], done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        if time.monotonic() - max(w.last_change for w in watchers) > SETTLE_S:
            return
        time.sleep(0.5)


def measure_gpuq(
    gpuq: GpuqClient,
    op: OperatorProcess,
    mix: list[tuple[int, int]],
    timeout: float,
    backlog: bool,
    audit_log: Path,
) -> dict[str, Any]:
    jobs = len(mix)
    custom = gpuq.custom

    def list_jobs(namespace: str, **kw: Any) -> Any:  # no docstring: the watch yields plain dicts
        return custom.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "trainingjobs", **kw)

    jobs_seen = Watcher(list_jobs, NS_GPUQ, job_seen(("Admitted", "Running")), job_seen(("Running",)))
    admitted, running = jobs_seen.firsts
    bound = Watcher(pod_lister(gpuq.core), NS_GPUQ, pod_bound)
    assert op.proc is not None
    pid = op.proc.pid
    cpu0 = cpu_seconds(pid)
    submitted: dict[str, float] = {}

    def submit(item: tuple[int, tuple[int, int]]) -> None:
        i, (replicas, gpus) = item
        name = f"j{i:04d}"
        submitted[name] = time.monotonic()
        gpuq.submit(NS_GPUQ, name, QUEUE, replicas, gpus)

    t_submit = time.monotonic()
    if backlog:
        op.pause()  # frozen while the backlog is created, as kube-scheduler is in its phase
    in_pool(submit, enumerate(mix))
    t_submitted = time.monotonic()
    t0_wall = time.time() - (time.monotonic() - t_submit)
    if backlog:
        op.resume()
        t0_wall = time.time()
    t0 = time.monotonic() if backlog else t_submit
    for w in (jobs_seen, bound):
        w.last_change = max(w.last_change, t0)  # settling counts from when the scheduler could act
    wait_settled([jobs_seen, bound], lambda: len(running) == jobs, timeout)
    cpu = cpu_seconds(pid) - cpu0
    rss = peak_rss_mib(pid)
    for w in (jobs_seen, bound):
        w.stop()
    latencies = [running[j] - max(submitted[j], t0) for j in running]
    replicas = {f"j{i:04d}": r for i, (r, _) in enumerate(mix)}
    to_bound = gang_latencies(bound.first, replicas, {j: max(t, t0) for j, t in submitted.items()})
    pods_total = sum(r for r, _ in mix)
    return {
        "jobs": jobs,
        "pods_total": pods_total,
        "gpus_total": sum(r * g for r, g in mix),
        "submit_s": t_submitted - t_submit,
        "admitted": len(admitted),
        "admitted_rate": len(admitted) / max(max(admitted.values(), default=t0) - t0, 1e-9),
        "running": len(running),
        "running_gpus": sum(r * g for i, (r, g) in enumerate(mix) if f"j{i:04d}" in running),
        "bound": len(bound.first),
        "bound_rate": len(bound.first) / max(max(bound.first.values(), default=t0) - t0, 1e-9),
        "p50": percentile(latencies, 50) if latencies else float("nan"),
        "p99": percentile(latencies, 99) if latencies else float("nan"),
        "bound_p50": percentile(to_bound, 50) if to_bound else float("nan"),
        "bound_p99": percentile(to_bound, 99) if to_bound else float("nan"),
        "cpu": cpu,
        "rss": rss,
        "server_s": server_drain_s(audit_log, NS_GPUQ, t0_wall, binding=False),
    }


def measure_raw(core: k8s.CoreV1Api, ns: str, nodes: list[str], n: int) -> float:
    """Pods created+bound per second by a client loop doing the binding itself."""

    def create_bind(i: int) -> None:
        name = f"r{i:05d}"
        core.create_namespaced_pod(ns, plain_pod(name, "bench-none"))
        target = k8s.V1ObjectReference(kind="Node", api_version="v1", name=nodes[i % len(nodes)])
        body = k8s.V1Binding(metadata=k8s.V1ObjectMeta(name=name), target=target)
        # The generated client cannot parse the binding's empty reply; the POST has succeeded anyway.
        core.create_namespaced_pod_binding(name, ns, body, _preload_content=False)

    t0 = time.monotonic()
    in_pool(create_bind, range(n))
    return n / (time.monotonic() - t0)


def drain(
    dev: Cluster,
    core: k8s.CoreV1Api,
    ns: str,
    pods: int,
    frozen: tuple[str, ...],
    create: Callable[[int], Any],
    items: int,
    timeout: float,
    backlog: bool,
) -> tuple[float, int, float]:
    """Pods bound per second in `ns` once the pool has run `create` for each of `items`: from the
    resume of the `frozen` components (backlog) or the first create, until `pods` are bound (or
    timeout). Returns the rate, the pods bound and the server-side drain (`server_drain_s`)."""
    bound = Watcher(pod_lister(core), ns, pod_bound)
    t0, t0_wall = time.monotonic(), time.time()
    if backlog:
        for c in frozen:
            dev.pause_component(c)
    try:
        in_pool(create, range(items))
    finally:
        if backlog:
            for c in frozen:
                dev.resume_component(c)
            t0, t0_wall = time.monotonic(), time.time()
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: len(bound.first) >= pods, timeout, f"{', '.join(frozen)} binding the pods", 0.1)
    bound.stop()
    done = len(bound.first)
    rate = done / max(max(bound.first.values(), default=t0) - t0, 1e-9)
    return rate, done, server_drain_s(dev.audit_log, ns, t0_wall, binding=True)


def measure_scheduler(
    dev: Cluster, core: k8s.CoreV1Api, ns: str, n: int, timeout: float, backlog: bool
) -> tuple[float, int, float]:
    """Pods bound per second by kube-scheduler, the pool creating plain pods."""

    def create(i: int) -> None:
        core.create_namespaced_pod(ns, plain_pod(f"s{i:05d}", SCHEDULER))

    return drain(dev, core, ns, n, ("kube-scheduler",), create, n, timeout, backlog)


def indexed_job(name: str, replicas: int) -> dict[str, Any]:
    pod = plain_pod("", SCHEDULER)["spec"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": replicas,
            "completions": replicas,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"spec": {**pod, "restartPolicy": "Never"}},
        },
    }


def measure_jobs(
    dev: Cluster, api: k8s.ApiClient, ns: str, mix: list[tuple[int, int]], timeout: float, backlog: bool
) -> tuple[float, int, float]:
    """Pods bound per second when batch/v1 Jobs are the workload: the Job controller creates the
    pods, kube-scheduler binds them (both frozen while the pool creates the Jobs)."""
    batch = k8s.BatchV1Api(api)

    def create(i: int) -> None:
        batch.create_namespaced_job(ns, indexed_job(f"b{i:04d}", mix[i][0]))

    frozen = ("kube-controller-manager", "kube-scheduler")
    pods = sum(r for r, _ in mix)
    return drain(dev, k8s.CoreV1Api(api), ns, pods, frozen, create, len(mix), timeout, backlog)


class KueuePath:
    """What a Kueue user runs for training, on the bench's cluster: Kueue's manager with TAS (a
    Topology of the cluster's block/rack/node labels, a TAS ResourceFlavor over the kwok nodes, a
    ClusterQueue with every GPU and its LocalQueue), one Indexed Job per TrainingJob (GPU requests,
    the queue-name label; gangs with Kueue's preferred-topology annotation at node level, as gpuq's
    default Preferred starts from the node), the Job controller creating the pods and kube-scheduler
    binding them. `up` installs it (outside any phase's clock and write count), `down` removes the
    Jobs, their pods, the queue objects and the manager (its webhooks would tax the other phases)."""

    def __init__(self, api: k8s.ApiClient, stack: KueueStack, ns: str, gpus: int, held: bool) -> None:
        self.custom, self.batch, self.core = (
            k8s.CustomObjectsApi(api),
            k8s.BatchV1Api(api),
            k8s.CoreV1Api(api),
        )
        self.stack, self.ns = stack, ns
        self.queue = ns  # one set of Kueue objects per phase: the previous phase's may still be finalizing
        levels = (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)
        self.objects = queue_objects(self.queue, ns, max(gpus, 1), levels, {"type": "kwok"}, held=held)

    def _each(self, verb: str) -> None:
        for obj in self.objects if verb == "create" else reversed(self.objects):
            plural = kueue_stack.plural(obj["kind"])
            group, version = obj["apiVersion"].split("/")
            name = obj["metadata"]["name"]
            if verb == "create":
                kueue_stack.create(self.custom, obj, self.ns)
            elif obj["kind"] == "LocalQueue":
                self.custom.delete_namespaced_custom_object(group, version, self.ns, plural, name)
            else:
                self.custom.delete_cluster_custom_object(group, version, plural, name)

    def up(self) -> None:
        self.stack.up()
        self._each("create")

    def submit(self, name: str, replicas: int, gpus: int) -> None:
        topology = ("preferred", HOSTNAME_LABEL) if replicas > 1 else None
        job = kueue_stack.indexed_job(name, self.queue, replicas, gpus, DEFAULT_IMAGE, topology)
        self.batch.create_namespaced_job(self.ns, job)

    def workloads(self) -> int:
        return len(
            self.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", self.ns, "workloads")[
                "items"
            ]
        )

    def release(self) -> None:
        """The held ClusterQueue admits again (stopPolicy None)."""
        self.custom.patch_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", self.queue, {"spec": {"stopPolicy": "None"}}
        )

    def down(self) -> None:
        self.batch.delete_collection_namespaced_job(self.ns, propagation_policy="Background")
        self.core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=0)
        wait_for(lambda: not self.core.list_namespaced_pod(self.ns).items, 120, f"pods of {self.ns} gone")
        self._each("delete")

        def queue_gone() -> bool:  # Kueue's finalizer lets it go once its Workloads are gone
            try:
                self.custom.get_cluster_custom_object(
                    "kueue.x-k8s.io", "v1beta2", "clusterqueues", self.queue
                )
            except k8s.ApiException as exc:
                return exc.status == 404
            return False

        with contextlib.suppress(TimeoutError):
            wait_for(queue_gone, 60, f"ClusterQueue {self.queue} deleted")
        self.stack.down()


def measure_kueue(
    dev: Cluster, path: KueuePath, mix: list[tuple[int, int]], timeout: float, backlog: bool
) -> dict[str, Any]:
    """Pods bound per second on the Kueue path (pods created inside the clock). Backlog: the
    ClusterQueue is held while the pool creates the Jobs and until Kueue has a Workload for each,
    then released; timed from the release to the last bind."""
    bound = Watcher(pod_lister(path.core), path.ns, pod_bound)
    submitted: dict[str, float] = {}

    def create(i: int) -> None:
        name = f"k{i:04d}"
        submitted[name] = time.monotonic()
        path.submit(name, *mix[i])

    t0, t0_wall = time.monotonic(), time.time()
    in_pool(create, range(len(mix)))
    if backlog:
        wait_for(lambda: path.workloads() >= len(mix), timeout, "a Kueue Workload for every Job", 0.5)
        path.release()
        t0, t0_wall = time.monotonic(), time.time()
    pods = sum(r for r, _ in mix)
    with contextlib.suppress(TimeoutError):
        wait_for(
            lambda: len(bound.first) >= pods, timeout, "Kueue + Jobs + kube-scheduler binding the pods", 0.1
        )
    bound.stop()
    done = len(bound.first)
    replicas = {f"k{i:04d}": r for i, (r, _) in enumerate(mix)}
    to_bound = gang_latencies(bound.first, replicas, {j: max(t, t0) for j, t in submitted.items()})
    return {
        "rate": done / max(max(bound.first.values(), default=t0) - t0, 1e-9),
        "bound": done,
        "server_s": server_drain_s(dev.audit_log, path.ns, t0_wall, binding=True),
        "bound_p50": percentile(to_bound, 50) if to_bound else float("nan"),
        "bound_p99": percentile(to_bound, 99) if to_bound else float("nan"),
    }


def quiesce(dev: Cluster, below: int = QUIET_WRITES_PER_S, timeout: float = 60.0) -> None:
    """Wait until the API server takes fewer than `below` writes a second (Leases aside): the
    previous phase's stragglers (the Job controller's and kube-scheduler's Events and status
    writes, flushed at their own rate limits) would otherwise land in, and tax, the next phase."""
    deadline = time.monotonic() + timeout
    last = sum(dev.api_writes().values())
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = sum(dev.api_writes().values())
        if now - last < below:
            return
        last = now


def phase(dev: Cluster, run: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """Run one measurement once the API server is quiet; also return the API writes it caused, by
    resource."""
    quiesce(dev)
    before = dev.api_writes()
    out = run()
    time.sleep(2)  # let trailing status updates (kwok, the controller-manager) land in this phase
    after = dev.api_writes()
    return out, after - before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--nodes", type=int, default=0, help="kwok nodes x 8 GPUs, racks of 16 (default: room for every job)"
    )
    ap.add_argument(
        "--submit",
        choices=("backlog", "live"),
        default="backlog",
        help="backlog (default): each scheduler is frozen while its pods/jobs are created, then drains "
        "them; live: it schedules while the pool submits (the pool's pace then bounds all three)",
    )
    ap.add_argument("--jobs", type=int, default=1000, help="TrainingJobs to submit (default 1000)")
    ap.add_argument("--mix", choices=sorted(MIXES), default="philly", help="job shapes (default philly)")
    ap.add_argument("--timeout", type=float, default=900, help="max seconds to wait for jobs to settle")
    ap.add_argument("--no-kueue", action="store_true", help="skip the Kueue phases (no Kueue build needed)")
    args = ap.parse_args(argv)
    logs.configure("WARNING")
    mix = job_mix(args.jobs, args.mix)
    shape = shape_for(args.nodes or nodes_for(mix))
    backlog = args.submit == "backlog"
    cmd = "bench/e2e_throughput.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"# e2e throughput   reproduce: .venv/bin/python {cmd}".rstrip(), flush=True)
    print(f"cluster: {shape.describe()}; submit: {args.submit}", flush=True)
    n = sum(r for r, _ in mix)
    t_up = time.monotonic()
    name = f"bench-e2e-{os.getpid()}"
    kueue_build: KueueBuild | None = None if args.no_kueue else ensure_kueue()
    dev = Cluster.up(
        name,
        shape,
        timing=UPSTREAM_TIMING,
        tie_to_process=True,
        timeout=600,
        audit_pod_writes=True,
    )
    print(f"cluster up in {time.monotonic() - t_up:.0f} s", flush=True)
    op = None
    raws: list[tuple[float, Counter[str]]] = []
    scheds: list[tuple[tuple[float, int, float], Counter[str]]] = []
    jobs: list[tuple[tuple[float, int, float], Counter[str]]] = []
    kueues: list[tuple[dict[str, Any], Counter[str]]] = []
    try:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(dev.kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
        cfg.connection_pool_maxsize = THREADS + 8  # the submit threads and the watches
        api = k8s.ApiClient(cfg)
        install_crds(api)
        gpuq = GpuqClient(api)
        core = gpuq.core
        baselines = [f"bench-{kind}-{k}" for kind in ("raw", "sched", "jobs", "kueue") for k in (1, 2)]
        for ns in (NS_GPUQ, *baselines):
            create_namespace(core, ns)
        gpuq.create_queue(QUEUE, shape.gpu_count)
        nodes = [node.metadata.name for node in core.list_node(label_selector="type=kwok").items]

        def raw_phase(k: int) -> None:
            raws.append(phase(dev, lambda: measure_raw(core, f"bench-raw-{k}", nodes, n)))
            print(f"raw {k}: {raws[-1][0]:.1f} pods/s", flush=True)

        def sched_phase(k: int) -> None:
            scheds.append(
                phase(dev, lambda: measure_scheduler(dev, core, f"bench-sched-{k}", n, args.timeout, backlog))
            )
            print(f"kube-scheduler {k}: {scheds[-1][0][0]:.1f} pods/s", flush=True)

        def jobs_phase(k: int) -> None:
            ns = f"bench-jobs-{k}"
            jobs.append(phase(dev, lambda: measure_jobs(dev, api, ns, mix, args.timeout, backlog)))
            print(f"Jobs + kube-scheduler {k}: {jobs[-1][0][0]:.1f} pods/s", flush=True)

        work = Path(tempfile.mkdtemp(prefix="gpuq-bench-e2e-"))
        kubectl = ensure_binaries() / "kubectl"

        def kueue_phase(k: int) -> None:
            if kueue_build is None:
                return
            ns = f"bench-kueue-{k}"
            stack = KueueStack(
                kueue_build, kubectl, dev.kubeconfig, work / f"kueue-{k}", config=kueue_stack.BENCH_CLIENT
            )
            path = KueuePath(api, stack, ns, sum(r * g for r, g in mix), held=backlog)
            path.up()
            kueues.append(phase(dev, lambda: measure_kueue(dev, path, mix, args.timeout, backlog)))
            path.down()
            print(f"Kueue + Jobs + kube-scheduler {k}: {kueues[-1][0]['rate']:.1f} pods/s", flush=True)

        raw_phase(1)
        sched_phase(1)
        jobs_phase(1)
        kueue_phase(1)
        # One operator: no election, so freezing it during the backlog's creation costs no lease.
        op = OperatorProcess(
            dev.kubeconfig,
            work / "operator.log",
            log_level="WARNING",
            extra_args=("--no-leader-elect",),
            tie_to_parent=True,
        ).start()
        time.sleep(3)  # let the operator list the cluster before the burst
        g, g_writes = phase(dev, lambda: measure_gpuq(gpuq, op, mix, args.timeout, backlog, dev.audit_log))
        op.stop()
        print(f"gpuq: {g['bound_rate']:.1f} pods/s", flush=True)
        gpuq.clear_namespace(NS_GPUQ, timeout=300)  # its GPUs, for the next Kueue phase
        kueue_phase(2)
        jobs_phase(2)
        sched_phase(2)
        raw_phase(2)
    finally:
        if op is not None:
            op.stop()
        dev.down()

    raw = sum(r for r, _ in raws) / len(raws)
    sched = sum(s for (s, _, _), _ in scheds) / len(scheds)
    sched_done = min(d for (_, d, _), _ in scheds)
    sched_server = sum(t for (_, _, t), _ in scheds) / len(scheds)
    jobs_rate = sum(s for (s, _, _), _ in jobs) / len(jobs)
    jobs_done = min(d for (_, d, _), _ in jobs)
    bound = max(g["bound"], 1)

    def per_pod(writes: Counter[str], pods: int) -> float:
        return sum(writes.values()) / max(pods, 1)

    print(
        f"\nworkload ({args.mix}): {g['jobs']} jobs, {g['pods_total']} pods, {g['gpus_total']} GPUs "
        f"requested of {shape.gpu_count}; submitted in {g['submit_s']:.1f} s ({THREADS} client threads)"
    )
    print(
        f"reached Running: {g['running']} jobs ({g['running_gpus']} GPUs); admitted {g['admitted']}; "
        f"the rest stayed Queued (no room)"
    )
    print(f"gpuq   jobs admitted/s         {g['admitted_rate']:8.1f}")
    print(f"gpuq   pods bound/s            {g['bound_rate']:8.1f}   ({g['bound']} pods)")
    print(f"gpuq   submit-to-Running       p50 {g['p50']:.2f} s   p99 {g['p99']:.2f} s")
    print(f"gpuq   submit-to-bound         p50 {g['bound_p50']:.2f} s   p99 {g['bound_p99']:.2f} s")
    print(f"gpuq   operator CPU            {g['cpu']:8.1f} s   peak RSS {g['rss']:.0f} MiB")
    print(
        f"raw    create+bind pods/s      {raw:8.1f}   ({n} pods, {THREADS} client threads; "
        f"before/after gpuq {raws[0][0]:.1f} / {raws[1][0]:.1f})"
    )
    print(
        f"kube-scheduler pods bound/s    {sched:8.1f}   ({sched_done}/{n} pods, no gangs; "
        f"before/after gpuq {scheds[0][0][0]:.1f} / {scheds[1][0][0]:.1f})"
    )
    print(
        f"Jobs + kube-scheduler pods/s   {jobs_rate:8.1f}   ({jobs_done}/{n} pods of {len(mix)} Indexed "
        f"Jobs, no gangs; before/after gpuq {jobs[0][0][0]:.1f} / {jobs[1][0][0]:.1f})"
    )
    if kueues:
        k_rate = sum(k["rate"] for k, _ in kueues) / len(kueues)
        k_p99 = sum(k["bound_p99"] for k, _ in kueues) / len(kueues)
        k_p50 = sum(k["bound_p50"] for k, _ in kueues) / len(kueues)
        k_server = sum(k["server_s"] for k, _ in kueues) / len(kueues)
        print(
            f"Kueue + Jobs + k-sched pods/s  {k_rate:8.1f}   ({min(k['bound'] for k, _ in kueues)}/{n} pods; "
            f"before/after gpuq {kueues[0][0]['rate']:.1f} / {kueues[-1][0]['rate']:.1f}); submit-to-bound "
            f"p50 {k_p50:.2f} s, p99 {k_p99:.2f} s"
        )
        print(
            f"ratio  gpuq / Kueue + Jobs + k-sched  pods bound/s {g['bound_rate'] / k_rate:.2f} (goal >= 2), "
            f"submit-to-bound p99 {g['bound_p99'] / max(k_p99, 1e-9):5.2f} (goal <= 0.5), "
            f"server clock {k_server / max(g['server_s'], 1e-9):5.2f}"
        )
    print(f"ratio  gpuq / raw              {g['bound_rate'] / raw:8.2f}")
    print(f"ratio  gpuq / kube-scheduler   {g['bound_rate'] / sched:8.2f}")
    print(f"ratio  gpuq / Jobs + k-sched   {g['bound_rate'] / jobs_rate:8.2f}")
    g_s, k_s = g["server_s"], sched_server
    j_s = sum(t for (_, _, t), _ in jobs) / len(jobs)
    print(
        "server clock (API server audit log, no watch lag): last bind after the resume "
        f"gpuq {g_s:.2f} s, kube-scheduler {scheds[0][0][2]:.2f} / {scheds[1][0][2]:.2f} s, "
        f"Jobs + k-sched {jobs[0][0][2]:.2f} / {jobs[1][0][2]:.2f} s (before/after)"
    )
    print(f"ratio  gpuq / kube-scheduler   {k_s / max(g_s, 1e-9):8.2f}   (server clock)")
    print(f"ratio  gpuq / Jobs + k-sched   {j_s / max(g_s, 1e-9):8.2f}   (server clock)")
    print("API writes per bound pod (all clients, apiserver_request_total)")
    print(
        f"  gpuq           {per_pod(g_writes, bound):5.2f}   "
        + ", ".join(f"{res or '?'} {c / bound:.2f}" for res, c in g_writes.most_common(8))
    )
    print(f"  raw            {sum(per_pod(w, n) for _, w in raws) / len(raws):5.2f}")
    print(f"  kube-scheduler {sum(per_pod(w, max(d, 1)) for (_, d, _), w in scheds) / len(scheds):5.2f}")
    print(f"  Jobs + k-sched {sum(per_pod(w, max(d, 1)) for (_, d, _), w in jobs) / len(jobs):5.2f}")
    if kueues:
        k_writes = sum(per_pod(w, max(k["bound"], 1)) for k, w in kueues) / len(kueues)
        print(
            f"  Kueue + Jobs   {k_writes:5.2f}   "
            + ", ".join(
                f"{res or '?'} {c / max(kueues[0][0]['bound'], 1):.2f}"
                for res, c in kueues[0][1].most_common(8)
            )
        )
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
