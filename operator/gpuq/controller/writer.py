"""The writer: carries out decisions against the API server, one task per job at a time.

Order is what makes it safe to kill the operator at any moment:
  admit   status (Admitted, attempt N, placement) -> Service -> pods -> bindings
          any failure: delete the attempt's pods, status back to Queued, forget the assumption
  evict   status (Preempted / Recovering / Failed) -> delete pods (force on failed nodes)
On restart the loop sees the persisted intent and finishes it (`complete_admission`) or cleans up.
Pods of attempt N are named <job>-<N>-<rank>, so re-creating one is idempotent and a bound pod is
never bound again (the API refuses a second binding).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from gpuq.api import meta
from gpuq.api.trainingjob import FINISHED_PHASES, PLACED_PHASES, Phase
from gpuq.controller import intents, kubeapi, pods
from gpuq.controller import status as st
from gpuq.controller.cache import ClusterCache
from gpuq.controller.kubeapi import ApiError, KubeApi
from gpuq.controller.lifecycle import Plan
from gpuq.controller.metrics import Metrics
from gpuq.controller.objects import JobEntry, format_time, newer, parse_job
from gpuq.core.decisions import Admit
from gpuq.logs import get_logger

log = get_logger("gpuq.writer")

# How long an admission waits for the previous attempt's pods to leave its nodes.
OLD_PODS_TIMEOUT = 60.0
# Gangs being created and bound at once. Bounded so that, under a burst, early admissions finish
# early instead of all advancing in lockstep; the API server's throughput is the same either way.
ADMISSIONS_IN_FLIGHT = 16


class AdmissionFailed(Exception):
    """A step of an admission failed; the gang is rolled back."""


class Writer:
    def __init__(
        self,
        api: KubeApi,
        cache: ClusterCache,
        metrics: Metrics,
        on_done: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.cache = cache
        self.metrics = metrics
        self.on_done = on_done
        self.clock = clock
        self.busy: set[str] = set()
        self._next: dict[str, Callable[[], Awaitable[object]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._instance = os.environ.get("HOSTNAME", "gpuq")
        self._admissions = asyncio.Semaphore(ADMISSIONS_IN_FLIGHT)

    # -- task management -----------------------------------------------------------------------
    def submit(self, key: str, work: Callable[[], Awaitable[object]], minor: bool = False) -> bool:
        """Run `work` for `key`, one task per key at a time. If the key is busy, `minor` work (a
        status refresh the next cycle recomputes anyway) is dropped; other work (an admission)
        runs right after the current task, replacing any work already waiting there."""
        if key in self.busy:
            if not minor:
                self._next[key] = work
            return False
        self.busy.add(key)
        self._start(key, work)
        return True

    def _start(self, key: str, work: Callable[[], Awaitable[object]]) -> None:
        task = asyncio.create_task(self._run(key, work), name=f"gpuq-write:{key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: str, work: Callable[[], Awaitable[object]]) -> None:
        try:
            await work()
        except ApiError as exc:
            if not exc.not_found:  # the object went away meanwhile: nothing left to do
                log.warning("write failed", key=key, error=str(exc))
        except Exception:
            log.exception("write crashed", key=key)
        finally:
            follow_up = self._next.pop(key, None)
            if follow_up is not None:
                self._start(key, follow_up)
            else:
                self.busy.discard(key)
            self.on_done()

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- primitives ----------------------------------------------------------------------------
    async def patch_job_status(self, job: JobEntry, patch: dict[str, Any]) -> JobEntry:
        if not patch:
            return job
        body = await self.api.merge_patch(
            kubeapi.job_path(job.namespace, job.name, "status"), {"status": patch}
        )
        self.cache.upsert_job(body)
        return parse_job(body)

    async def patch_queue_status(self, name: str, patch: dict[str, Any]) -> None:
        body = await self.api.merge_patch(kubeapi.queue_path(name, "status"), {"status": patch})
        self.cache.upsert_queue(body)

    async def event(self, job: JobEntry, ev: st.Event) -> None:
        await self.object_event(job.namespace, "TrainingJob", job.name, job.uid, ev)

    async def object_event(self, namespace: str, kind: str, name: str, uid: str, ev: st.Event) -> None:
        """Post a core/v1 Event; failures are logged, never fatal."""
        now = format_time(self.clock())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": meta.API_VERSION,
                "kind": kind,
                "name": name,
                "uid": uid,
                **({"namespace": namespace} if kind == "TrainingJob" else {}),
            },
            "reason": ev.reason,
            "message": ev.message[:1024],
            "type": ev.type,
            "source": {"component": "gpuq"},
            "reportingComponent": "gpuq.dev/operator",
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.api.create(f"/api/v1/namespaces/{namespace}/events", body)
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("event not posted", kind=kind, name=name, reason=ev.reason, error=str(exc))

    async def delete_pods(self, keys: Iterable[str], force_nodes: frozenset[str] = frozenset()) -> None:
        async def one(key: str) -> None:
            pod = self.cache.pods.get(key)
            if pod is None:
                return
            # A pod on a failed node never confirms its own termination: force it.
            grace = 0 if pod.node_name in force_nodes else None
            try:
                body = await self.api.delete(kubeapi.pod_path(pod.namespace, pod.name), grace)
            except ApiError as exc:
                if exc.not_found:
                    return
                raise
            if body.get("kind") == "Pod":
                self.cache.upsert_pod(body)

        await asyncio.gather(*(one(k) for k in keys))

    async def annotate_pods(self, keys: Iterable[str], annotations: dict[str, str | None]) -> None:
        async def one(key: str) -> None:
            pod = self.cache.pods.get(key)
            if pod is None:
                return
            try:
                body = await self.api.merge_patch(
                    kubeapi.pod_path(pod.namespace, pod.name), {"metadata": {"annotations": annotations}}
                )
                self.cache.upsert_pod(body)
            except ApiError as exc:
                if not exc.not_found:
                    raise

        await asyncio.gather(*(one(k) for k in keys))

    # -- plans from the lifecycle --------------------------------------------------------------
    async def run_plan(
        self, job: JobEntry, plan: Plan, force_nodes: frozenset[str] = frozenset()
    ) -> JobEntry:
        job = await self.patch_job_status(job, plan.status)
        for ev in plan.events:
            await self.event(job, ev)
        if plan.delete_pods:
            await self.delete_pods(plan.delete_pods, force_nodes)
        if plan.complete_admission:
            await self.complete_admission(job)
        phase = plan.status.get("phase")
        if phase in (Phase.SUCCEEDED, Phase.FAILED):
            self.metrics.finished(job, phase)
        return job

    # -- admission -----------------------------------------------------------------------------
    def current(self, job: JobEntry) -> JobEntry | None:
        """The cache's entry for the same job now (work may run after other writes to it)."""
        fresh = self.cache.jobs.get(job.key)
        return fresh if fresh is not None and fresh.uid == job.uid and not fresh.deleting else None

    async def admit(self, job: JobEntry, decision: Admit) -> None:
        fresh = self.current(job)
        if fresh is None or fresh.status.phase in (*PLACED_PHASES, *FINISHED_PHASES):
            return  # deleted, or placed/finished since the decision: the next cycle decides again
        job = fresh
        now = self.clock()
        attempt = job.status.attempt + 1
        self.cache.assume(job.key, attempt, decision.placement, now)
        try:
            job = await self.patch_job_status(job, intents.admit_status(job, decision, now))
        except BaseException:
            self.cache.forget(job.key)
            raise
        try:
            await self._wait_for_previous_pods(job.key, attempt)
            async with self._admissions:
                await self._ensure_gang(job, attempt, decision.placement)
        except (ApiError, OSError, TimeoutError, AdmissionFailed) as exc:
            await self._rollback(job, attempt, exc)
            return
        self.metrics.admitted(job, decision)
        await self.event(job, st.normal("Admitted", job.status.message or "admitted"))
        log.info(
            "admitted",
            job=job.key,
            queue=decision and job.spec and job.spec.queue,
            attempt=attempt,
            nodes=sorted(set(decision.placement)),
            comm_cost=decision.comm_cost,
        )

    async def complete_admission(self, job: JobEntry) -> None:
        """Finish an admission that was persisted but not carried out (e.g. the operator restarted)."""
        placement = tuple(p.node for p in sorted(job.status.placement, key=lambda p: p.rank))
        try:
            await self._ensure_gang(job, job.status.attempt, placement)
        except (ApiError, OSError, TimeoutError, AdmissionFailed) as exc:
            await self._rollback(job, job.status.attempt, exc)

    async def _wait_for_previous_pods(self, job: str, attempt: int) -> None:
        """A re-placed gang starts only when the previous attempt's pods have left their nodes."""
        deadline = self.clock() + OLD_PODS_TIMEOUT
        while any(p.live and p.attempt != attempt for p in self.cache.pods_of(job)):  # any incarnation
            if self.clock() > deadline:
                raise AdmissionFailed("pods of the previous attempt did not terminate in time")
            await asyncio.sleep(0.1)

    async def _ensure_gang(self, job: JobEntry, attempt: int, placement: tuple[str, ...]) -> None:
        spec = job.spec
        if spec is None or len(placement) != spec.workers.replicas:
            raise AdmissionFailed(
                f"placement has {len(placement)} ranks, job needs {spec and spec.workers.replicas}"
            )
        if pods.needs_service(spec):
            try:
                await self.api.create(
                    f"/api/v1/namespaces/{job.namespace}/services",
                    pods.rendezvous_service(job.namespace, job.name, job.uid),
                )
            except ApiError as exc:
                if not exc.conflict:
                    raise
        resume = newer(job.status.last_checkpoint, job.checkpoint) if job.status.attempt > 1 else None
        names = [pods.pod_name(job.name, attempt, r) for r in range(len(placement))]

        async def create(rank: int) -> None:
            key = f"{job.namespace}/{names[rank]}"
            existing = self.cache.pods.get(key)
            if existing is not None:
                if existing.owner_uid != job.uid:
                    raise AdmissionFailed(
                        f"pod {names[rank]} still belongs to an earlier job of the same name"
                    )
                return
            body = pods.worker_pod(
                job.namespace, job.name, job.uid, spec, rank, attempt, job.status.restarts, resume
            )
            try:
                self.cache.upsert_pod(await self.api.create(kubeapi.pod_path(job.namespace), body))
            except ApiError as exc:
                if not exc.conflict:
                    raise
                body = await self.api.get(kubeapi.pod_path(job.namespace, names[rank]))
                self.cache.upsert_pod(body)
                if self.cache.pods[key].owner_uid != job.uid:
                    raise AdmissionFailed(
                        f"pod {names[rank]} still belongs to an earlier job of the same name"
                    ) from exc

        async def bind(rank: int) -> None:
            key, node = f"{job.namespace}/{names[rank]}", placement[rank]
            pod = self.cache.pods.get(key)
            if pod is not None and pod.node_name == node:
                return
            if pod is not None and pod.node_name is not None:
                raise AdmissionFailed(f"pod {names[rank]} is bound to {pod.node_name}, placement says {node}")
            try:
                await self.api.create(
                    kubeapi.pod_path(job.namespace, names[rank], "binding"), pods.binding(names[rank], node)
                )
            except ApiError as exc:
                if not exc.conflict:
                    raise
                body = await self.api.get(kubeapi.pod_path(job.namespace, names[rank]))
                self.cache.upsert_pod(body)
                if (body.get("spec") or {}).get("nodeName") != node:
                    raise AdmissionFailed(
                        f"pod {names[rank]} could not be bound to {node}: {exc.message}"
                    ) from exc
            self.cache.set_pod_node(key, node)

        await _all(create(r) for r in range(len(placement)))
        await _all(bind(r) for r in range(len(placement)))

    async def _rollback(self, job: JobEntry, attempt: int, exc: BaseException) -> None:
        why = exc.message if isinstance(exc, ApiError) else str(exc)
        log.warning("admission rolled back", job=job.key, attempt=attempt, error=why)
        self.metrics.rollbacks.inc()
        await self.delete_pods(
            [p.key for p in self.cache.pods_of(job.key) if p.attempt == attempt and p.live]
        )
        self.cache.forget(job.key)
        fresh = self.cache.jobs.get(job.key, job)
        if isinstance(exc, ApiError) and exc.invalid:
            # The API server refuses the pods themselves: retrying cannot help.
            msg = f"the API server rejected the worker pods: {why}"
            patch = st.patch(
                fresh.status,
                phase=Phase.FAILED,
                message=msg,
                placement=[],
                finished_at=st.when(self.clock()),
                conditions=st.with_condition(
                    fresh.status.conditions, st.BLOCKED, True, "InvalidPodTemplate", msg, self.clock()
                ),
            )
            fresh = await self.patch_job_status(fresh, patch)
            await self.event(fresh, st.warning("InvalidPodTemplate", msg))
            return
        fresh = await self.patch_job_status(fresh, intents.rollback_status(fresh, why, self.clock()))
        await self.event(fresh, st.warning("AdmissionRolledBack", fresh.status.message or why))


async def _all(coros: Iterable[Awaitable[None]]) -> None:
    """Run concurrently; once all have finished, raise the first failure (nothing left dangling)."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
