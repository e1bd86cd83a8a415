"""The writer: carries out decisions against the API server, one task per job at a time.

Order is what makes it safe to kill the operator at any moment:
  admit   Service -> pods, created bound; the status follows from the complete gang
          (gpuq.controller.record: the pods are the durable record of an admission)
  restart status (Recovering) -> delete pods -> admit again
  evict   status (Preempted / Recovering / Failed) -> delete pods (force on failed nodes)
On restart (or a new leader) the loop sees what is persisted: a complete gang without a status is
adopted, a partial one deleted; a placed status with missing pods is finished
(`complete_admission`). Pods of attempt N are named <job>-<N>-<rank>, so re-creating one is
idempotent and a bound pod is never bound again (the API refuses a second binding).

Concurrency and errors (docs/operations.md, "API errors"):
- every status write is conditional on the resourceVersion it was computed from; a 409 re-reads
  the job into the cache and the next cycle decides again;
- an admission that fails (a transient error after KubeApi's retries, or a permanent one) deletes
  the pods it created (uid preconditions: never another writer's) and the job is decided again;
  a permanent error also says why in the status; pods a failed delete leaves behind are stale for
  the still-queued job and the lifecycle deletes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from gpuq.api import meta
from gpuq.api.trainingjob import FINISHED_PHASES, PLACED_PHASES, Phase
from gpuq.controller import intents, kubeapi, pods
from gpuq.controller import status as st
from gpuq.controller.cache import ClusterCache, owner_kind
from gpuq.controller.gangs import record as gang_record
from gpuq.controller.gangs.resolve import collection_path
from gpuq.controller.kubeapi import ApiError, KubeApi, NotLeader, TokenBucket
from gpuq.controller.lifecycle import Plan
from gpuq.controller.metrics import Metrics
from gpuq.controller.objects import JobEntry, format_time, newer, parse_job
from gpuq.core.decisions import Admit
from gpuq.logs import get_logger

log = get_logger("gpuq.writer")

# How long an admission waits for the previous attempt's pods to leave its nodes.
OLD_PODS_TIMEOUT = 60.0
# How long binding a gang gpuq did not create waits for its owner's controller to create every pod
# (a re-placed gang's replacements follow the old pods' deletion).
GANG_PODS_TIMEOUT = 30.0
# Routine (Normal) Events per second, burst: like client-go's EventCorrelator spam filter, a burst
# of admissions must not spend the API budget on Events; Warnings are always posted.
NORMAL_EVENTS_PER_SECOND = 5.0
NORMAL_EVENTS_BURST = 50
# Gangs being created and bound at once. Bounded so that, under a burst, early admissions finish
# early instead of all advancing in lockstep. Each pod create waits ~0.3 s on a loaded API server,
# so 16 in flight capped a burst at ~45 pods/s on our 2-core bench; 64 (the client's connection
# limit) reached ~68, and 128 no more (bench/e2e_throughput.py).
ADMISSIONS_IN_FLIGHT = 64


class AdmissionFailed(Exception):
    """A step of an admission failed for good; the gang is rolled back."""


class GangPodsMissing(AdmissionFailed):
    """A gang of another owner lacks a pod to bind (its controller has not made them all yet, e.g.
    while it backs off after failures): nothing was bound; the gang is decided again when whole."""


def _permanent(exc: BaseException) -> bool:
    if isinstance(exc, GangPodsMissing):
        return False
    return isinstance(exc, AdmissionFailed) or (isinstance(exc, ApiError) and not exc.transient)


class Writer:
    def __init__(
        self,
        api: KubeApi,
        cache: ClusterCache,
        metrics: Metrics,
        on_done: Callable[[], None],
        clock: Callable[[], float] = time.time,
        admission_delay: float = 0.0,
    ) -> None:
        self.api = api
        self.admission_delay = admission_delay
        self.cache = cache
        self.metrics = metrics
        self.on_done = on_done
        self.clock = clock
        self.busy: set[str] = set()
        # Tasks still waiting for the routine budget (nothing sent yet), by key: an admission of
        # the same job may cancel them (supersede) instead of queueing behind thousands of them.
        self._budget_waits: dict[str, asyncio.Task[object]] = {}
        self._next: dict[str, Callable[[], Awaitable[object]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._instance = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME", "gpuq")
        self._gangs_served = True  # until a Gang create finds no CRD
        self._admissions = asyncio.Semaphore(ADMISSIONS_IN_FLIGHT)
        self.admissions_waiting = 0  # admissions decided and assumed, waiting for a slot to create pods
        self._normal_events = TokenBucket(NORMAL_EVENTS_PER_SECOND, NORMAL_EVENTS_BURST)

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
        except NotLeader:
            log.info("write dropped: not the leader", key=key)
        except ApiError as exc:
            if exc.conflict:
                log.info("write conflicted; the next cycle decides again", key=key, error=str(exc))
            elif not exc.not_found:  # the object went away meanwhile: nothing left to do
                log.warning("write failed", key=key, error=str(exc), transient=exc.transient)
        except Exception:
            log.exception("write crashed", key=key)
        finally:
            follow_up = self._next.pop(key, None)
            if follow_up is not None:
                self._start(key, follow_up)
            else:
                self.busy.discard(key)
            self.on_done()

    def supersede(self, key: str) -> bool:
        """Make room for urgent work on `key` (an admission): cancel its task if that task is a
        routine write still waiting for its budget (nothing sent, so nothing half-done), and give
        the token back. True when the key is now free or will be once the cancelled task unwinds;
        `submit` then queues the urgent work right behind it."""
        if key not in self.busy:
            return True
        task = self._budget_waits.pop(key, None)
        if task is None or task.done():
            return False
        task.cancel()
        self.api.routine_limiter.refund()
        return True

    async def _routine_turn(self, key: str) -> None:
        """Wait for a token of the routine budget; `supersede` may cancel the wait."""
        task = asyncio.current_task()
        assert task is not None
        self._budget_waits[key] = task
        try:
            await self.api.routine_limiter.acquire()
        finally:
            if self._budget_waits.get(key) is task:
                del self._budget_waits[key]

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def abort(self) -> None:
        """Cancel every write in flight (leadership lost): whatever was persisted stays consistent."""
        self._next.clear()
        for task in list(self._tasks):
            task.cancel()
        self.busy.clear()

    # -- primitives ----------------------------------------------------------------------------
    async def refresh_job(self, job: JobEntry) -> JobEntry | None:
        """Read the job again into the cache (after a conflict); None when it is gone."""
        if job.source is not None:
            return self.current(job)  # the operator's own record (gangs.record): nothing to read
        try:
            body = await self.api.get(kubeapi.job_path(job.namespace, job.name))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        self.cache.upsert_job(body)
        return parse_job(body)

    async def patch_job_status(self, job: JobEntry, patch: dict[str, Any], routine: bool = False) -> JobEntry:
        """Write a status patch computed from `job`, conditional on the version `job` was read at.
        On 409 the cache gets the current object and ApiError(409) is raised. `routine`: a write
        that only informs, paced by the client's routine budget (KubeApi.routine_limiter)."""
        if not patch:
            return job
        limiter = None
        if routine:
            await self._routine_turn(job.key)
            limiter = kubeapi.PREPAID
        if job.source is not None:
            return await self._write_gang_status(job, patch, limiter)
        try:
            body = await self.api.merge_patch(
                kubeapi.job_path(job.namespace, job.name, "status"),
                {"status": patch},
                job.resource_version,
                limiter,
            )
        except ApiError as exc:
            if exc.conflict:
                await self.refresh_job(job)
            raise
        self.cache.upsert_job(body)
        return parse_job(body)

    async def _write_gang_status(
        self, job: JobEntry, patch: dict[str, Any], limiter: TokenBucket | None
    ) -> JobEntry:
        """A gang of another owner: the status is the operator's (memory first, so a failed write
        loses nothing it decides by), then written to the gang's Gang object (created on its first
        write) for users and for the next leader. Without the Gang CRD it stays in memory."""
        status = gang_record.patched(job.status, patch)
        fresh = self.cache.set_gang_status(job.key, status) or job
        if not self._gangs_served:
            return fresh
        path = kubeapi.gang_path(job.namespace)
        try:
            if job.key not in self.cache.gangs.records:
                try:
                    await self.api.create(
                        path, gang_record.gang_object(fresh, self.cache.gangs.queue_of(job.key))
                    )
                except ApiError as exc:
                    if not exc.conflict:
                        raise
                patch = {**gang_record.whole(status), **{k: v for k, v in patch.items() if v is None}}
            body = await self.api.merge_patch(
                kubeapi.gang_path(job.namespace, job.name, "status"), {"status": patch}, None, limiter
            )
        except ApiError as exc:
            if not exc.not_found:
                raise
            if job.key in self.cache.gangs.records:  # its Gang was deleted: a new one next time
                self.cache.gangs.records.pop(job.key, None)
            else:
                self._gangs_served = False
                log.warning("the Gang CRD is not installed: gangs' status stays in memory", job=job.key)
            return fresh
        self.cache.apply("gang", "MODIFIED", body)
        return self.cache.jobs.get(job.key) or fresh

    async def patch_queue_status(self, name: str, patch: dict[str, Any]) -> None:
        body = await self.api.merge_patch(kubeapi.queue_path(name, "status"), {"status": patch})
        self.cache.upsert_queue(body)

    async def event(self, job: JobEntry, ev: st.Event) -> None:
        """An Event on the job: a TrainingJob, or the owner of a gang gpuq did not create."""
        if job.source is not None:
            kind = gang_record.kind_of(job.source)
            name = gang_record.owner_name(job.name)
            await self.object_event(job.namespace, kind.kind, name, job.uid, ev, kind.api_version)
            return
        await self.object_event(job.namespace, "TrainingJob", job.name, job.uid, ev)

    async def object_event(
        self,
        namespace: str,
        kind: str,
        name: str,
        uid: str,
        ev: st.Event,
        api_version: str = meta.API_VERSION,
    ) -> None:
        """Post a core/v1 Event; failures are logged, never fatal. Normal Events beyond the rate
        limit are dropped (counted in gpuq_events_dropped); status and conditions say the same."""
        if ev.type == "Normal" and not self._normal_events.try_take():
            self.metrics.events_dropped.labels(ev.reason).inc()
            return
        now = format_time(self.clock())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": api_version,
                "kind": kind,
                "name": name,
                "uid": uid,
                **({"namespace": namespace} if kind != "GPUQueue" else {}),
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
            await self.api.create_event(namespace, body)
        except ApiError as exc:
            log.warning("event not posted", kind=kind, name=name, reason=ev.reason, error=str(exc))

    async def delete_pods(self, keys: Iterable[str], force_nodes: frozenset[str] = frozenset()) -> None:
        """Delete these pods as the cache knows them: a pod now holding the name with another uid
        (a newer incarnation) is left alone."""

        async def one(key: str) -> None:
            pod = self.cache.pods.get(key)
            if pod is None:
                return
            # A pod on a failed node never confirms its own termination: force it.
            grace = 0 if pod.node_name in force_nodes else None
            try:
                body = await self.api.delete(kubeapi.pod_path(pod.namespace, pod.name), grace, uid=pod.uid)
            except ApiError as exc:
                if exc.not_found or exc.conflict:
                    return
                raise
            if body.get("kind") == "Pod":
                self.cache.upsert_pod(body)

        await _all(one(k) for k in keys)

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

        await _all(one(k) for k in keys)

    # -- plans from the lifecycle --------------------------------------------------------------
    async def run_plan(
        self, job: JobEntry, plan: Plan, force_nodes: frozenset[str] = frozenset()
    ) -> JobEntry:
        job = await self.patch_job_status(job, plan.status)
        for ev in plan.events:
            await self.event(job, ev)
        if plan.clear_checkpoint_request:
            await self.annotate_pods(
                plan.clear_checkpoint_request, {meta.ANNOTATION_CHECKPOINT_REQUESTED: None}
            )
        if plan.delete_pods:
            await self.delete_pods(plan.delete_pods, force_nodes)
        if plan.complete_admission:
            await self.complete_admission(job)
        if plan.resume_owner:
            await self.suspend_owner(job, False)
        phase = plan.status.get("phase")
        if phase in (Phase.SUCCEEDED, Phase.FAILED):
            self.metrics.finished(job, phase)
        return job

    async def suspend_owner(self, job: JobEntry, on: bool) -> None:
        """Suspend the owner of a gang gpuq did not create, with gpuq's marker (how such a gang is
        evicted: its controller deletes the pods, and a suspended Job does not count them as
        failures), or lift that suspension. A suspension without the marker is its user's and is
        never lifted here."""
        assert job.source is not None
        kind = gang_record.kind_of(job.source)
        name = gang_record.owner_name(job.name)
        patch = gang_record.suspend_patch(kind, on, meta.SCHEDULER_NAME if on else None)
        try:
            answer = await self.api.merge_patch(f"{collection_path(kind, job.namespace)}/{name}", patch)
        except ApiError as exc:
            if exc.not_found:
                return  # deleted meanwhile: nothing left to suspend or resume
            raise
        self.cache.apply(owner_kind(kind), "MODIFIED", answer)
        log.info("owner suspended" if on else "owner resumed", job=job.key, owner=f"{kind.kind}/{name}")

    # -- admission -----------------------------------------------------------------------------
    def current(self, job: JobEntry) -> JobEntry | None:
        """The cache's entry for the same job now (work may run after other writes to it)."""
        fresh = self.cache.jobs.get(job.key)
        return fresh if fresh is not None and fresh.uid == job.uid and not fresh.deleting else None

    async def admit(self, job: JobEntry, decision: Admit, decided_with: int = 0) -> None:
        """Create the gang's pods, bound; the status follows from them (gpuq.controller.record).
        `decided_with`: how many other admissions the same cycle decided (a burst, if many)."""
        fresh = self.current(job)
        if fresh is None or fresh.status.phase in (*PLACED_PHASES, *FINISHED_PHASES):
            return  # deleted, or placed/finished since the decision: the next cycle decides again
        job = queued = fresh  # queued: its status before admission says since when it waited
        now = self.clock()
        attempt = job.status.attempt + 1
        note = intents.admission_note(decision)
        self.cache.assume(job.key, attempt, decision.placement, now, note, decided_with)
        created: dict[str, str] = {}
        if self.admission_delay:
            await asyncio.sleep(self.admission_delay)  # test hook: widen the decide -> bind window
        try:
            await self._wait_for_previous_pods(job.key, attempt)
            self.admissions_waiting += 1
            try:
                await self._admissions.acquire()
            finally:
                self.admissions_waiting -= 1
            try:
                await self._ensure_gang(job, attempt, decision.placement, created)
            finally:
                self._admissions.release()
        except NotLeader:
            self.cache.forget(job.key)  # whatever it created is the next leader's to adopt or delete
            raise
        except (ApiError, AdmissionFailed) as exc:
            if not _permanent(exc):
                # Nothing is persisted but pods: take back the ones this admission created (the
                # lifecycle deletes any left over, since the job is still queued) and decide again.
                log.warning("admission abandoned after API errors", job=job.key, error=str(exc))
                self.cache.forget(job.key)
                with contextlib.suppress(ApiError):
                    await self._take_back(created)
                return
            await self._rollback(job, attempt, exc, created)
            return
        self.metrics.admitted(queued, decision, now)
        await self.event(job, st.normal("Admitted", intents.admission_message(decision.placement)))
        log.info(
            "admitted",
            job=job.key,
            queue=job.spec.queue if job.spec else None,
            attempt=attempt,
            nodes=sorted(set(decision.placement)),
            comm_cost=decision.comm_cost,
        )

    async def complete_admission(self, job: JobEntry) -> None:
        """Recreate and bind the missing workers of an admission its status records (a worker deleted
        or never bound before the gang ran, or an admission an older operator persisted before its
        pods)."""
        placement = tuple(p.node for p in sorted(job.status.placement, key=lambda p: p.rank))
        created: dict[str, str] = {}
        try:
            await self._ensure_gang(job, job.status.attempt, placement, created)
        except (ApiError, AdmissionFailed) as exc:
            if _permanent(exc):
                await self._rollback(job, job.status.attempt, exc, created)
            else:
                log.warning("admission still paused by API errors", job=job.key, error=str(exc))

    async def _wait_for_previous_pods(self, job: str, attempt: int) -> None:
        """A re-placed gang starts only when the previous attempt's pods have left their nodes, and
        so have pods of this attempt being deleted (left by an admission abandoned before its status
        was written: they carry the same names, gpuq.controller.record)."""
        deadline = self.clock() + OLD_PODS_TIMEOUT
        pods = self.cache.pods_of
        while any(p.live and (p.attempt != attempt or p.deleting) for p in pods(job)):  # any incarnation
            if self.clock() > deadline:
                raise AdmissionFailed("pods of the previous attempt did not terminate in time")
            await asyncio.sleep(0.1)

    async def _ensure_gang(
        self, job: JobEntry, attempt: int, placement: tuple[str, ...], created: dict[str, str]
    ) -> None:
        """Create the attempt's missing pods, bound to their nodes (one call each), and bind any that
        exist unbound. `created` collects key -> uid of the pods this call created (what a rollback
        may delete)."""
        spec = job.spec
        if spec is None or len(placement) != spec.workers.replicas:
            raise AdmissionFailed(
                f"placement has {len(placement)} ranks, job needs {spec and spec.workers.replicas}"
            )
        if job.source is not None:
            await self._bind_gang(job, attempt, placement, created)
            return
        if pods.needs_service(spec):
            try:
                await self.api.create(
                    f"/api/v1/namespaces/{job.namespace}/services",
                    pods.rendezvous_service(job.namespace, job.name, job.uid),
                )
            except ApiError as exc:
                if not exc.conflict:
                    raise
        resume = newer(job.status.last_checkpoint, job.checkpoint) if attempt > 1 else None
        names = [pods.pod_name(job.name, attempt, r) for r in range(len(placement))]
        token = f"{self._instance}/{uuid.uuid4().hex[:12]}"

        async def create(rank: int) -> None:
            key = f"{job.namespace}/{names[rank]}"
            existing = self.cache.pods.get(key)
            if existing is not None:
                if existing.owner_uid != job.uid:
                    raise AdmissionFailed(
                        f"pod {names[rank]} still belongs to an earlier job of the same name"
                    )
                return
            ns, restarts, node = job.namespace, job.status.restarts, placement[rank]
            body = pods.worker_pod(ns, job.name, job.uid, spec, rank, attempt, restarts, resume, node)
            body["metadata"]["annotations"][meta.ANNOTATION_CREATED_BY] = token
            try:
                answer = await self.api.create(kubeapi.pod_path(job.namespace), body)
            except ApiError as exc:
                if not exc.conflict:
                    raise
                answer = await self.api.get(kubeapi.pod_path(job.namespace, names[rank]))
                owner = (answer.get("metadata") or {}).get("ownerReferences") or []
                if not any(o.get("uid") == job.uid for o in owner):
                    self.cache.upsert_pod(answer)
                    raise AdmissionFailed(
                        f"pod {names[rank]} still belongs to an earlier job of the same name"
                    ) from exc
            self.cache.upsert_pod(answer)
            md = answer.get("metadata") or {}
            if (md.get("annotations") or {}).get(meta.ANNOTATION_CREATED_BY) == token:
                created[key] = md.get("uid", "")

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

    async def _bind_gang(
        self, job: JobEntry, attempt: int, placement: tuple[str, ...], bound: dict[str, str]
    ) -> None:
        """Bind the pods another controller created for a gang (an Indexed Job's, a PyTorchJob's),
        one per rank, the attempt written with each binding (the API server copies a Binding's
        annotations to its pod): all or nothing. A rank without exactly one pod to bind binds
        nothing; `bound` collects what this call bound (key -> uid), which a rollback deletes (the
        owner's controller creates them again)."""
        deadline = self.clock() + GANG_PODS_TIMEOUT
        while True:
            todo, problem = self._gang_pods_to_bind(job, attempt, placement)
            if problem is None:
                break
            if self.clock() > deadline:
                raise GangPodsMissing(problem)
            await asyncio.sleep(0.2)  # a re-placed gang: its owner is still creating the new pods

        async def bind(name: str, uid: str, node: str) -> None:
            body = pods.binding(name, node)
            body["metadata"]["uid"] = uid  # the pod of that uid, not a later one of the same name
            body["metadata"]["annotations"] = {meta.LABEL_ATTEMPT: str(attempt)}
            await self.api.create(kubeapi.pod_path(job.namespace, name, "binding"), body)
            key = f"{job.namespace}/{name}"
            bound[key] = uid
            self.cache.set_pod_node(key, node, attempt)

        await _all(bind(*todo[r]) for r in sorted(todo))

    def _gang_pods_to_bind(
        self, job: JobEntry, attempt: int, placement: tuple[str, ...]
    ) -> tuple[dict[int, tuple[str, str, str]], str | None]:
        """Rank -> (pod, uid, node) of the gang's pods still to bind, or why the gang is not whole
        (a rank with no pod, or with more than one)."""
        bound = {
            p.rank
            for p in self.cache.pods_of(job.key, job.uid)
            if p.attempt == attempt and p.rank is not None and p.node_name == placement[p.rank]
        }
        todo: dict[int, tuple[str, str, str]] = {}
        for p in self.cache.unclaimed_of(job.key, job.uid):
            if p.rank is None or p.rank in bound or p.rank >= len(placement) or not p.live or p.deleting:
                continue
            if p.rank in todo:
                return todo, f"rank {p.rank} of {job.key} has more than one pod"
            todo[p.rank] = (p.name, p.uid, placement[p.rank])
        missing = [r for r in range(len(placement)) if r not in todo and r not in bound]
        return todo, (f"no pod to bind for rank {missing[0]} of {job.key}" if missing else None)

    async def _rollback(
        self, job: JobEntry, attempt: int, exc: BaseException, created: dict[str, str]
    ) -> None:
        """Undo an admission that failed for good: delete the pods it created (exactly those),
        then put the job back in its queue. Pods of the attempt created by someone else are left
        to the lifecycle, which removes whatever the persisted status no longer places."""
        why = exc.message if isinstance(exc, ApiError) else str(exc)
        log.warning("admission rolled back", job=job.key, attempt=attempt, error=why)
        self.metrics.rollbacks.inc()
        await self._take_back(created)
        self.cache.forget(job.key)
        fresh = self.current(job) or job
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

    async def _take_back(self, created: dict[str, str]) -> None:
        """Delete exactly the pods an admission created (key -> uid), never another writer's."""
        await _all(self._delete_exact(key, uid) for key, uid in created.items())

    async def _delete_exact(self, key: str, uid: str) -> None:
        ns, _, name = key.partition("/")
        try:
            await self.api.delete(kubeapi.pod_path(ns, name), uid=uid or None)
        except ApiError as exc:
            if not (exc.not_found or exc.conflict):
                raise


async def _all(coros: Iterable[Awaitable[None]]) -> None:
    """Run concurrently; once all have finished, raise the first failure (nothing left dangling)."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
