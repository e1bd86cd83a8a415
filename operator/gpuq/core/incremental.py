"""A ClusterIndex kept across cycles by a caller that hands over whole snapshots (the operator).

The simulator knows exactly what changed and feeds the index its deltas. The operator's snapshot
builder knows it too (its cache is told by watch events) and hands `IncrementalSchedule` the delta
from the snapshot it built before (`SnapshotDelta.base`); when it cannot (no delta, or the index
holds another snapshot), `snapshot_delta` recovers the deltas by comparing the two snapshots
(objects the caller reused compare by identity, the rest by value). Either way decisions are
identical to a fresh index's (the index rebuilds itself whenever the deltas do not add up), only
the cost differs; `verify=True` checks that on every call.
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
    base: Snapshot | None = None  # the snapshot these changes apply to (None: unknown)

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


def _covers(handed: SnapshotDelta, recovered: SnapshotDelta) -> None:
    """Verify mode: the caller's delta names every object that comparing the snapshots finds changed
    (it may name more: an object rebuilt equal costs a little, one missed decides on a stale view)."""
    missing = (
        {n.name for n in recovered.nodes} - {n.name for n in handed.nodes},
        set(recovered.removed_nodes) - set(handed.removed_nodes),
        {j.key for j in recovered.jobs} - {j.key for j in handed.jobs},
        set(recovered.removed_jobs) - set(handed.removed_jobs),
    )
    if any(missing):
        raise AssertionError(f"the caller's delta misses changes (nodes, removed, jobs, removed): {missing}")


class IncrementalSchedule:
    """`schedule(snapshot, now, config)` with a ClusterIndex kept between calls."""

    def __init__(self, explain: bool = True, verify: bool = False) -> None:
        self.explain = explain
        # Every call also decides on a fresh index and fails loudly where the decisions differ
        # (slow: for tests, debugging and the benchmark's debug mode).
        self.verify = verify
        self.index: ClusterIndex | None = None
        self.last_delta = 0  # objects the last call applied (0 after a rebuild)
        self.handed = 0  # calls whose delta came from the caller, not from comparing snapshots

    def __call__(
        self,
        snapshot: Snapshot,
        now: float,
        config: SchedulerConfig,
        *,
        explain: bool | None = None,
        delta: SnapshotDelta | None = None,
    ) -> Decisions:
        """`explain`: this call's, instead of the one given at construction. `delta`: what changed
        since `delta.base`; used when the index holds that very snapshot, else recovered."""
        ix = self.index
        if ix is None or ix.config != config:
            ix = self.index = ClusterIndex(snapshot, config)
            self.last_delta = 0
        elif ix.snapshot is not snapshot:
            if delta is not None and delta.base is not None and delta.base is ix.snapshot:
                self.handed += 1
                d = delta
                if self.verify:
                    _covers(d, snapshot_delta(ix.snapshot, snapshot))
            else:
                d = snapshot_delta(ix.snapshot, snapshot)
            gone = d.removed_jobs
            ix.apply(snapshot, nodes=d.nodes, removed_nodes=d.removed_nodes, jobs=d.jobs, removed_jobs=gone)
            self.last_delta = d.size
        explain = self.explain if explain is None else explain
        try:
            decisions = schedule(snapshot, now, config, ix, explain=explain)
        except Exception:
            self.index = None  # start from a fresh index next time, whatever went wrong
            raise
        if self.verify:
            fresh = schedule(snapshot, now, config, ClusterIndex(snapshot, config), explain=explain)
            if fresh != decisions:
                self.index = None
                raise AssertionError(f"kept index decided {decisions} but a fresh one {fresh}")
        return decisions
