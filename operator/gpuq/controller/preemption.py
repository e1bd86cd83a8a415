"""Checkpoint-aware preemption in the imperative shell: who is being preempted, for whom, and when
the victim may finally be evicted (pure bookkeeping: time is an argument, no I/O).

Each preemption that waits for a checkpoint is also written to the victim's status.preemption, so a
new leader (or a restarted operator) continues it with the same deadline (`restore`) instead of
starting the grace period over or forgetting it.

A victim whose job asks for it (checkpoint.requestOnPreemption) gets the checkpoint-requested
annotation and up to gracePeriodSeconds to report a newer checkpoint; the scheduling loop keeps
running meanwhile and wakes up at the deadline. Until the eviction starts, the core may call a
preemption off (`Decisions.abandon`: no waiting job counts on the victim any more and its queue's
quota admits it where it runs); the loop then clears status.preemption and the pods' request
annotation, and the victim keeps running. Stops (suspend, drain) are never called off.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuq.api.trainingjob import PLACED_PHASES, CheckpointReport, PreemptionStatus
from gpuq.controller.objects import JobEntry
from gpuq.controller.status import when

# Evictions no job asked for, named in Eviction.for_job (and status.preemption.preemptor).
STOP_SUSPEND = "suspend"  # spec.suspend
STOP_DRAIN = "queue-drain"  # its GPUQueue's stopPolicy HoldAndDrain
STOPS = (STOP_SUSPEND, STOP_DRAIN)


@dataclass(slots=True)
class Eviction:
    victim: str
    for_job: str
    reason: str
    requested_at: float
    deadline: float
    baseline: CheckpointReport | None  # the victim's checkpoint when we asked
    evicted: bool = False  # pods deleted; waiting for them to be gone
    move: bool = False  # stopped to be moved elsewhere (consolidation), not displaced

    @property
    def is_stop(self) -> bool:
        """A suspension or a queue drain, not a preemption for another job."""
        return self.for_job in STOPS

    def describe(self) -> str:
        # The core's reasons name the preemptor already ("preempted by X (priority ...)").
        if self.is_stop or self.for_job in self.reason:
            return self.reason
        return f"preempted by {self.for_job} ({self.reason})"

    def to_status(self) -> PreemptionStatus:
        return PreemptionStatus(
            preemptor=self.for_job,
            reason=self.reason,
            requested_at=when(self.requested_at),
            deadline=when(self.deadline),
            checkpoint_before=self.baseline,
        )


class PreemptionTracker:
    def __init__(self) -> None:
        self._by_victim: dict[str, Eviction] = {}

    def __contains__(self, victim: str) -> bool:
        return victim in self._by_victim

    def get(self, victim: str) -> Eviction | None:
        return self._by_victim.get(victim)

    def all(self) -> list[Eviction]:
        return list(self._by_victim.values())

    def restore(self, jobs: Iterable[JobEntry]) -> None:
        """Preemptions recorded in the status of placed jobs (a new leadership term starts)."""
        for job in jobs:
            p = job.status.preemption
            if p is None or job.status.phase not in PLACED_PHASES or job.key in self._by_victim:
                continue
            self._by_victim[job.key] = Eviction(
                job.key,
                p.preemptor,
                p.reason,
                p.requested_at.timestamp(),
                p.deadline.timestamp(),
                p.checkpoint_before,
            )

    def start(
        self,
        victim: str,
        for_job: str,
        reason: str,
        now: float,
        grace_seconds: float,
        baseline: CheckpointReport | None,
        move: bool = False,
    ) -> Eviction:
        ev = Eviction(victim, for_job, reason, now, now + grace_seconds, baseline, move=move)
        self._by_victim[victim] = ev
        return ev

    @staticmethod
    def checkpointed(ev: Eviction, latest: CheckpointReport | None) -> bool:
        """A checkpoint newer than the one the victim had when we asked."""
        if latest is None:
            return False
        if ev.baseline is None:
            return True
        return (latest.time, latest.step) > (ev.baseline.time, ev.baseline.step)

    def due(self, ev: Eviction, latest: CheckpointReport | None, now: float) -> bool:
        """Evict now: the victim checkpointed, or its grace period is over."""
        return not ev.evicted and (now >= ev.deadline or self.checkpointed(ev, latest))

    def mark_evicted(self, victim: str) -> None:
        ev = self._by_victim.get(victim)
        if ev is not None:
            ev.evicted = True

    def finish(self, victim: str) -> Eviction | None:
        return self._by_victim.pop(victim, None)

    def next_deadline(self) -> float | None:
        pending = [e.deadline for e in self._by_victim.values() if not e.evicted]
        return min(pending) if pending else None


HOUR = 3600.0


class PreemptionLog:
    """When each queue lost a job to preemption in the last hour (GPUQueue status.recentPreemptions):
    the count is the core's input for the queue's maxPreemptionsPerHour."""

    def __init__(self) -> None:
        self._times: dict[str, list[float]] = {}

    def restore(self, times: dict[str, list[float]]) -> None:
        for queue, ts in times.items():
            self._times[queue] = sorted(set(self._times.get(queue, [])) | set(ts))

    def add(self, queue: str, when: float) -> None:
        self._times.setdefault(queue, []).append(when)

    def discard(self, queue: str, when: float) -> None:
        """A preemption called off before its eviction: it costs the queue nothing."""
        times = self._times.get(queue, [])
        if when in times:
            times.remove(when)

    def times(self, queue: str, now: float) -> list[float]:
        kept = self._times.get(queue)
        if not kept:
            return []
        recent = [t for t in kept if now - t < HOUR]
        if recent:
            self._times[queue] = recent
        else:
            del self._times[queue]  # only queues that lost a job in the last hour are walked
        return recent

    def recent(self, now: float) -> dict[str, tuple[float, ...]]:
        """Every queue's preemptions in the last hour (queues with none are left out)."""
        return {q: tuple(ts) for q in list(self._times) if (ts := self.times(q, now))}

    def counts(self, now: float) -> dict[str, int]:
        return {q: len(ts) for q, ts in self.recent(now).items()}
