"""Metrics of one simulated run: job times, cluster use over time, placement quality, disruption.

Definitions (also in docs/simulator.md):
- JCT = finish - submit; queueing delay = first start - submit (finished jobs only); JCT - run time
  = JCT minus the run time at full speed (it also counts waits after a preemption, which queueing
  delay does not).
- GPU allocation = time-average of GPUs held by any pod (partial gangs included) / cluster GPUs;
  GPU busy = the same for GPUs of gangs that are actually running.
- fragmentation = time-average of idle healthy GPUs that no pending gang could use (ignoring quota:
  a gang can use a node's idle GPUs if it fits a worker there and the cluster has room for all of
  its workers), / cluster GPUs. Zero while nothing is pending.
- communication: per run segment of a multi-GPU job, the fraction of its GPU pairs on different
  nodes / racks / blocks, and the mean pair cost with the core's weights; averaged weighted by the
  segment's GPU-time.
- ETTR (effective training time ratio, as Meta defines it for Llama 3 / RSC: productive time over
  time held) = GPU-time spent making progress that was kept / all GPU-time held. Work lost at a failure
  or kill, restart start-up, checkpoint saves on request and partial gangs waiting lower it; running
  slower on a spread-out placement does not (that is still training).
- useful ratio = GPU-time of finished jobs at full speed / all GPU-time held (slowdown lowers it too).
- Jain's fairness over queues of x_q = mean(duration / JCT) of the queue's finished jobs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuq.core.config import ScoringWeights
from gpuq.sim.speed import Spread

LEVEL_NAMES = ("zone", "block", "rack", "node")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of unsorted values; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float]) -> dict[str, float]:
    avg = sum(values) / len(values) if values else math.nan
    return {"avg": avg, "p50": percentile(values, 50), "p99": percentile(values, 99)}


def jain(values: Iterable[float]) -> float:
    xs = [v for v in values if not math.isnan(v)]
    square_sum = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * square_sum) if xs and square_sum else math.nan


def fragmented_gpus(free_hist: Sequence[int], pending_shapes: Mapping[tuple[int, int], int]) -> int:
    """Idle healthy GPUs that no pending gang could use (quota and constraints ignored).
    `free_hist[f]`: healthy nodes with f free GPUs (indexed up to the largest node's GPUs);
    `pending_shapes`: (workers still needed, GPUs each) -> how many pending gangs have that shape."""
    idle = sum(f * n for f, n in enumerate(free_hist))
    if not idle:
        return 0
    smallest_need: dict[int, int] = {}
    for (replicas, per_worker), count in pending_shapes.items():
        if count > 0 and replicas < smallest_need.get(per_worker, 1 << 62):
            smallest_need[per_worker] = replicas
    threshold = len(free_hist)  # smallest worker size some pending gang can be placed with
    for per_worker, replicas in smallest_need.items():
        if per_worker < threshold and per_worker < len(free_hist):
            slots = sum((f // per_worker) * n for f, n in enumerate(free_hist) if f >= per_worker)
            if slots >= replicas:
                threshold = per_worker
    usable = sum(f * n for f, n in enumerate(free_hist) if f >= threshold)
    return idle - usable


@dataclass(frozen=True, slots=True)
class JobOutcome:
    key: str
    queue: str
    gpus: int
    duration: float  # at full speed
    submit: float
    first_start: float
    finish: float

    @property
    def jct(self) -> float:
        return self.finish - self.submit

    @property
    def queueing_delay(self) -> float:
        return self.first_start - self.submit


@dataclass
class CommAccumulator:
    """GPU-time-weighted sums of crossing fractions and pair cost."""

    gpu_seconds: float = 0.0
    crossing: list[float] = field(default_factory=lambda: [0.0] * len(LEVEL_NAMES))
    cost: float = 0.0
    segments: int = 0

    def add(self, spread: Spread, gpu_seconds: float, weights: ScoringWeights) -> None:
        self.gpu_seconds += gpu_seconds
        self.segments += 1
        for level in range(len(LEVEL_NAMES)):
            self.crossing[level] += spread.fraction(level) * gpu_seconds
        self.cost += spread.cost_per_pair(weights) * gpu_seconds

    def summary(self) -> dict[str, float]:
        w = self.gpu_seconds
        out = {f"cross_{name}": (self.crossing[i] / w if w else 0.0) for i, name in enumerate(LEVEL_NAMES)}
        out["cost_per_pair"] = self.cost / w if w else 0.0
        out["segments"] = float(self.segments)
        return out


class Recorder:
    """Integrates piecewise-constant cluster levels over virtual time and collects job outcomes."""

    def __init__(self, total_gpus: int, weights: ScoringWeights, large_job_gpus: int) -> None:
        self.total_gpus = total_gpus
        self.weights = weights
        self.large_job_gpus = large_job_gpus
        self.start: float | None = None
        self.last_t = 0.0
        self.levels = (0, 0, 0)  # allocated, busy, fragmented GPUs
        self.integrals = [0.0, 0.0, 0.0]
        self.timeline: list[tuple[float, int, int, int, int]] = []  # t, allocated, busy, fragmented, pending
        self.outcomes: list[JobOutcome] = []
        self.comm_multi = CommAccumulator()
        self.comm_large = CommAccumulator()
        self.preemptions = 0
        self.restarts = 0
        self.lost_gpu_seconds = 0.0  # work since the last checkpoint, thrown away at evictions
        self.overhead_gpu_seconds = 0.0  # restart start-up and checkpoint saves of evicted gangs
        self.productive_gpu_seconds = 0.0  # GPU-time making progress that was kept (ETTR)
        self.end = 0.0

    def advance(self, t: float) -> None:
        if self.start is None:
            self.start = self.last_t = t
        dt = t - self.last_t
        if dt > 0:
            for i, level in enumerate(self.levels):
                self.integrals[i] += level * dt
            self.last_t = t

    def set_levels(self, t: float, allocated: int, busy: int, fragmented: int, pending: int) -> None:
        self.advance(t)
        levels = (allocated, busy, fragmented)
        last = self.timeline[-1] if self.timeline else None
        if last is None or last[1:4] != levels or last[4] != pending:
            if last is not None and last[0] == t:
                self.timeline[-1] = (t, *levels, pending)
            else:
                self.timeline.append((t, *levels, pending))
        self.levels = levels

    def segment(self, spread: Spread, start: float, end: float) -> None:
        """A multi-GPU job ran from start to end on one placement."""
        if spread.gpus < 2 or end <= start:
            return
        gpu_seconds = spread.gpus * (end - start)
        self.comm_multi.add(spread, gpu_seconds, self.weights)
        if spread.gpus >= self.large_job_gpus:
            self.comm_large.add(spread, gpu_seconds, self.weights)

    def finished(self, outcome: JobOutcome) -> None:
        self.outcomes.append(outcome)
        self.end = max(self.end, outcome.finish)

    def summary(self, jobs_total: int) -> dict[str, Any]:
        span = (self.last_t - self.start) if self.start is not None else 0.0
        capacity = self.total_gpus * span
        allocated, busy, fragmented = (value / capacity if capacity else 0.0 for value in self.integrals)
        useful = sum(o.gpus * o.duration for o in self.outcomes)
        per_queue: dict[str, dict[str, Any]] = {}
        for queue in sorted({o.queue for o in self.outcomes}):
            mine = [o for o in self.outcomes if o.queue == queue]
            per_queue[queue] = {
                "jobs": len(mine),
                "jct": distribution([o.jct for o in mine]),
                "queueing_delay": distribution([o.queueing_delay for o in mine]),
                "progress_rate": sum(o.duration / o.jct for o in mine if o.jct > 0) / len(mine),
            }
        return {
            "jobs": jobs_total,
            "finished": len(self.outcomes),
            "unfinished": jobs_total - len(self.outcomes),
            "jct": distribution([o.jct for o in self.outcomes]),
            "queueing_delay": distribution([o.queueing_delay for o in self.outcomes]),
            # Everything a job spent not making progress at full speed: waits before its first start
            # and after preemptions or failures, restart overheads, slowdown.
            "jct_minus_run": distribution([o.jct - o.duration for o in self.outcomes]),
            "makespan": (self.end - self.start) if self.start is not None and self.outcomes else math.nan,
            "gpu_allocation": allocated,
            "gpu_busy": busy,
            "fragmentation": fragmented,
            "comm_multi_gpu": self.comm_multi.summary(),
            "comm_large": self.comm_large.summary(),
            "preemptions": self.preemptions,
            "restarts": self.restarts,
            "lost_gpu_hours": self.lost_gpu_seconds / 3600.0,
            "overhead_gpu_hours": self.overhead_gpu_seconds / 3600.0,
            "ettr": self.productive_gpu_seconds / self.integrals[0] if self.integrals[0] else math.nan,
            "useful_ratio": useful / self.integrals[0] if self.integrals[0] else math.nan,
            "jain_fairness": jain(q["progress_rate"] for q in per_queue.values()),
            "per_queue": per_queue,
        }
