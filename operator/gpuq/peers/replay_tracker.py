"""What a trace replay (bench/replay.py) records of each job, from the pod events the API server
sends, the same way for every side (gpuq, Kueue, kube-scheduler alone): when each job was created,
each *run* (every worker's pod bound and started, until one of them fails or goes), and when it
finished (every worker's pod of one run Succeeded). Times are when the watch delivered the event,
in seconds since the replay started, so no side's own status writes (and their latency) decide.

Pure: the bench feeds it events, gpuq.peers.replay_figures turns its `observed()` into figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuq.peers.replay_figures import Observed, Run


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One trace job as replayed: its name on the cluster, queue, shape and compressed times."""

    name: str
    queue: str
    priority: int
    submit: float  # seconds after the replay's start
    duration: float  # seconds at full speed
    workers: int
    gpus_per_worker: int
    cpu_millis: int = 0  # per worker, as the simulator asks (the trace's, or its per-GPU default)
    memory_bytes: int = 0


@dataclass
class _Pod:
    node: str | None
    phase: str


@dataclass
class _Job:
    spec: ReplayJob
    created: float | None = None
    pods: dict[str, _Pod] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    open: Run | None = None  # the run under way
    open_pods: frozenset[str] = frozenset()
    finished: float | None = None


class Tracker:
    """Runs and finishes of the replay's jobs, from their pods' events."""

    def __init__(self, jobs: Mapping[str, ReplayJob]) -> None:
        self._jobs = {name: _Job(spec) for name, spec in jobs.items()}

    def created(self, job: str, t: float) -> None:
        entry = self._jobs.get(job)
        if entry is not None and entry.created is None:
            entry.created = t

    def pod(self, job: str, pod: str, node: str | None, phase: str, t: float, deleted: bool = False) -> None:
        """A pod of `job` was added, changed or (deleted) removed."""
        entry = self._jobs.get(job)
        if entry is None or entry.finished is not None:
            return
        if deleted:
            entry.pods.pop(pod, None)
        else:
            entry.pods[pod] = _Pod(node, phase)
        self._advance(entry, t)

    def _advance(self, entry: _Job, t: float) -> None:
        """A run starts once every worker has a bound pod that runs (or already finished: without
        gang scheduling the first may be done before the last starts), ends when one of its pods
        fails or goes, and the job finishes when all of them succeeded."""
        started = {n: p for n, p in entry.pods.items() if p.node and p.phase in ("Running", "Succeeded")}
        if entry.open is not None and not entry.open_pods <= started.keys():
            self._close(entry, t)
        if entry.open is None and len(started) >= entry.spec.workers:
            chosen = sorted(started)[: entry.spec.workers]
            entry.open = Run(t, None, tuple(str(started[n].node) for n in chosen))
            entry.open_pods = frozenset(chosen)
        if entry.open is not None and all(entry.pods[n].phase == "Succeeded" for n in entry.open_pods):
            self._close(entry, t)
            entry.finished = t

    @staticmethod
    def _close(entry: _Job, t: float) -> None:
        assert entry.open is not None
        entry.runs.append(Run(entry.open.start, t, entry.open.nodes))
        entry.open, entry.open_pods = None, frozenset()

    def observed(self) -> list[Observed]:
        """Every job as recorded so far (a run still under way has no end)."""
        out = []
        for entry in self._jobs.values():
            spec = entry.spec
            runs = [*entry.runs, *([entry.open] if entry.open is not None else [])]
            out.append(
                Observed(
                    spec.name,
                    spec.queue,
                    spec.workers,
                    spec.gpus_per_worker,
                    spec.duration,
                    entry.created if entry.created is not None else spec.submit,
                    tuple(runs),
                    entry.finished,
                )
            )
        return out

    def unfinished(self) -> int:
        return sum(1 for entry in self._jobs.values() if entry.finished is None)
