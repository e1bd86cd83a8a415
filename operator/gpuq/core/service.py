"""Attained service and its levels (Tiresias' discretized LAS; config: ServiceOrdering).

A job's attained service is the GPU-time it has held running: the earlier attempts' total
(`Job.attained_gpu_seconds`) plus, while it runs, its GPUs times the time since this attempt started.
Its level is how many thresholds that reached. Pending jobs' levels do not change while they wait, so
queue order can be kept sorted; running jobs' levels grow with time, which makes them victims of
lower-level jobs of their own queue and priority, once they ran the minimum run in their current
attempt (gpuq.core.preemption.allowed_victims, with this cycle's ServiceView).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from gpuq.core.config import ServiceOrdering
from gpuq.core.model import Job


def attained(job: Job, now: float) -> float:
    running = job.running
    if running is None:
        return job.attained_gpu_seconds
    gpus = len(running.placement) * job.workers.gpus_per_worker
    return job.attained_gpu_seconds + gpus * max(0.0, now - running.started_at)


def level(job: Job, now: float, thresholds: tuple[float, ...]) -> int:
    """How many of the thresholds (GPU-seconds, ascending) the job's attained service reached."""
    return bisect.bisect_right(thresholds, attained(job, now)) if thresholds else 0


def service_times(job: Job, rule: ServiceOrdering) -> tuple[float, ...]:
    """When a running job passes its minimum run and reaches each level (some may be past)."""
    running = job.running
    if running is None or not rule.preempt or not rule.thresholds_gpu_hours:
        return ()
    start = running.started_at
    gpus = len(running.placement) * job.workers.gpus_per_worker
    times = [start + rule.min_run_seconds]
    if gpus > 0:
        times.extend(start + (t - job.attained_gpu_seconds) / gpus for t in rule.thresholds_gpu_seconds)
    return tuple(times)


def next_eligible(jobs: Iterable[Job], now: float, rule: ServiceOrdering) -> float:
    """The earliest time after `now` at which one of these running jobs reaches a new level or its
    minimum run, i.e. could become a victim by attained service that it is not now (inf if none)."""
    return min((t for job in jobs for t in service_times(job, rule) if t > now), default=float("inf"))


class ServiceView:
    """One cycle's view of attained service: which running jobs of a queue have passed their minimum
    run, at which level (computed once per queue and cycle: preemption searches ask many times)."""

    def __init__(self, rule: ServiceOrdering, now: float) -> None:
        self.now = now
        self.thresholds = rule.thresholds_gpu_seconds
        self.enabled = rule.preempt and bool(self.thresholds)
        self.min_run = rule.min_run_seconds
        self._levels: dict[str, dict[str, int]] = {}

    def level(self, job: Job) -> int:
        return level(job, self.now, self.thresholds)

    def victim_levels(self, queue: str, jobs: Iterable[Job]) -> dict[str, int]:
        """Running jobs of `queue` (given as `jobs`) that ran min_run in this attempt, by level (>= 1)."""
        cached = self._levels.get(queue)
        if cached is None:
            cached = {}
            if self.enabled:
                now, latest, thresholds = self.now, self.now - self.min_run, self.thresholds
                for job in jobs:
                    running = job.running
                    if running is None or running.started_at > latest:
                        continue
                    gpus = len(running.placement) * job.workers.gpus_per_worker
                    served = job.attained_gpu_seconds + gpus * (now - running.started_at)
                    lv = bisect.bisect_right(thresholds, served)
                    if lv > 0:
                        cached[job.key] = lv
            self._levels[queue] = cached
        return cached
