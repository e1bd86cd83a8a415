"""gpuq.core: pure, deterministic scheduling. No kubernetes/kopf imports, no I/O, no wall clock.

Entry point: `schedule(snapshot, now, config) -> Decisions`. A caller running many cycles may keep a
`ClusterIndex` and pass it as `index=` after `index.apply(snapshot, ...)` with the deltas since the last
cycle; decisions are identical, only faster. Semantics: docs/scheduling.md.
"""

from gpuq.core.config import FailoverConfig, SchedulerConfig, ScoringWeights
from gpuq.core.decisions import Abandon, Admit, Decisions, Pending, PendingCode, Preempt, Restart
from gpuq.core.index import ClusterIndex, SnapshotError
from gpuq.core.scheduler import schedule
from gpuq.core.topology import comm_cost, level_weights

__all__ = [
    "Abandon",
    "Admit",
    "ClusterIndex",
    "Decisions",
    "FailoverConfig",
    "Pending",
    "PendingCode",
    "Preempt",
    "Restart",
    "SchedulerConfig",
    "ScoringWeights",
    "SnapshotError",
    "comm_cost",
    "level_weights",
    "schedule",
]
