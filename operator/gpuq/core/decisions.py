"""What one scheduling cycle decides. The writer (operator) or the simulator carries these out."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Admit:
    job: str
    placement: tuple[str, ...]  # rank -> node name
    comm_cost: float  # communication cost of the placement (see gpuq.core.topology)
    borrowed_gpus: int = 0  # GPUs of this admission above the queue's nominal quota
    restart: bool = False  # re-placement of a recovering job


@dataclass(frozen=True, slots=True)
class Preempt:
    victim: str
    for_job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Restart:
    job: str
    failed_nodes: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Pending:
    job: str
    reason: str  # human explanation, e.g. "needs 4x8 GPUs in one rack; best rack has 24 free"
    position: int  # 1-based position in its queue


@dataclass(frozen=True, slots=True)
class Decisions:
    admit: tuple[Admit, ...] = ()
    preempt: tuple[Preempt, ...] = ()
    restart: tuple[Restart, ...] = ()
    pending: tuple[Pending, ...] = ()
    # Diagnostics for logs/metrics: queue name -> GPUs in use / borrowed after this cycle.
    queue_usage: dict[str, int] = field(default_factory=dict)
    queue_borrowed: dict[str, int] = field(default_factory=dict)
