"""Attained service and its levels (Tiresias' discretized LAS; config: ServiceOrdering).

A job's attained service is the GPU-time it has held running: the earlier attempts' total
(`Job.attained_gpu_seconds`) plus, while it runs, its GPUs times the time since this attempt started.
Its level is how many thresholds that reached. Pending jobs' levels do not change while they wait, so
queue order can be kept sorted; running jobs' levels grow with time, which makes them victims of
lower-level jobs of their own queue and priority, once they ran the minimum run in their current
attempt, unless (spare_larger_gangs) they run on several nodes and hold more GPUs than the job that
would evict them needs (gpuq.core.preemption.allowed_victims, with this cycle's ServiceView).
"""

from __future__ import annotations

import bisect
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
    times = [start + rule.min_run_seconds]
    if gpus > 0 and rule.preempts:
        times.extend(start + (t - job.attained_gpu_seconds) / gpus for t in rule.thresholds_gpu_seconds)
    return tuple(times)


class ServiceView:
    """One cycle's view of attained service: which running jobs of a queue have passed their minimum
    run, at which level (computed once per queue and cycle: preemption searches ask many times)."""

    def __init__(self, rule: ServiceOrdering, now: float) -> None:
        self.now = now
        self.thresholds = rule.thresholds_gpu_seconds
        self.enabled = rule.preempts
        self.min_run = rule.min_run_seconds
        self.spare_larger = rule.spare_larger_gangs
        # per queue: key -> (level, GPUs, spans several nodes) of jobs past their minimum run
        self._levels: dict[str, dict[str, tuple[int, int, bool]]] = {}

    def level(self, job: Job) -> int:
        return level_of(attained(job, self.now), self.thresholds)

    def outranked(self, queue: str, running: Iterable[Job], job: Job) -> dict[str, int]:
        """Running jobs of `queue` (given as `running`) that `job` may evict by attained service: past
        their minimum run in this attempt and at a higher level than `job`, by key."""
        if not self.enabled:
            return {}
        levels = self._levels.get(queue)
        if levels is None:
            latest = self.now - self.min_run
            levels = {}
            for victim in running:
                run = victim.running
                if run is not None and run.started_at <= latest:
                    lv = self.level(victim)
                    if lv > 0:
                        levels[victim.key] = (lv, held_gpus(victim), len(set(run.placement)) > 1)
            self._levels[queue] = levels
        mine = self.level(job)
        need = job.workers.total_gpus
        return {
            key: lv
            for key, (lv, gpus, multi) in levels.items()
            if lv > mine and not (self.spare_larger and multi and gpus > need)
        }
