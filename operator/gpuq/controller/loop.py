"""The scheduling loop: one asyncio task, single flight, woken by cache changes (debounced, and
paced by the last cycle's duration under load) and by timers for things that change on their own
(NotReady grace, preemption grace, restart back-off).

Each cycle: build the snapshot, advance per-job lifecycles, call the pure `gpuq.core.schedule` (in
a worker thread, on an immutable snapshot), and hand the decisions to the writer, which works in
the background (one task per job) while the next cycle already sees its assumptions. A quiet
cluster runs no cycles at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from gpuq.api import meta
from gpuq.api.meta import Condition
from gpuq.api.trainingjob import PLACED_PHASES, Phase
from gpuq.controller import intents, lifecycle, queuehealth, record
from gpuq.controller import status as st
from gpuq.controller.cache import ClusterCache
from gpuq.controller.gangs.strays import StrayReporter
from gpuq.controller.kubeapi import TokenBucket
from gpuq.controller.metrics import (
    Metrics,
    PendingCounts,
    PendingFigures,
    preemption_reason,
    queue_figures,
    unchanged,
)
from gpuq.controller.objects import JobEntry, QueueEntry, format_time, newer
from gpuq.controller.preemption import STOP_SUSPEND, Eviction, PreemptionLog, PreemptionTracker
from gpuq.controller.quarantine import Quarantine, culprits
from gpuq.controller.snapshot import SnapshotBuilder, View, with_disrupted_at
from gpuq.controller.writer import Writer
from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Abandon, Admit, Decisions, Pending, Preempt, Restart
from gpuq.core.extender import ExtenderView, extender_view
from gpuq.core.failover import Disruption, failed_nodes, node_disruptions, remember_disruptions
from gpuq.core.incremental import IncrementalSchedule
from gpuq.core.model import Job, Queue, Snapshot
from gpuq.logs import debug_enabled, get_logger

log = get_logger("gpuq.loop")

POSITION_REFRESH_SECONDS = 5.0
# Status writes that only refresh numbers (positions, live figures in messages), for all jobs.
COSMETIC_WRITES_PER_SECOND = 5.0
BUSY_RETRY_SECONDS = 1.0  # a pending job's status update skipped while a write for it runs
QUEUE_RECHECK_SECONDS = 30.0  # every queue's status compared with what it should be (_publish_queues)


class ScheduleFn(Protocol):
    """gpuq.core.schedule's signature (IncrementalSchedule keeps its index between calls)."""

    def __call__(
        self, snapshot: Snapshot, now: float, config: SchedulerConfig, *, explain: bool = True
    ) -> Decisions: ...


MAX_PAUSE_SECONDS = 1.0  # load-adaptive pacing never delays a cycle by more than this
PACE_FACTOR = 2.0  # under load, wait this many times the last cycle's duration before the next
# While decided admissions wait for a slot in the writer, a cycle cannot bind anything sooner: it
# would rebuild the snapshot for status updates alone, CPU the API server (on the same machine,
# often) needs for the pods. Cycles then come at most this often.
BACKLOG_PAUSE_SECONDS = 0.5
# Explaining every waiting job (reason, position, Pending decisions, their status and metrics) is
# O(waiting jobs) in the core and the shell: 0.5 s a cycle at 12,000 waiting, against a few ms for
# the decisions themselves. While it is that dear, cycles explain at most this often; the others
# only act (the same admissions and preemptions: gpuq.core.schedule, explain=False).
EXPLAIN_SECONDS = 2.0
CHEAP_EXPLAIN_SECONDS = 0.02  # an explaining cycle cheaper than this: every cycle explains
REPORT_SECONDS = 30.0  # a busy loop says how it keeps up this often (INFO), a quiet one says nothing


@dataclasses.dataclass
class _Report:
    """Cycles since the last report: what an admin reads to see whether the loop keeps up."""

    since: float
    cycles: int = 0
    seconds: float = 0.0
    slowest: float = 0.0
    admitted: int = 0

    def add(self, seconds: float, admitted: int) -> None:
        self.cycles += 1
        self.seconds += seconds
        self.slowest = max(self.slowest, seconds)
        self.admitted += admitted


@dataclasses.dataclass
class _Prepared:
    """One cycle's inputs to the core, and what its second half needs."""

    started: float
    now: float
    evicting: frozenset[str]
    generations: Mapping[str, int]
    view: View
    disruptions: dict[str, Disruption]
    failed: frozenset[str]
    explain: bool


def _core_schedule() -> ScheduleFn:
    """The core with its ClusterIndex kept across cycles, fed the snapshot builder's deltas
    (GPUQ_VERIFY_SNAPSHOT=1: each cycle's decisions are checked against a fresh index's)."""
    return IncrementalSchedule(verify=os.environ.get("GPUQ_VERIFY_SNAPSHOT") == "1")


class _Generations(Mapping[str, int]):
    """Each job's metadata.generation, read from the cache when asked (the quarantine asks about
    the few jobs it holds): a copy of all of them each cycle is O(all jobs)."""

    def __init__(self, jobs: Mapping[str, JobEntry]) -> None:
        self._jobs = jobs

    def __getitem__(self, key: str) -> int:
        return self._jobs[key].generation

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)


def _cannot_admit(q: QueueEntry, cores: Mapping[str, Queue]) -> str | None:
    """queuehealth.cannot_admit for a valid queue as the core saw it (`cores`: every valid queue)."""
    core = cores.get(q.name)
    return queuehealth.cannot_admit(core, cores) if q.spec is not None and core is not None else None


