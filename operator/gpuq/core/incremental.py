"""A ClusterIndex kept across cycles by a caller that only has whole snapshots (the operator).

The simulator knows exactly what changed and feeds the index its deltas; the operator builds a
fresh Snapshot from its cache each cycle. `snapshot_delta` recovers the deltas by comparing the two
snapshots (objects the caller reused compare by identity, the rest by value), and
`IncrementalSchedule` applies them before calling `schedule`: decisions are identical to a fresh
index's (the index rebuilds itself whenever the deltas do not add up), only the cost differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Decisions
from gpuq.core.index import ClusterIndex
from gpuq.core.model import Job, Node, Snapshot
from gpuq.core.scheduler import schedule

T = TypeVar("T", Node, Job)


@dataclass(frozen=True, slots=True)
class SnapshotDelta:
    nodes: tuple[Node, ...]  # added or changed
    removed_nodes: tuple[str, ...]
    jobs: tuple[Job, ...]  # added or changed
    removed_jobs: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.nodes) + len(self.removed_nodes) + len(self.jobs) + len(self.removed_jobs)


def _changed(old: Sequence[T], new: Sequence[T], name: str) -> tuple[tuple[T, ...], tuple[str, ...]]:
    before = {getattr(o, name): o for o in old}
    changed = []
    for o in new:
        prev = before.pop(getattr(o, name), None)
        if prev is not o and prev != o:
            changed.append(o)
    return tuple(changed), tuple(sorted(before))


def snapshot_delta(old: Snapshot, new: Snapshot) -> SnapshotDelta:
    nodes, removed_nodes = _changed(old.nodes, new.nodes, "name")
    jobs, removed_jobs = _changed(old.jobs, new.jobs, "key")
    return SnapshotDelta(nodes, removed_nodes, jobs, removed_jobs)


class IncrementalSchedule:
    """`schedule(snapshot, now, config)` with a ClusterIndex kept between calls."""

    def __init__(self, explain: bool = True) -> None:
        self.explain = explain
        self.index: ClusterIndex | None = None
        self.last_delta = 0  # objects the last call applied (0 after a rebuild)

    def __call__(
        self, snapshot: Snapshot, now: float, config: SchedulerConfig, *, explain: bool | None = None
    ) -> Decisions:
        """`explain`: this call's, instead of the one given at construction."""
        ix = self.index
        if ix is None or ix.config != config:
            ix = self.index = ClusterIndex(snapshot, config)
            self.last_delta = 0
        elif ix.snapshot is not snapshot:
            d = snapshot_delta(ix.snapshot, snapshot)
            gone = d.removed_jobs
            ix.apply(snapshot, nodes=d.nodes, removed_nodes=d.removed_nodes, jobs=d.jobs, removed_jobs=gone)
            self.last_delta = d.size
        try:
            return schedule(snapshot, now, config, ix, explain=self.explain if explain is None else explain)
        except Exception:
            self.index = None  # start from a fresh index next time, whatever went wrong
            raise
