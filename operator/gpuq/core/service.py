"""Attained service and its levels (Tiresias' discretized LAS; config: ServiceOrdering).

A job's attained service is the GPU-time it has held running: the earlier attempts' total
(`Job.attained_gpu_seconds`) plus, while it runs, its GPUs times the time since this attempt started.
Its level is how many thresholds that reached. Pending jobs' levels do not change while they wait, so
queue order can be kept sorted; running jobs' levels grow with time, which makes them victims of
lower-level jobs of their own queue and priority, once they ran the minimum run in their current
attempt, unless (spare_larger_gangs) they run on several nodes and hold more GPUs than the job that
would evict them needs (gpuq.core.preemption.allowed_jobs, with this cycle's ServiceView).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable

from gpuq.core.config import ServiceOrdering
from gpuq.core.model import Job


def held_gpus(job: Job) -> int:
    """GPUs of the job's current placement (0 when it does not run)."""
    return len(job.running.placement) * job.workers.gpus_per_worker if job.running else 0


def attained(job: Job, now: float) -> float:
    running = job.running
    if running is None:
        return job.attained_gpu_seconds
    return job.attained_gpu_seconds + held_gpus(job) * max(0.0, now - running.started_at)


def level_of(served: float, thresholds: tuple[float, ...]) -> int:
    """How many of the thresholds (GPU-seconds, ascending) `served` GPU-seconds reached."""
    return bisect.bisect_right(thresholds, served)


def service_times(job: Job, rule: ServiceOrdering, moves: bool = False) -> tuple[float, ...]:
    """When a running job passes its minimum run and reaches each level (some may be past). `moves`:
    consolidation may move jobs past their minimum run, so that time counts even without levels."""
    running = job.running
    if running is None or not (rule.preempts or moves):
        return ()
    start = running.started_at
    gpus = held_gpus(job)
    if gpus > 0 and rule.preempts:
        # A list, not a generator: a first cycle asks for every running job's times, twice.
        served = job.attained_gpu_seconds
        return (
            start + rule.min_run_seconds,
            *[start + (t - served) / gpus for t in rule.thresholds_gpu_seconds],
        )
    return (start + rule.min_run_seconds,)


# Seconds around a level or minimum-run time within which a kept entry is computed again: far above
# the float rounding of those times (nanoseconds at a trace's scale), far below any real gap.
EPS = 1e-3

Entry = tuple[int, int, bool]  # (level, GPUs, spans several nodes)
Levels = dict[str, Entry]  # key -> entry: running jobs past their minimum run at a level above 0


def _entry(job: Job, rule: ServiceOrdering, now: float) -> Entry | None:
    """The job's entry in its queue's table at `now`, or None (not past its minimum run, level 0)."""
    run = job.running
    if run is None or run.started_at > now - rule.min_run_seconds:
        return None
    lv = level_of(attained(job, now), rule.thresholds_gpu_seconds)
    return (lv, held_gpus(job), len(set(run.placement)) > 1) if lv > 0 else None


def _table(running: Iterable[Job], rule: ServiceOrdering, now: float) -> Levels:
    return {job.key: e for job in running if (e := _entry(job, rule, now)) is not None}


