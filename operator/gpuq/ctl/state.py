"""The cluster as the operator would see it in its next cycle: the controller's own cache and
snapshot builder over fresh lists, and the core's decisions for that snapshot (pure once the bodies
are read: `State.of` takes bodies, a config and a time)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpuq.api.trainingjob import Phase
from gpuq.controller.cache import ClusterCache
from gpuq.controller.gangs.resolve import KINDS
from gpuq.controller.preemption import HOUR, PreemptionTracker
from gpuq.controller.snapshot import SnapshotBuilder, View
from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Decisions, Pending
from gpuq.core.index import ClusterIndex
from gpuq.core.model import Job, Queue
from gpuq.core.scheduler import schedule


@dataclass
class State:
    cache: ClusterCache
    config: SchedulerConfig
    now: float
    view: View
    ix: ClusterIndex
    decisions: Decisions

    @classmethod
    def of(
        cls,
        bodies: Iterable[Mapping[str, Any]],
        config: SchedulerConfig,
        now: float,
    ) -> State:
        cache = ClusterCache()
        upsert: dict[str, Callable[[Mapping[str, Any]], None]] = {
            "Node": cache.upsert_node,
            "GPUQueue": cache.upsert_queue,
            "Namespace": cache.upsert_namespace,
            "TrainingJob": cache.upsert_job,
            "Pod": cache.upsert_pod,
            "Gang": cache.upsert_gang,
            # Owners of gangs gpuq did not create: their pods and Gangs may come first (any order).
            **{k.kind: partial(cache.upsert_owner, k) for k in KINDS.values()},
        }
        for body in bodies:
            upsert[str(body["kind"])](body)
        view = SnapshotBuilder().build(cache, now, config, _evicting(cache), _recent_preemptions(cache, now))
        ix = ClusterIndex(view.snapshot, config)
        decisions = schedule(view.snapshot, now, config)
        return cls(cache, config, now, view, ix, decisions)

    # ---- lookups ----------------------------------------------------------------------------------
    def pending(self, key: str) -> Pending | None:
        return next((p for p in self.decisions.pending if p.job == key), None)

    def admitted_next(self, key: str) -> bool:
        return any(a.job == key for a in self.decisions.admit)

    def core_job(self, key: str) -> Job | None:
        return self.ix.jobs.get(key)

    def queues(self) -> dict[str, Queue]:
        return {q.name: q for q in self.view.snapshot.queues}


def _evicting(cache: ClusterCache) -> frozenset[str]:
    """Victims the operator is evicting, as a new leader restores them (PreemptionTracker.restore:
    a preemption recorded in a placed job's status), plus evictions whose pods are still leaving."""
    tracker = PreemptionTracker()
    tracker.restore(cache.jobs.values())
    leaving = {
        key
        for key, job in cache.jobs.items()
        if job.status.phase in (Phase.PREEMPTED, Phase.SUSPENDED)
        and any(p.live for p in cache.pods_of(key, job.uid))
    }
    return frozenset({e.victim for e in tracker.all()} | leaving)


def _recent_preemptions(cache: ClusterCache, now: float) -> dict[str, int]:
    """Victims each queue lost in the last hour (GPUQueue status.recentPreemptions)."""
    out = {}
    for name, q in cache.queues.items():
        n = sum(1 for t in q.status.recent_preemptions if now - t.timestamp() < HOUR)
        if n:
            out[name] = n
    return out
