"""The figures of a trace replay (bench/replay.py, issue 32), computed from what the API server said
about each job, by the simulator's own definitions (gpuq.sim.metrics): one home for JCT, queueing
delay, communication cost per pair, fragmentation, utilization and makespan, so a replay on a real
cluster and a simulation of the same slice are compared figure for figure.

Pure: the bench turns its watches into `Observed` jobs (seconds since the replay started), this
module turns them into figures. Nothing here knows which scheduler ran the jobs.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuq.core.config import ScoringWeights
from gpuq.sim.metrics import JobOutcome, Recorder, fragmented_gpus
from gpuq.sim.speed import spread


@dataclass(frozen=True, slots=True)
class Run:
    """One placement of a job: every worker bound (`nodes`, by rank) from `start` until `end`
    (None: still holding them when the replay ended)."""

    start: float
    end: float | None
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Observed:
    """One job as the API server recorded it on one side."""

    key: str
    queue: str
    workers: int
    gpus_per_worker: int
    duration: float  # its run time at full speed, as submitted (already compressed)
    created: float
    runs: tuple[Run, ...] = ()  # in order; a preempted or failed-over job has several
    finished: float | None = None  # it succeeded (None: it never did)

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker


@dataclass(frozen=True, slots=True)
class Cluster:
    """GPUs per node and each node's topology path (zone, block, rack, node), as the simulator's."""

    gpus: Mapping[str, int]
    paths: Mapping[str, tuple[str, ...]]

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus.values())


DEFAULT_WEIGHTS = ScoringWeights()  # the core's, as the simulator scores communication
# Event kinds, in the order they apply at one instant: a release first (a gang that finishes frees
# its GPUs for one that starts the same second), then arrivals (a job may start as it arrives).
_END, _ARRIVE, _START = 0, 1, 2


def figures(
    jobs: Sequence[Observed],
    cluster: Cluster,
    weights: ScoringWeights = DEFAULT_WEIGHTS,
    large_job_gpus: int = 8,
    until: float | None = None,
) -> dict[str, Any]:
    """The simulator's summary (gpuq.sim.metrics.Recorder.summary) of the observed jobs: GPUs held
    by placed gangs over time, fragmentation while any job waits, one communication segment per
    run, one outcome per finished job. `until`: when the replay stopped (default: the last event)."""
    recorder = Recorder(cluster.total_gpus, weights, large_job_gpus)
    free = dict(cluster.gpus)
    hist = Counter(free.values())
    pending: Counter[tuple[int, int]] = Counter()
    waiting: set[str] = set()
    allocated = 0
    size = max(cluster.gpus.values(), default=0) + 1
    events = list(_events(jobs))
    heapq.heapify(events)
    last = 0.0
    while events:
        t, kind, _, job, run = heapq.heappop(events)
        shape = (job.workers, job.gpus_per_worker)
        if kind == _ARRIVE:
            pending[shape] += 1
            waiting.add(job.key)
        elif kind == _START:
            if job.key in waiting:
                waiting.discard(job.key)
                _drop(pending, shape)
            allocated += _take(free, hist, run.nodes, job.gpus_per_worker, -1)
        else:
            allocated -= _take(free, hist, run.nodes, job.gpus_per_worker, +1)
            if job.finished is None or run is not job.runs[-1]:
                pending[shape] += 1  # evicted: it waits again
                waiting.add(job.key)
        last = t
        count = sum(pending.values())
        frag = fragmented_gpus(_histogram(hist, size), pending) if count else 0
        recorder.set_levels(t, allocated, allocated, frag, count)
    recorder.advance(max(last, until or last))
    # No node fails in a replay: every run after a job's first follows an eviction.
    recorder.preemptions = sum(max(0, len(job.runs) - 1) for job in jobs)
    for job in jobs:
        for run in job.runs:
            end = run.end if run.end is not None else (until or last)
            recorder.segment(spread(run.nodes, job.gpus_per_worker, cluster.paths), run.start, end)
        if job.finished is not None and job.runs:
            recorder.finished(
                JobOutcome(
                    job.key, job.queue, job.gpus, job.duration, job.created, job.runs[0].start, job.finished
                )
            )
    return recorder.summary(len(jobs))


def _events(jobs: Iterable[Observed]) -> Iterable[tuple[float, int, int, Observed, Run]]:
    """(time, kind, a tie-breaker, job, run) per arrival (with an empty run), run start and run end."""
    seq = 0
    for job in jobs:
        seq += 1
        yield (job.created, _ARRIVE, seq, job, Run(job.created, None, ()))
        for run in job.runs:
            seq += 1
            yield (run.start, _START, seq, job, run)
            if run.end is not None:
                seq += 1
                yield (run.end, _END, seq, job, run)


def _take(free: dict[str, int], hist: Counter[int], nodes: Sequence[str], per_worker: int, sign: int) -> int:
    """Free (sign +1) or take (-1) `per_worker` GPUs on each of `nodes`; the GPUs moved."""
    for node in nodes:
        hist[free[node]] -= 1
        free[node] += sign * per_worker
        hist[free[node]] += 1
    return len(nodes) * per_worker


def _drop(pending: Counter[tuple[int, int]], shape: tuple[int, int]) -> None:
    pending[shape] -= 1
    if not pending[shape]:
        del pending[shape]


def _histogram(hist: Counter[int], size: int) -> list[int]:
    """Nodes by free GPUs as a list indexed by free GPUs up to the largest node's (as the simulator
    keeps it: what fragmented_gpus reads)."""
    return [hist.get(f, 0) for f in range(size)]
