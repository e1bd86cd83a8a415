"""Kueue's scheduler benchmark run through gpuq: the same generator file, translated
(perf_generator), on a freshly started local cluster, with the gpuq operator as its users run it
(leader election on, default config; it creates and binds the pods), recorded by the rules of
Kueue's runner (perf_recorder).

What plays Kueue's runner here, in this process:
- generation: per queue, its GPUQueue and namespace, then one task per workload set that waits
  `creationIntervalMs` before each TrainingJob it creates (the next wait starts once the create has
  returned), as the runner's goroutines do; all queues at once;
- recording: watches of TrainingJobs, their pods and GPUQueues. A job is admitted once its gang is
  complete and bound (gpuq's durable record of an admission, docs/api.md) or its status says
  Admitted/Running; evicted while Preempted or Recovering; finished when Succeeded. A queue's usage
  is its `status.usedGPUs`, as the runner integrates a ClusterQueue's status usage;
- the finish rule: `runtimeMs` after the admission this process saw, every pod of the gang is
  marked Succeeded (what a kubelet reports when the containers exit 0), as the runner marks its
  Workload Finished that long after it saw the admission. kwok still plays the kubelet that starts
  the pods (so gpuq's side pays for their Running updates too); should kwok's Running land after
  the finish, the pod is marked Succeeded again.
The operator's wall time (its start to its exit, after the last job finished), CPU seconds and peak
RSS are taken as the runner takes minimalkueue's (wait4 rusage of the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuq.api import meta
from gpuq.controller.informer import Informer
from gpuq.controller.kubeapi import ApiError, ApiPolicy, KubeApi, load_credentials, queue_path
from gpuq.controller.testing import OperatorProcess, ensure_namespace, install_crds
from gpuq.devcluster import Cluster
from gpuq.devcluster.components import UPSTREAM_TIMING
from gpuq.peers.perf_generator import JobPlan, Plan, QueuePlan, Stream
from gpuq.peers.perf_recorder import CmdStats, Recorder, Summary

STRATEGIC = "application/strategic-merge-patch+json"
PLACED = ("Admitted", "Running")
EVICTED = ("Preempted", "Recovering")
FINISHED = ("Succeeded", "Failed")
# Kueue's runner talks to its envtest API server with envtest's client limits; so does this one.
RUNNER_POLICY = ApiPolicy(qps=1000.0, burst=2000)
# The runner raises envtest's API server limits to these (runner/main.go); gpuq's side gets the same.
INFLIGHT = ("--max-requests-inflight=800", "--max-mutating-requests-inflight=400")
FINISHERS = 16  # concurrent pod status patches (the runner reconciles 5 Workloads at a time, 1 write each)


@dataclass
class _Pod:
    attempt: int
    bound: bool
    phase: str
    deleting: bool


@dataclass
class _Job:
    plan: JobPlan
    key: str
    phase: str = ""
    attempt: int = 0  # status.attempt
    newest: int = 0  # the newest attempt seen, in its status or its pods' labels
    pods: dict[str, _Pod] = field(default_factory=dict)
    admitted: bool = False
    finish_attempt: int | None = None  # the attempt whose pods the runner rule finishes
    finish_due: float | None = None
    finish_handle: asyncio.TimerHandle | None = None


@dataclass
class Progress:
    created: int = 0
    admitted: int = 0
    finished: int = 0
    failed: int = 0
    patched: int = 0
    repatched: int = 0
    errors: list[str] = field(default_factory=list)


def _complete_attempt(job: _Job) -> int | None:
    """The newest attempt, if its whole gang is bound and alive. An older attempt's pods may
    linger (one that succeeded as it was preempted is not deleted): they are no admission."""
    alive = sum(
        1
        for p in job.pods.values()
        if p.attempt == job.newest and p.bound and not p.deleting and p.phase != "Failed"
    )
    return job.newest if alive >= job.plan.workers else None


class RunnerState:
    """The informers' sink: folds TrainingJob, pod and GPUQueue events into the recorder and
    schedules the finish rule. Runs on the event loop; `finish` is called for each pod to mark."""

    def __init__(
        self,
        plan: Plan,
        recorder: Recorder,
        finish: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.recorder = recorder
        self.finish = finish
        self.clock = clock
        self.progress = Progress()
        self.jobs: dict[str, _Job] = {}
        self.queues: dict[str, QueuePlan] = {q.name: q for q in plan.queues}
        for s in plan.streams:
            for j in s.jobs:
                key = f"{s.queue.namespace}/{j.name}"
                self.jobs[key] = _Job(j, key)
        self.unfinished = set(self.jobs)
        self.ever_admitted: set[str] = set()
        self.all_finished = asyncio.Event()

    # -- Sink --------------------------------------------------------------------------------
    def replace(
        self, kind: str, bodies: list[dict[str, Any]], resource_version: str, scope: str | None
    ) -> None:
        for body in bodies:  # nothing here is ever deleted during a run: a relist only updates
            self.apply(kind, "MODIFIED", body)

    def apply(self, kind: str, event_type: str, body: Mapping[str, Any]) -> None:
        t = self.clock()
        md = body.get("metadata") or {}
        if kind == "GPUQueue":
            q = self.queues.get(md.get("name", ""))
            if q is not None:
                status = body.get("status") or {}
                nominal = (body.get("spec") or {}).get("nominalGPUs", q.nominal_gpus)
                self.recorder.queue(q.name, q.class_name, t, usage=status.get("usedGPUs", 0), nominal=nominal)
            return
        if kind == "TrainingJob":
            job = self.jobs.get(f"{md.get('namespace')}/{md.get('name')}")
            if job is None:
                return
            status = body.get("status") or {}
            job.phase, job.attempt = status.get("phase", ""), int(status.get("attempt") or 0)
            job.newest = max(job.newest, job.attempt)
            if event_type == "ADDED":
                self.progress.created += 1
        else:  # Pod
            labels = md.get("labels") or {}
            job = self.jobs.get(f"{md.get('namespace')}/{labels.get(meta.LABEL_JOB_NAME)}")
            if job is None:
                return
            name = md.get("name", "")
            if event_type == "DELETED":
                job.pods.pop(name, None)
            else:
                pod = _Pod(
                    int(labels.get(meta.LABEL_ATTEMPT) or 0),
                    bool((body.get("spec") or {}).get("nodeName")),
                    (body.get("status") or {}).get("phase", ""),
                    md.get("deletionTimestamp") is not None,
                )
                job.pods[name] = pod
                job.newest = max(job.newest, pod.attempt)
                if job.finish_attempt == pod.attempt and job.finish_due is None:
                    self._finish_pod(job, name, pod, again=True)
        self._observe(job, t)

    # -- the rules -----------------------------------------------------------------------------
    def _observe(self, job: _Job, t: float) -> None:
        finished = job.phase in FINISHED
        complete = _complete_attempt(job)
        evicted_attempt = job.attempt if job.phase in EVICTED else -1
        admitted = not finished and (
            (complete is not None and complete > evicted_attempt) or job.phase in PLACED
        )
        evicted = job.phase in EVICTED and not admitted
        self.recorder.workload(
            job.key, job.plan.class_name, t, admitted=admitted, evicted=evicted, finished=finished
        )
        if admitted and not job.admitted:
            if job.key not in self.ever_admitted:
                self.ever_admitted.add(job.key)
                self.progress.admitted += 1
            attempt = complete if complete is not None else job.attempt
            self._schedule_finish(job, attempt, t + job.plan.runtime_ms / 1000)
        elif not admitted and job.admitted:
            self._cancel_finish(job)
        job.admitted = admitted
        if finished and job.key in self.unfinished:
            self.unfinished.discard(job.key)
            self.progress.finished += 1
            self.progress.failed += job.phase == "Failed"
            self._cancel_finish(job)
            if not self.unfinished:
                self.all_finished.set()

    def _schedule_finish(self, job: _Job, attempt: int, due: float) -> None:
        self._cancel_finish(job)
        job.finish_attempt, job.finish_due = attempt, due
        loop = asyncio.get_running_loop()
        job.finish_handle = loop.call_later(max(0.0, due - self.clock()), self._finish_job, job)

    def _cancel_finish(self, job: _Job) -> None:
        if job.finish_handle is not None:
            job.finish_handle.cancel()
        job.finish_handle = job.finish_due = job.finish_attempt = None

    def _finish_job(self, job: _Job) -> None:
        job.finish_handle = job.finish_due = None
        for name, pod in list(job.pods.items()):
            if pod.attempt == job.finish_attempt:
                self._finish_pod(job, name, pod, again=False)

    def _finish_pod(self, job: _Job, name: str, pod: _Pod, again: bool) -> None:
        if pod.deleting or pod.phase in FINISHED:
            return
        if again:
            self.progress.repatched += 1
        self.finish(job.key.split("/", 1)[0], name)


class _Finisher:
    """Marks pods Succeeded, FINISHERS at a time, as a kubelet whose containers exited 0 would."""

    def __init__(self, api: KubeApi, progress: Progress) -> None:
        self.api = api
        self.progress = progress
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.pending: set[tuple[str, str]] = set()

    def __call__(self, namespace: str, name: str) -> None:
        if (namespace, name) not in self.pending:
            self.pending.add((namespace, name))
            self.queue.put_nowait((namespace, name))

    async def run(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(FINISHERS)))

    async def _worker(self) -> None:
        while True:
            namespace, name = await self.queue.get()
            self.pending.discard((namespace, name))
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            terminated = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
            status = {
                "phase": "Succeeded",
                "conditions": [
                    {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
                    for t in ("ContainersReady", "Ready")
                ],
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "image": "registry.k8s.io/pause:3.10",
                        "imageID": "",
                        "ready": False,
                        "started": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
            path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
            try:
                await self.api.request("PATCH", path, {"status": status}, content_type=STRATEGIC)
                self.progress.patched += 1
            except ApiError as exc:
                if not exc.not_found:  # a pod deleted meanwhile (its gang was evicted) needs nothing
                    self.progress.errors.append(f"finishing pod {namespace}/{name}: {exc}")


async def _generate_queue(api: KubeApi, queue: QueuePlan, streams: list[Stream]) -> None:
    """As the runner's generateQueue: the queue, its namespace, then its workload sets at once."""
    await api.create(queue_path(), queue.body())
    await api.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": queue.namespace}}
    )
    # The pods gpuq creates need the namespace's default ServiceAccount, which the controller-manager
    # adds within moments (Kueue's Workloads need none).
    sa = f"/api/v1/namespaces/{queue.namespace}/serviceaccounts/default"
    for _ in range(600):
        try:
            await api.get(sa)
            break
        except ApiError as exc:
            if not exc.not_found:
                raise
            await asyncio.sleep(0.05)
    await asyncio.gather(*(_generate_stream(api, s) for s in streams))