class LevelCache:
    """The ServiceView tables of every queue, kept across cycles by the ClusterIndex and changed by
    scheduled events instead of a scan per cycle: a running job's entry changes only when it passes
    its minimum run or a level (service_times), so `advance(now)` recomputes the entries of the jobs
    with such a time up to now + EPS. A time within EPS of `now` stays scheduled (rounding may put the
    real change on either side), so every entry is the one _entry gives at `now`. The index reports
    running jobs that come (`add`: entry at the last `now`, times scheduled) and go (`remove`)."""

    def __init__(self, rule: ServiceOrdering, jobs: dict[str, Job]) -> None:
        self.rule = rule
        self.jobs = jobs  # the index's, by key
        self.now = float("-inf")
        self.tables: dict[str, Levels] = {}
        self._due: list[tuple[float, str, float]] = []  # heap of (time, job, its attempt's start)
        # Bumped whenever a queue's table may have changed: what outranks_any's answers are kept by.
        self.versions: dict[str, int] = {}
        # (queue, level, GPUs the job needs or 0) -> (the table's version, outranks_any's answer)
        self.answers: dict[tuple[str, int, int], tuple[int, bool]] = {}

    def _touch(self, queue: str) -> None:
        self.versions[queue] = self.versions.get(queue, 0) + 1

    def add(self, job: Job) -> None:
        if self.now == float("-inf"):
            return  # never advanced: the first advance enters every job at its time (_rebuild)
        for item in self._enter(job):
            heapq.heappush(self._due, item)

    def _enter(self, job: Job) -> list[tuple[float, str, float]]:
        """Put the job's entry at `now` in its queue's table; its times still to come, to schedule."""
        run = job.running
        if run is None or not self.rule.preempts:
            return []
        entry = _entry(job, self.rule, self.now)
        if entry is not None:
            self.tables.setdefault(job.queue, {})[job.key] = entry
            self._touch(job.queue)
        return [(t, job.key, run.started_at) for t in service_times(job, self.rule) if t > self.now - EPS]

    def _rebuild(self, now: float) -> None:
        """Every entry from scratch at `now` (the first advance, or time went back): one pass, not a
        push and a pop per past level time of every running job."""
        for queue in self.tables:
            self._touch(queue)
        self.now, self._due, self.tables = now, [], {}
        self.answers.clear()
        for job in self.jobs.values():
            self._due.extend(self._enter(job))
        heapq.heapify(self._due)

    def remove(self, job: Job) -> None:
        table = self.tables.get(job.queue)
        if table is not None and table.pop(job.key, None) is not None:
            self._touch(job.queue)

    def advance(self, now: float) -> None:
        if now < self.now or self.now == float("-inf"):
            self._rebuild(now)
        self.now = now
        due, again = self._due, []
        while due and due[0][0] <= now + EPS:
            t, key, started = heapq.heappop(due)
            found = self.jobs.get(key)
            if found is None or found.running is None or found.running.started_at != started:
                continue  # gone or restarted since: its new attempt scheduled its own times
            table = self.tables.setdefault(found.queue, {})
            entry = _entry(found, self.rule, now)
            if entry is None:
                table.pop(key, None)
            else:
                table[key] = entry
            self._touch(found.queue)
            if t > now - EPS:
                again.append((t, key, started))
        for item in again:
            heapq.heappush(due, item)


class ServiceView:
    """One cycle's view of attained service: which running jobs of a queue have passed their minimum
    run, at which level (computed once per queue and cycle: preemption searches ask many times; with
    a LevelCache, once per queue until one of its jobs reaches a new level or its minimum run)."""

    def __init__(self, rule: ServiceOrdering, now: float, cache: LevelCache | None = None) -> None:
        self.rule = rule
        self.now = now
        self.thresholds = rule.thresholds_gpu_seconds
        self.enabled = rule.preempts
        self.spare_larger = rule.spare_larger_gangs
        self.cache = cache if cache is not None and cache.rule == rule else None
        if self.cache is not None:
            self.cache.advance(now)
        self._levels: dict[str, Levels] = {}  # per queue, this cycle (without a cache)

    def level(self, job: Job) -> int:
        return level_of(attained(job, self.now), self.thresholds)

    def _queue_levels(self, queue: str, running: Iterable[Job]) -> Levels:
        if self.cache is not None:
            return self.cache.tables.get(queue, {})
        levels = self._levels.get(queue)
        if levels is None:
            levels = self._levels[queue] = _table(running, self.rule, self.now)
        return levels

    def outranked(self, queue: str, running: Iterable[Job], job: Job) -> dict[str, int]:
        """Running jobs of `queue` (given as `running`) that `job` may evict by attained service: past
        their minimum run in this attempt and at a higher level than `job`, by key."""
        if not self.enabled:
            return {}
        levels = self._queue_levels(queue, running)
        mine = self.level(job)
        need = job.workers.total_gpus
        return {
            key: lv
            for key, (lv, gpus, multi) in levels.items()
            if lv > mine and not (self.spare_larger and multi and gpus > need)
        }

    def outranks_any(self, queue: str, running: Iterable[Job], job: Job) -> bool:
        """Whether outranked(queue, running, job) is not empty (stops at the first)."""
        if not self.enabled:
            return False
        mine = self.level(job)
        need = job.workers.total_gpus
        cache = self.cache
        if cache is not None:  # kept across cycles until the queue's table changes
            key = (queue, mine, need if self.spare_larger else 0)
            version = cache.versions.get(queue, 0)
            kept = cache.answers.get(key)
            if kept is not None and kept[0] == version:
                return kept[1]
        answer = any(
            lv > mine and not (self.spare_larger and multi and gpus > need)
            for lv, gpus, multi in self._queue_levels(queue, running).values()
        )
        if cache is not None:
            if len(cache.answers) > 4096:
                cache.answers.clear()
            cache.answers[key] = (version, answer)
        return answer
