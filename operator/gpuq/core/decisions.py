"""What one scheduling cycle decides. The writer (operator) or the simulator carries these out."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class PendingCode(StrEnum):
    """Why a job is pending, as a stable machine-readable word (Pending.code)."""

    QUOTA = "Quota"  # its queue (or the cohort) has no quota left for it
    PLACEMENT = "Placement"  # quota is fine but no node set can hold the gang now
    UNSCHEDULABLE = "Unschedulable"  # no node can ever match its constraints / shape
    PREEMPTING = "Preempting"  # waiting for preempted gangs to release their resources
    STRICT_FIFO = "StrictFIFO"  # blocked behind its queue's head
    BACKOFF = "Backoff"  # restart back-off after a failure
    CYCLE_LIMIT = "CycleLimit"  # max_admissions_per_cycle reached; retried next cycle
    NO_QUEUE = "NoQueue"  # its GPUQueue does not exist
    INVALID = "Invalid"  # its spec is invalid (e.g. zero replicas)


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
    # Restart back-off: the job may not be re-placed before this time (store it as Job.not_before).
    # Equal to `now` for a first restart, which is then re-placed in the same cycle (Admit restart=True).
    not_before: float = 0.0


@dataclass(frozen=True, slots=True)
class Pending:
    job: str
    reason: str  # human explanation, e.g. "needs 4x8 GPUs in one rack; best rack has 24 free"
    position: int  # 1-based position in its queue
    # Machine-readable class of the reason (a PendingCode value), for conditions and metrics.
    code: str = ""
    # Nodes reserved for this job (rank -> node) while it waits for preempted gangs to release their
    # resources, like kube-scheduler's nominatedNodeName. Informational: the next cycle decides again.
    nominated: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Decisions:
    admit: tuple[Admit, ...] = ()
    preempt: tuple[Preempt, ...] = ()
    restart: tuple[Restart, ...] = ()
    pending: tuple[Pending, ...] = ()
    # Diagnostics for logs/metrics: queue name -> GPUs in use / borrowed after this cycle.
    queue_usage: dict[str, int] = field(default_factory=dict)
    queue_borrowed: dict[str, int] = field(default_factory=dict)