async def _generate_stream(api: KubeApi, stream: Stream) -> None:
    path = f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{stream.queue.namespace}/trainingjobs"
    for job in stream.jobs:
        await asyncio.sleep(stream.interval_ms / 1000)
        await api.create(path, job.body(stream.queue.name))


async def generate(api: KubeApi, plan: Plan) -> None:
    by_queue: dict[str, list[Stream]] = {}
    for s in plan.streams:
        by_queue.setdefault(s.queue.name, []).append(s)
    await asyncio.gather(*(_generate_queue(api, q, by_queue.get(q.name, [])) for q in plan.queues))


@dataclass(frozen=True)
class GpuqRun:
    summary: Summary
    stats: CmdStats
    progress: Progress
    generation_s: float
    finished_all: bool
    writes: Counter[str] = field(default_factory=Counter)  # the API server's, by resource, during the run


def _stop(op: OperatorProcess, timeout: float = 30.0) -> tuple[float, float]:
    """SIGTERM the operator and reap it: (CPU seconds, peak RSS MiB) from its rusage."""
    assert op.proc is not None
    pid = op.proc.pid
    op.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            op.proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
        time.sleep(0.05)
    op.proc.kill()
    _, status, usage = os.wait4(pid, 0)
    op.proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


async def run(
    plan: Plan,
    kubeconfig: Path,
    operator_log: Path,
    timeout_s: float,
    say: Callable[[str], None],
    operator_args: tuple[str, ...] = (),
    report_every_s: float = 30.0,
) -> GpuqRun:
    """Start the operator, generate the plan's queues and jobs on its schedule, and record until
    every job finished (or `timeout_s`); then stop the operator."""
    recorder = Recorder()
    api = KubeApi(load_credentials(str(kubeconfig)), max_connections=64, policy=RUNNER_POLICY)
    finisher = _Finisher(api, Progress())
    state = RunnerState(plan, recorder, finisher)
    finisher.progress = state.progress
    informers = [
        Informer(api, "TrainingJob", f"/apis/{meta.GROUP}/{meta.VERSION}/trainingjobs", state),
        Informer(api, "Pod", "/api/v1/pods", state, params={"labelSelector": meta.LABEL_JOB_NAME}),
        Informer(api, "GPUQueue", queue_path(), state),
    ]
    tasks = [asyncio.create_task(i.run()) for i in informers]
    tasks.append(asyncio.create_task(finisher.run()))
    for i in informers:
        await i.synced.wait()
    op = OperatorProcess(kubeconfig, operator_log, extra_args=operator_args, tie_to_parent=True).start()
    t0 = time.monotonic()
    gen = asyncio.create_task(generate(api, plan))
    generation_s = float("nan")
    deadline = t0 + timeout_s
    next_report = t0 + report_every_s
    try:
        while time.monotonic() < deadline:
            if gen.done() and generation_s != generation_s:
                gen.result()  # raise what generation raised
                generation_s = time.monotonic() - t0
            if gen.done() and state.all_finished.is_set():
                break
            if not op.alive:
                raise RuntimeError(f"the gpuq operator exited; its log: {operator_log}")
            if time.monotonic() >= next_report:
                p = state.progress
                say(
                    f"gpuq: {time.monotonic() - t0:5.0f} s  created {p.created}/{plan.jobs}  admitted "
                    f"{p.admitted}  finished {p.finished}"
                )
                next_report += report_every_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(state.all_finished.wait()), 1.0)
    finally:
        cpu, rss = _stop(op)
        wall = time.monotonic() - t0
        for t in [*tasks, gen]:
            t.cancel()
        await asyncio.gather(*tasks, gen, return_exceptions=True)
        await api.close()
    return GpuqRun(
        recorder.summary(),
        CmdStats(wall, cpu, rss),
        state.progress,
        generation_s,
        state.all_finished.is_set(),
    )


def run_on_local_cluster(
    plan: Plan,
    work: Path,
    timeout_s: float,
    say: Callable[[str], None],
    operator_args: tuple[str, ...] = (),
) -> GpuqRun:
    """`run` on a freshly started local cluster of the plan's shape (kwok nodes with upstream's
    node timings, the API server's inflight limits as the runner sets envtest's), stopped after."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    dev = Cluster.up(
        f"kueue-perf-{os.getpid()}",
        plan.shape,
        timing=UPSTREAM_TIMING,
        tie_to_process=True,
        timeout=900,
        apiserver_args=INFLIGHT,
    )
    try:
        api = k8s_config.new_client_from_config(config_file=str(dev.kubeconfig))  # type: ignore[no-untyped-call]
        install_crds(api)
        ensure_namespace(k8s.CoreV1Api(api), "gpuq-system")  # the Lease's, as manifests/ creates it
        log = work / "gpuq-operator.log"
        before = dev.api_writes()
        result = asyncio.run(run(plan, dev.kubeconfig, log, timeout_s, say, operator_args=operator_args))
        return dataclasses.replace(result, writes=dev.api_writes() - before)
    finally:
        dev.down()