def _queue_conditions(
    q: QueueEntry,
    cores: Mapping[str, Queue],
    cannot_admit: str | None,
    over: Mapping[str, queuehealth.OverQuota],
    now: float,
) -> list[Condition]:
    """The queue's conditions after a cycle (`cannot_admit`: _cannot_admit's answer; `over`: the
    queues holding more than their quota allows, by queuehealth.over_quotas)."""
    if q.spec is None or q.name not in cores:
        return st.queue_conditions(q.status.conditions, q.error or "invalid spec", None, None, now)
    return st.queue_conditions(q.status.conditions, None, cannot_admit, over.get(q.name), now)


@dataclasses.dataclass(frozen=True, slots=True)
class _Explained:
    """What one queue's Pendings gave an explaining cycle: reused by the next while they are the
    same tuple and none of its jobs changed (`quiet`: none was busy, no meaningful change)."""

    chunk: tuple[Pending, ...]
    changes: dict[str, tuple[JobEntry, Pending, intents.Change]]  # job -> (entry, Pending, its class)
    refresh: list[tuple[int, str, JobEntry, Pending]]
    quiet: bool


class SchedulingLoop:
    def __init__(
        self,
        cache: ClusterCache,
        writer: Writer,
        config: SchedulerConfig,
        metrics: Metrics,
        schedule: ScheduleFn | None = None,
        clock: Callable[[], float] = time.time,
        debounce: float = 0.05,
        freeze_first_cycle: bool = False,
    ) -> None:
        self.cache = cache
        self._freeze_first = freeze_first_cycle  # the operator's (Term); see _first_cycle_collector
        self.writer = writer
        self.config = config
        self.metrics = metrics
        self.schedule = schedule or _core_schedule()
        self.clock = clock
        self.debounce = debounce
        self.tracker = PreemptionTracker()
        self.builder = SnapshotBuilder()
        self.synced = asyncio.Event()
        self.cycles = 0
        self._dirty = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._refreshed_at: dict[str, float] = {}
        self._blocked_again: set[str] = set()  # jobs kept out whose status write waits for a slot
        self._queues_seen: dict[str, tuple[Any, ...]] = {}  # what each queue's last status was made of
        # What each queue's Pendings gave the last explaining cycle (_explain_waiting): each job's
        # status classification (intents.pending_change), kept while the job's entry and its
        # Pending are the same: most waiting jobs change neither from one cycle to the next.
        self._explained: dict[str, _Explained] = {}
        self._changed_since_explained: set[str] | None = None  # jobs (None: all; _note_changed)
        self._cosmetic = TokenBucket(COSMETIC_WRITES_PER_SECOND, int(COSMETIC_WRITES_PER_SECOND * 4))
        self._disrupted: frozenset[tuple[str, bool]] = frozenset()
        self._disrupted_at: dict[str, float] = {}  # node -> last time a disruption held it
        self._observe_all = True  # the term's first cycle runs every job's lifecycle
        self._observe_again: set[str] = set()
        self._recheck: dict[str, float] = {}  # job -> when its lifecycle asked to be looked at again
        self.quarantine = Quarantine()
        self.strays = StrayReporter()
        self._extender_inputs: tuple[Snapshot, tuple[Admit, ...]] | None = None
        self._extender_view: ExtenderView | None = None
        self._extender_nodes = cache.watch_nodes() if config.extender_enabled else set()
        self._foreign_gpus: Callable[[str], int] = lambda node: 0  # the view's rule, set with it
        self.preemption_log = PreemptionLog()
        self._last_cycle_s = 0.0
        self._report = _Report(time.monotonic())
        self._explained_at = float("-inf")  # when a cycle last explained every waiting job
        self._explain_cost = 0.0  # what that cycle took, seconds
        # The pending gauges as the last explaining cycle left them.
        self._pending_figures: tuple[PendingCounts, PendingCounts] = ({}, {})
        self._figures = PendingFigures()
        self._queues_checked_at = float("-inf")

    @property
    def extender_view(self) -> ExtenderView | None:
        """What the scheduler extender answers from: the last cycle's snapshot and admissions, built
        when kube-scheduler first asks after that cycle (a cluster without the extender pays nothing),
        with other schedulers' pods as the watch reports them now: kube-scheduler binds many between
        two cycles, and each answer must see the ones bound before it."""
        if self._extender_inputs is None:
            return None
        view, touched, cache = self._extender_view, self._extender_nodes, self.cache
        if view is None:
            snapshot, admitting = self._extender_inputs
            bound = ((p.job, p.node_name) for p in cache.pods.values() if p.job and p.node_name and p.live)
            self._foreign_gpus = self.builder.foreign_gpus(cache)
            others = {n: g for n in cache.pods_by_node if (g := self._foreign_gpus(n))}
            touched.clear()
            view = self._extender_view = extender_view(snapshot, bound, admitting, others)
        while touched:
            node = touched.pop()
            view.set_others(node, self._foreign_gpus(node))
        return view

    def close(self) -> None:
        """The term is over: the cache stops collecting touched nodes for this loop's extender."""
        self.cache.unwatch_nodes(self._extender_nodes)
        self.builder.close()

    def restore(self) -> None:
        """A new leadership term: pick up preemptions in progress from the victims' status, and each
        queue's recent preemptions (maxPreemptionsPerHour) from the queues' status."""
        self.tracker.restore(self.cache.jobs.values())
        self.preemption_log.restore(
            {
                name: [t.timestamp() for t in q.status.recent_preemptions]
                for name, q in self.cache.queues.items()
            }
        )

    # -- waking ------------------------------------------------------------------------------
    def mark_dirty(self) -> None:
        self._dirty.set()

    def wake_at(self, when: float | None) -> None:
        """Run a cycle at wall-clock time `when` (keeps only the earliest pending timer)."""
        if when is None:
            return
        if self._timer is not None and self._timer_at is not None and self._timer_at <= when:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a cycle run outside the event loop (tests, one-shot tools): no timers
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_later(max(0.0, when - self.clock()) + 0.01, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, None
        self.mark_dirty()

    async def run(self) -> None:
        await self.synced.wait()
        self.mark_dirty()
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self._pause())  # coalesce a burst of watch events into one cycle
            self._dirty.clear()
            try:
                await self.cycle_async()
            except Exception:
                log.exception("scheduling cycle failed; retrying")
                await asyncio.sleep(1.0)
                self.mark_dirty()

    def _pause(self) -> float:
        """The wait before a cycle: the debounce, or twice as long as the last cycle took, whichever
        is longer, so under load cycles take at most a third of a core and the writer, the watches
        and the API server (on the same machine, often) keep the rest; while the writer has a backlog
        of admissions, at most every BACKLOG_PAUSE_SECONDS."""
        pause = max(self.debounce, min(PACE_FACTOR * self._last_cycle_s, MAX_PAUSE_SECONDS))
        return max(pause, BACKLOG_PAUSE_SECONDS) if self.writer.admissions_waiting else pause

    # -- one cycle ----------------------------------------------------------------------------
    def cycle(self) -> Decisions:
        """One cycle with the core run inline (tests and benchmarks drive this)."""
        with self._first_cycle_collector():
            prep = self._prepare()
            return self._finish(prep, self._core(prep))

    async def cycle_async(self) -> Decisions:
        """One cycle with the core run in a worker thread: it works on an immutable snapshot, and the
        event loop keeps serving watch events, lease renewals and extender calls meanwhile (a long
        cycle at 10k nodes would otherwise stall all three). Only one cycle runs at a time."""
        with self._first_cycle_collector():
            prep = self._prepare()
            return self._finish(prep, await asyncio.to_thread(self._core, prep))

    @contextlib.contextmanager
    def _first_cycle_collector(self) -> Iterator[None]:
        """A term's first cycle makes what later cycles keep (every job's row and Job, the core's
        index: over a million objects at 15,000 jobs), and Python's collector scanned them again
        and again while it did (a tenth of that cycle). With `freeze_first_cycle` the collector
        pauses for it and freezes what it made, as the operator does with its first lists
        (gpuq.controller.cache.GC_THRESHOLDS): nothing the index holds makes reference cycles, so
        reference counting frees it when it goes."""
        if not self._freeze_first or not gc.isenabled():
            yield
            return
        self._freeze_first = False
        gc.disable()
        try:
            yield
        finally:
            gc.freeze()
            gc.enable()

    def _prepare(self) -> _Prepared:
        """Everything before the core: the snapshot, node health, lifecycles and preemptions."""
        started = time.perf_counter()
        now = self.clock()
        self.cycles += 1
        evicting = frozenset(e.victim for e in self.tracker.all())
        generations = _Generations(self.cache.jobs)
        view = self._view(now, evicting, generations)
        # Only the NotReady and failed nodes (view.suspects) can disrupt or fail: not every node.
        cfg, sizes = self.config.failover, view.scope_sizes
        disruptions = node_disruptions(view.suspects, now, cfg, sizes)
        self._report_disruptions(disruptions)
        self._disrupted_at = remember_disruptions(view.suspects, disruptions, now, self._disrupted_at)
        view = with_disrupted_at(view, self._disrupted_at)
        failed = failed_nodes(view.suspects, now, cfg, sizes)
        self._advance_lifecycles(now, failed)
        self._advance_preemptions(now, view, failed)
        self._start_stops(view, now, failed)
        explain = self._explain_cost < CHEAP_EXPLAIN_SECONDS or now >= self._explained_at + EXPLAIN_SECONDS
        return _Prepared(started, now, evicting, generations, view, disruptions, failed, explain)

    def _core(self, prep: _Prepared) -> Decisions | Exception:
        """The core's decisions, or what it raised (handled by _finish, on the event loop)."""
        t0 = time.perf_counter()
        try:
            if isinstance(self.schedule, IncrementalSchedule):
                snap, delta = prep.view.snapshot, prep.view.delta
                return self.schedule(snap, prep.now, self.config, explain=prep.explain, delta=delta)
            return self.schedule(prep.view.snapshot, prep.now, self.config, explain=prep.explain)
        except Exception as exc:
            return exc
        finally:
            self.metrics.schedule.observe(time.perf_counter() - t0)

    def _finish(self, prep: _Prepared, outcome: Decisions | Exception) -> Decisions:
        """Everything after the core: hand decisions to the writer, publish, set the next timer.
        The writer re-reads each job from the cache, so a decision the cluster has overtaken while
        the core ran (a job deleted, placed or busy) is dropped rather than applied."""
        if isinstance(outcome, Exception):
            prep.view, decisions = self._schedule_without_culprits(prep, outcome)
        else:
            decisions = outcome
        view, now = prep.view, prep.now
        if debug_enabled():  # its arguments walk every job
            log.debug(
                "cycle",
                jobs=len(view.snapshot.jobs),
                running=sorted(j.key for j in view.snapshot.jobs if j.running),
                admit=[a.job for a in decisions.admit],
                preempt=[p.victim for p in decisions.preempt],
                restart=[r.job for r in decisions.restart],
                busy=len(self.writer.busy),
            )
        dirty = self._dirty_queues() if prep.explain else None
        self._apply(decisions, view, now, prep.failed, prep.explain, dirty)
        self._publish_queues(decisions, view, now, prep.explain, dirty)
        if prep.explain:
            self._changed_since_explained = set()
        if self.config.extender_enabled:
            self._extender_inputs = (view.snapshot, decisions.admit)
            self._extender_view = None  # built on the extender's first call after this cycle
        grace = self.config.failover.not_ready_grace_seconds
        timers = (
            view.wake_at,
            decisions.wake_at,
            self.tracker.next_deadline(),
            min(self._recheck.values(), default=None),
            *(d.until for d in prep.disruptions.values()),
            *(t + grace for t in self._disrupted_at.values() if t + grace > now),
            None if prep.explain else self._explained_at + EXPLAIN_SECONDS,
        )
        self.wake_at(min((t for t in (*timers, self._report_strays(now)) if t is not None), default=None))
        self.builder.forget_missing(self.cache)
        if prep.explain:  # at a bounded rate: it walks every job refreshed lately
            for key in [k for k in self._refreshed_at if k not in self.cache.jobs]:
                del self._refreshed_at[key]
        self._last_cycle_s = time.perf_counter() - prep.started
        self.metrics.cycle.observe(self._last_cycle_s)
        if prep.explain:
            self._explained_at, self._explain_cost = now, self._last_cycle_s
        self._say_how_it_keeps_up(len(decisions.admit), len(view.snapshot.jobs))
        return decisions

    def _report_strays(self, now: float) -> float | None:
        """A Warning Event on each pod that asks for gpuq but has no gang it can place; when to
        look again."""
        due, next_at = self.strays.due(self.cache.gangs.strays, now)
        for key, stray in due:
            ns, _, name = key.partition("/")
            uid = self.cache.gangs.stray_uids.get(key, "")
            ev = st.warning(stray.code, stray.message)
            log.warning("pod has no gang gpuq can place", pod=key, reason=stray.code, why=stray.message)
            post = partial(self.writer.object_event, ns, "Pod", name, uid, ev, "v1")
            self.writer.submit(f"stray:{key}", post)
        return next_at

    def _say_how_it_keeps_up(self, admitted: int, jobs: int) -> None:
        r = self._report
        r.add(self._last_cycle_s, admitted)
        elapsed = time.monotonic() - r.since
        if elapsed < REPORT_SECONDS:
            return
        log.info(
            "scheduling loop",
            seconds=round(elapsed, 1),
            cycles=r.cycles,
            cycle_avg_ms=round(1000 * r.seconds / r.cycles, 1),
            cycle_max_ms=round(1000 * r.slowest, 1),
            admitted=r.admitted,
            jobs=jobs,
            writes_in_flight=len(self.writer.busy),
            admissions_waiting=self.writer.admissions_waiting,
        )
        self._report = _Report(time.monotonic())

    def _view(self, now: float, evicting: frozenset[str], generations: Mapping[str, int]) -> View:
        view = self.builder.build(
            self.cache,
            now,
            self.config,
            evicting,
            self.quarantine.active(generations),
            self.preemption_log.counts(now),
        )
        self._note_changed(view)
        return view

    def _schedule_without_culprits(self, prep: _Prepared, exc: Exception) -> tuple[View, Decisions]:
        """The core raised: find the jobs it fails on, keep them out, and schedule the rest (on the
        event loop: it reads the cache, and it is rare)."""
        log.error("scheduling failed; looking for the jobs that make it fail", error=repr(exc))
        snap, now = prep.view.snapshot, prep.now

        def fails(jobs: Sequence[Job]) -> bool:
            try:
                self.schedule(dataclasses.replace(snap, jobs=tuple(jobs)), now, self.config)
            except Exception:
                return True
            return False

        bad = culprits(snap.jobs, fails)
        if not bad:
            raise exc  # not about one input (a bug or a resource problem): the loop retries
        log.error("jobs kept out of scheduling after an internal error", jobs=bad)
        self.quarantine.add(bad, prep.generations)
        view = self._view(now, prep.evicting, prep.generations)
        return view, self.schedule(view.snapshot, now, self.config)

    def _report_disruptions(self, active: dict[str, Disruption]) -> None:
        scopes = frozenset((d.scope, d.confirmed) for d in active.values())
        if scopes == self._disrupted:
            return
        for d in active.values():
            if (d.scope, d.confirmed) in self._disrupted:
                continue
            # A forming burst comes and goes with every node that turns NotReady or back: debug only.
            report = log.warning if d.confirmed else log.debug
            event = (
                "many nodes NotReady at once: holding failover (control-plane or network disruption?)"
                if d.confirmed
                else "several nodes NotReady together: waiting for the burst to settle before failing over"
            )
            report(
                event,
                scope="cluster" if d.scope.startswith("\0") else d.scope,
                not_ready=d.not_ready,
                nodes=d.nodes,
                resumes_in=round(d.until - self.clock(), 1),
            )
        if not active and self._disrupted:
            log.info("disruption over: NotReady nodes fail over again after their grace period")
        self._disrupted = scopes
        self.metrics.disruption.set(1 if any(d.confirmed for d in active.values()) else 0)

    def _advance_lifecycles(self, now: float, failed: frozenset[str]) -> None:
        """The lifecycle of each job whose object or pods changed since it was last looked at (the
        first cycle of a term looks at all); a job busy in the writer is looked at again later."""
        if self._observe_all:
            self._observe_all = False
            self.cache.take_touched()
            keys: set[str] = set(self.cache.jobs)
        else:
            keys = self.cache.take_touched() | self._observe_again
        self._observe_again = set()
        due = {k for k, t in self._recheck.items() if t <= now}
        for key in due:
            del self._recheck[key]
        for key in sorted(keys | due):
            job = self.cache.jobs.get(key)
            if job is None or job.deleting:
                continue
            if key in self.writer.busy:
                self._observe_again.add(key)
                continue
            a = self.cache.assumed.get(key)
            rec = lifecycle.Recording(a.note, a.status_delay) if a is not None else lifecycle.UNNOTED
            pods = self.cache.pods_of(key, job.uid)
            if (
                a is not None
                and job.status.phase not in PLACED_PHASES
                and record.created_gang(job, pods) is None
            ):
                # The admission task is over and no complete gang records it (an error, or a worker
                # deleted before the status was written): decide the job again.
                self.cache.forget(key)
            plan = lifecycle.observe(job, pods, now, self.config.failover, rec)
            if plan.recheck_at is not None:
                self._recheck[key] = plan.recheck_at
            if plan and not self.writer.submit(key, partial(self._run_plan, job, plan, failed), minor=True):
                self._observe_again.add(key)
        orphans = self.cache.orphans()
        if orphans:
            self.writer.submit("orphans", partial(self.writer.delete_pods, [p.key for p in orphans], failed))

    async def _run_plan(self, job: JobEntry, plan: lifecycle.Plan, failed: frozenset[str]) -> JobEntry:
        before = job.status.lost_gpu_seconds
        fresh = await self.writer.run_plan(job, plan, failed)
        if plan.status.get("phase") == Phase.RECOVERING:
            self.metrics.restarted(fresh, fresh.status.lost_gpu_seconds - before, self.clock())
        elif plan.status.get("phase") == Phase.RUNNING:
            self.metrics.running(fresh, self.clock())
        return fresh

    # -- preemption --------------------------------------------------------------------------
    def _advance_preemptions(self, now: float, view: View, failed: frozenset[str]) -> None:
        for ev in self.tracker.all():
            victim = self.cache.jobs.get(ev.victim)
            if ev.victim in self.writer.busy:
                continue
            if victim is None or victim.status.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.RECOVERING):
                self.tracker.finish(ev.victim)
                continue
            live = [p for p in self.cache.pods_of(ev.victim, victim.uid) if p.live]
            if ev.evicted:
                if not live:
                    self.tracker.finish(ev.victim)  # resources released: the preemptor can be placed
                    # This cycle's snapshot still counts them (it was built first): look again at
                    # once, or nothing may wake the loop (a Suspended job changes no status on its own).
                    self.wake_at(now)
                continue
            if victim.status.phase not in PLACED_PHASES:
                self.tracker.finish(ev.victim)
                continue
            latest = newer(victim.status.last_checkpoint, victim.checkpoint)
            for p in live:
                latest = newer(latest, p.checkpoint)
            if self.tracker.due(ev, latest, now):
                self.tracker.mark_evicted(ev.victim)
                self.writer.submit(ev.victim, partial(self._evict, victim, ev, now, failed))

    def _start_stops(self, view: View, now: float, failed: frozenset[str]) -> None:
        """Suspended jobs and jobs of draining queues give up their GPUs the way preemption victims
        do: asked to checkpoint first, then evicted."""
        for key, kind in view.stopping.items():
            job = self.cache.jobs.get(key)
            if job is None or job.spec is None:
                continue
            why = (
                "suspended (spec.suspend)"
                if kind == STOP_SUSPEND
                else f"queue {job.spec.queue} drained (stopPolicy HoldAndDrain)"
            )
            self._start_preemption(Preempt(key, kind, why), now, failed)

    def _start_preemption(self, p: Preempt, now: float, failed: frozenset[str]) -> None:
        victim = self.cache.jobs.get(p.victim)
        if victim is None or victim.spec is None or p.victim in self.tracker or p.victim in self.writer.busy:
            return
        ck = victim.spec.checkpoint
        grace = float(ck.grace_period_seconds) if ck.request_on_preemption else 0.0
        ev = self.tracker.start(
            p.victim,
            p.for_job,
            p.reason,
            now,
            grace,
            newer(victim.status.last_checkpoint, victim.checkpoint),
            move=p.move,
        )
        if not ev.is_stop:  # a queue's preemption budget counts other jobs' preemptions only
            self.preemption_log.add(victim.spec.queue, now)
        if grace > 0:
            self.writer.submit(p.victim, partial(self._request_checkpoint, victim, ev))
        else:
            self.tracker.mark_evicted(p.victim)
            self.writer.submit(p.victim, partial(self._evict, victim, ev, now, failed))

    def _call_off(self, off: Abandon) -> None:
        """The core says the preemption buys nothing any more: unless its eviction has begun (or it
        is a stop the user asked for), the victim keeps running."""
        ev = self.tracker.get(off.victim)
        victim = self.cache.jobs.get(off.victim)
        if ev is None or ev.evicted or ev.is_stop or victim is None or off.victim in self.writer.busy:
            return
        self.tracker.finish(off.victim)
        if victim.spec is not None:
            self.preemption_log.discard(victim.spec.queue, ev.requested_at)
        self.writer.submit(off.victim, partial(self._clear_preemption, victim, ev, off.reason))

    async def _clear_preemption(self, victim: JobEntry, ev: Eviction, reason: str) -> None:
        fresh = self.writer.current(victim)
        if fresh is None or fresh.status.phase not in PLACED_PHASES:
            return
        msg = f"preemption by {ev.for_job} called off: {reason}"
        conds = st.without_condition(fresh.status.conditions, st.PREEMPTION_REQUESTED)
        fresh = await self.writer.patch_job_status(
            fresh, st.patch(fresh.status, message=msg, conditions=conds, preemption=None)
        )
        asked = [p.key for p in self.cache.pods_of(fresh.key, fresh.uid) if p.checkpoint_requested]
        await self.writer.annotate_pods(asked, {meta.ANNOTATION_CHECKPOINT_REQUESTED: None})
        await self.writer.event(fresh, st.normal("PreemptionCalledOff", msg))
        log.info("preemption called off", job=fresh.key, for_job=ev.for_job, why=reason)

    async def _request_checkpoint(self, victim: JobEntry, ev: Eviction) -> None:
        """Persist the preemption in the victim's status (it survives a restart), then annotate its
        pods so the training code checkpoints."""
        fresh = self.writer.current(victim)
        if fresh is None:
            return
        victim = fresh
        grace = ev.deadline - ev.requested_at
        msg = f"{ev.describe()}; waiting up to {grace:.0f}s for a checkpoint"
        conds = st.with_condition(
            victim.status.conditions,
            st.PREEMPTION_REQUESTED,
            True,
            "CheckpointRequested",
            msg,
            ev.requested_at,
        )
        fresh = await self.writer.patch_job_status(
            victim, st.patch(victim.status, message=msg, conditions=conds, preemption=ev.to_status())
        )
        live = [p.key for p in self.cache.pods_of(victim.key, victim.uid) if p.live and not p.deleting]
        await self.writer.annotate_pods(
            live, {meta.ANNOTATION_CHECKPOINT_REQUESTED: format_time(ev.requested_at)}
        )
        await self.writer.event(fresh, st.warning("CheckpointRequested", msg))
        await self._event_on(
            ev.for_job, st.normal("Preempting", f"asked {victim.key} to checkpoint before preempting it")
        )

    async def _evict(self, victim: JobEntry, ev: Eviction, now: float, failed: frozenset[str]) -> None:
        fresh = self.writer.current(victim)
        if fresh is None or fresh.status.phase not in PLACED_PHASES:
            return
        if record.finished_gang(fresh, self.cache.pods_of(fresh.key, fresh.uid)):
            return  # its workers finished after the decision: the lifecycle records Succeeded
        victim = fresh
        # Before the first await: the preemptor may be deleted once the victim's status says
        # Preempted, and the reason is the one this eviction started with.
        why = preemption_reason(victim, self.cache.jobs.get(ev.for_job), ev.move)
        msg = ev.describe()
        suspend = ev.for_job == STOP_SUSPEND
        reason = "Suspended" if suspend else "Drained" if ev.is_stop else "Preempted"
        status = lifecycle.evict_status(
            victim,
            Phase.SUSPENDED if suspend else Phase.PREEMPTED,
            msg,
            now,
            self.config.failover,
            count_restart=False,
            count_preemption=not ev.is_stop,
            reason=reason,
        )
        live = tuple(p.key for p in self.cache.pods_of(victim.key, victim.uid) if p.live and not p.deleting)
        # A gang of another owner is evicted by suspending its owner (its controller deletes the
        # pods; a Job counts no failure for them), unless its user suspended it already.
        park = victim.source is not None and not suspend
        event = (st.normal if ev.is_stop else st.warning)(reason, msg)
        plan = lifecycle.Plan(victim.key, status, (event,), () if park else live)
        await self.writer.run_plan(victim, plan, failed)
        if park:
            await self.writer.suspend_owner(victim, True)
        if ev.is_stop:
            log.info("stopped", job=victim.key, queue=victim.spec.queue if victim.spec else None, why=msg)
            return
        self.metrics.preempted(victim, why)
        await self._event_on(ev.for_job, st.normal("PreemptedVictim", f"preempted {victim.key} to make room"))
        log.info(
            "preempted", job=victim.key, queue=victim.spec.queue if victim.spec else None, for_job=ev.for_job
        )

    async def _event_on(self, job_key: str, ev: st.Event) -> None:
        job = self.cache.jobs.get(job_key)
        if job is not None:
            await self.writer.event(job, ev)

    # -- decisions ---------------------------------------------------------------------------
    def _note_changed(self, view: View) -> None:
        """Add the jobs this cycle's build derived again (their entries or pods changed) to those
        changed since the last explaining cycle (None: all of them, after a full build)."""
        if view.changed is None:
            self._changed_since_explained = None
        elif self._changed_since_explained is not None:
            self._changed_since_explained |= view.changed

    def _dirty_queues(self) -> set[str] | None:
        """The queues whose waiting jobs' statuses and gauges must be derived again this explaining
        cycle, besides those whose Pendings the core made anew: where a job changed since the last
        explaining cycle or has a write in flight (None: every queue)."""
        changed = self._changed_since_explained
        if changed is None:
            return None
        jobs = self.cache.jobs
        keys = (*changed, *self.writer.busy)
        return {j.spec.queue for k in keys if (j := jobs.get(k)) is not None and j.spec is not None}

    def _apply(
        self,
        d: Decisions,
        view: View,
        now: float,
        failed: frozenset[str],
        explained: bool,
        dirty: set[str] | None = None,
    ) -> None:
        admits = {a.job: a for a in d.admit}
        for r in d.restart:
            job = self.cache.jobs.get(r.job)
            if job is None or job.spec is None or r.job in self.writer.busy:
                continue
            self.tracker.finish(r.job)
            readmit = admits.pop(r.job, None)  # a first restart is re-placed in the same cycle
            if r.job in view.blocked:
                readmit = None  # its queue no longer admits it: it waits Recovering, blocked
            self.writer.submit(r.job, partial(self._restart, job, r, readmit, now, failed))
        for a in admits.values():
            job = self.cache.jobs.get(a.job)
            # A waiting job's status write may still wait for its budget behind a burst of others:
            # the admission does not wait with it (the write only said the job waits).
            if job is None or job.spec is None or not self.writer.supersede(a.job):
                continue
            # The whole batch is known now; the writer's tasks assume one at a time, so without
            # it the first BURST_GANGS of a burst would each cost a status write mid-burst.
            self.writer.submit(a.job, partial(self.writer.admit, job, a, len(admits) - 1))
        for p in d.preempt:
            self._start_preemption(p, now, failed)
        for off in d.abandon:
            self._call_off(off)
        if explained:
            self._explain_waiting(d, now, dirty)
        self._write_blocked(view, now, explained)

    def _write_blocked(self, view: View, now: float, explained: bool) -> None:
        """The status of each job kept out whose exclusion or entry changed (or whose write could not
        be handed over last time); in explaining cycles (a bounded rate) of every job kept out."""
        if explained or view.changed is None:
            keys: Iterable[str] = view.excluded
        else:
            keys = sorted((view.changed | self._blocked_again) & view.excluded.keys())
        self._blocked_again = set()
        for key in keys:
            job, why = self.cache.jobs.get(key), view.excluded[key]
            if job is None:
                continue
            if key in self.writer.busy:
                self._blocked_again.add(key)
                continue
            patch, events = intents.blocked_status(job, why, now)
            write = partial(self._patch, job, patch, events)
            if (patch or events) and not self.writer.submit(key, write, minor=True):
                self._blocked_again.add(key)

    def _explain_waiting(self, d: Decisions, now: float, dirty: set[str] | None = None) -> None:
        """Each waiting job's status from the core's Pending: meaningful changes at once (routine
        budget), positions and live numbers at a bounded rate. A queue whose Pendings are the very
        tuple of the last explaining cycle, not `dirty` (no job of it changed since or has a write
        in flight; None: all are) and which had no meaningful change to write then gives what it
        gave then (with 1,000 queues and 35,000 jobs waiting, most of them every time)."""
        refresh: list[tuple[int, str, JobEntry, Pending]] = []
        kept: dict[str, _Explained] = {}
        for queue, chunk in d.pending_queues():
            last = self._explained.get(queue)
            if last is None or not last.quiet or not unchanged(queue, chunk, last.chunk, dirty):
                last = self._explain_chunk(chunk, now, last)
            kept[queue] = last
            refresh += last.refresh
        self._explained = kept
        self._refresh_cosmetic(refresh, now)

    def _explain_chunk(self, chunk: tuple[Pending, ...], now: float, last: _Explained | None) -> _Explained:
        """_explain_waiting for one queue's Pendings (`last`: what they gave the last explaining
        cycle, whose classifications hold for the same job entry and Pending)."""
        changes: dict[str, tuple[JobEntry, Pending, intents.Change]] = {}
        refresh: list[tuple[int, str, JobEntry, Pending]] = []
        quiet = True  # no job busy, no meaningful change written: the next may reuse it all
        for pending in chunk:
            job = self.cache.jobs.get(pending.job)
            if job is None:
                continue
            if pending.job in self.writer.busy:
                # Its status is being written: retry soon, or a quiet cluster never shows the update.
                self.wake_at(now + BUSY_RETRY_SECONDS)
                quiet = False
                continue
            seen = last.changes.get(pending.job) if last is not None else None
            if seen is not None and seen[0] is job and seen[1] == pending:
                change = seen[2]
            else:
                change = intents.pending_change(job, pending)
            changes[pending.job] = (job, pending, change)
            if change is intents.Change.COSMETIC:
                refresh.append((pending.position or 1 << 30, pending.job, job, pending))
            elif change is intents.Change.MEANINGFUL:
                quiet = False
                patch = intents.pending_status(job, pending, now)
                self.writer.submit(pending.job, partial(self._patch, job, patch), minor=True)
        return _Explained(chunk, changes, refresh, quiet)

    def _refresh_cosmetic(self, refresh: list[tuple[int, str, JobEntry, Pending]], now: float) -> None:
        """Positions and live numbers in messages change with every admission; written at once they
        would re-patch every pending job each cycle (and each write wakes the loop again). They are
        refreshed at most once per POSITION_REFRESH_SECONDS per job and COSMETIC_WRITES_PER_SECOND in
        all, queue heads first; the next refresh is due when no more is allowed now. Only the
        patches written are built."""
        deferred = False
        for _, key, job, pending in sorted(refresh, key=lambda r: (r[0], r[1])):
            if now < self._refreshed_at.get(key, 0.0) + POSITION_REFRESH_SECONDS:
                deferred = True
                continue
            if not self._cosmetic.try_take():
                deferred = True
                break
            patch = intents.pending_status(job, pending, now)
            if self.writer.submit(key, partial(self._patch, job, patch), minor=True):
                self._refreshed_at[key] = now
        if deferred:
            self.wake_at(now + POSITION_REFRESH_SECONDS)

    async def _patch(self, job: JobEntry, patch: dict[str, Any], events: tuple[st.Event, ...] = ()) -> None:
        """A waiting or blocked job's status: it informs, so it takes the routine budget."""
        fresh = await self.writer.patch_job_status(job, patch, routine=True)
        for ev in events:
            await self.writer.event(fresh, ev)

    async def _patch_queue(self, q: QueueEntry, patch: dict[str, Any], events: tuple[st.Event, ...]) -> None:
        await self.writer.patch_queue_status(q.name, patch)
        for ev in events:
            await self.writer.object_event("default", "GPUQueue", q.name, q.uid, ev)

    async def _restart(
        self, job: JobEntry, r: Restart, admit: Admit | None, now: float, failed: frozenset[str]
    ) -> None:
        fresh = self.writer.current(job)
        if fresh is None or fresh.status.phase not in PLACED_PHASES:
            return
        job = fresh
        pods = self.cache.pods_of(job.key, job.uid)
        why = f"node(s) {', '.join(r.failed_nodes)} failed: {r.reason}" if r.failed_nodes else r.reason
        plan = lifecycle.fail_or_restart(
            job, pods, why, now, self.config.failover, r.failed_nodes, "NodeFailed"
        )
        status = dict(plan.status)
        if "notBefore" in status:
            status["notBefore"] = format_time(max(r.not_before, now))
        force = failed | frozenset(r.failed_nodes)
        # A gang of another owner restarts by suspending its owner, as it is evicted: its controller
        # removes the pods on healthy nodes without counting failures (a Job's pod failure back-off
        # would otherwise hold its new pods for minutes); gpuq deletes only those on failed nodes,
        # whose kubelet cannot. Resumed once they are gone, it is re-placed from its queue.
        park = job.source is not None and status.get("phase") == Phase.RECOVERING
        on_failed = {p.key for p in pods if p.node_name in force}
        delete = tuple(k for k in plan.delete_pods if k in on_failed) if park else plan.delete_pods
        fresh = await self._run_plan(job, lifecycle.Plan(plan.job, status, plan.events, delete), force)
        if park:
            await self.writer.suspend_owner(fresh, True)
        log.warning(
            "gang restarted",
            job=job.key,
            queue=job.spec.queue if job.spec else None,
            nodes=list(r.failed_nodes),
            restarts=fresh.status.restarts,
        )
        if admit is not None and fresh.status.phase == Phase.RECOVERING and not park:
            await self.writer.admit(fresh, admit)

    # -- queues ------------------------------------------------------------------------------
    def _publish_queues(
        self, d: Decisions, view: View, now: float, explained: bool, dirty: set[str] | None = None
    ) -> None:
        pending, admitted = self._queue_counts(d, view)
        if explained:  # the pending gauges hold the last explained cycle's figures in between
            self._pending_figures = self._figures.update(d, view.excluded, self.cache.jobs, dirty)
        self.metrics.publish_figures(queue_figures(self.cache.queues, d, admitted), *self._pending_figures)
        cores = {q.name: q for q in view.snapshot.queues}
        over = queuehealth.over_quotas(cores, d.queue_usage)
        # Every queue's status is compared with what it should be at most every
        # QUEUE_RECHECK_SECONDS (a write that failed is made again then); in between, only the
        # queues where something its status is made of changed (`seen`).
        recheck = explained and now >= self._queues_checked_at + QUEUE_RECHECK_SECONDS
        if recheck:
            self._queues_checked_at = now
        recent = self.preemption_log.recent(now)
        for name, q in self.cache.queues.items():
            used, borrowed = d.queue_usage.get(name, 0), d.queue_borrowed.get(name, 0)
            times = recent.get(name, ())
            blocked = _cannot_admit(q, cores)  # it reads its cohort-mates' quotas too
            seen = (
                q,
                used,
                borrowed,
                pending.get(name, 0),
                admitted.get(name, 0),
                over.get(name),
                times,
                blocked,
            )
            if not recheck and self._queues_seen.get(name) == seen:
                continue
            conditions = _queue_conditions(q, cores, blocked, over, now)
            patch = st.patch(
                q.status,
                used_gpus=used,
                borrowed_gpus=borrowed,
                pending_jobs=pending.get(name, 0),
                admitted_jobs=admitted.get(name, 0),
                conditions=conditions,
                recent_preemptions=[st.when(t) for t in times],
            )
            key = f"gpuqueue/{name}"
            if patch and key in self.writer.busy:
                self._queues_seen.pop(name, None)  # look again next cycle
                continue
            self._queues_seen[name] = seen
            if patch:
                events = st.queue_warnings(q.status.conditions, conditions) if "conditions" in patch else ()
                self.writer.submit(key, partial(self._patch_queue, q, patch, events), minor=True)
        for name in [n for n in self._queues_seen if n not in self.cache.queues] if explained else ():
            del self._queues_seen[name]

    def _queue_counts(self, d: Decisions, view: View) -> tuple[dict[str, int], dict[str, int]]:
        """Jobs waiting (or kept out) and admitted per queue: the builder's counts (kept as jobs
        change), with this cycle's admissions moved from the first to the second."""
        pending: dict[str, int] = {}
        admitted: dict[str, int] = {}
        for (queue, kind), n in view.tally.items():
            target = admitted if kind == "running" else pending
            target[queue] = target.get(queue, 0) + n
        for a in d.admit:
            counted = self.builder.tallied(a.job)
            if counted is not None and counted[1] == "waiting":
                pending[counted[0]] -= 1
                admitted[counted[0]] = admitted.get(counted[0], 0) + 1
        return pending, admitted
