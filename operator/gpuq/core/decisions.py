"""What one scheduling cycle decides. The writer (operator) or the simulator carries these out."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class PendingCode(StrEnum):
    """Why a job is pending, as a stable machine-readable word (Pending.code, status.reason and the
    Admitted condition's reason). Tools and alerts match on these; the message keeps the numbers.
    docs/api.md lists them with what unblocks each."""

    # Quota
    QUOTA_EXCEEDED = "QuotaExceeded"  # its queue (no cohort) or its model quota has no room left
    BORROWING_LIMIT = "BorrowingLimit"  # it would borrow more than the queue's borrowingLimitGPUs
    COHORT_EXHAUSTED = "CohortExhausted"  # the cohort lends too little (or peers borrow what q lent)
    BEHIND_QUEUE_HEAD = "BehindQueueHead"  # StrictFIFO, or the queue keeps quota for a starving head
    HELD = "Held"  # its queue's stopPolicy holds admissions
    # Nodes: possible later
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"  # fewer free GPUs on eligible nodes than it needs
    FRAGMENTED = "Fragmented"  # enough free GPUs, but no node set / domain holds the gang
    WAITING_FOR_PREEMPTION = "WaitingForPreemption"  # preempted gangs are releasing its resources
    # Nodes: never, until the nodes or the job change
    NO_MATCHING_NODES = "NoMatchingNodes"  # no schedulable node passes its constraints
    TOPOLOGY_UNSATISFIABLE = "TopologyUnsatisfiable"  # no domain of its Required level is big enough
    EXCEEDS_CAPACITY = "ExceedsCapacity"  # more than its eligible nodes hold even when empty
    # Other
    BACKING_OFF = "BackingOff"  # restart back-off after a failure
    CYCLE_LIMIT = "CycleLimit"  # maxAdmissionsPerCycle reached; retried next cycle
    QUEUE_NOT_FOUND = "QueueNotFound"  # its GPUQueue does not exist
    INVALID = "Invalid"  # its spec is invalid (e.g. a Required level the topology lacks)


# Codes whose job could fit once running jobs finish (reservations for starving heads apply to them).
CAPACITY_CODES = frozenset({PendingCode.INSUFFICIENT_CAPACITY, PendingCode.FRAGMENTED})
# Codes no finishing job can lift: only node changes or a different spec help.
NEVER_CODES = frozenset(
    {PendingCode.NO_MATCHING_NODES, PendingCode.TOPOLOGY_UNSATISFIABLE, PendingCode.EXCEEDS_CAPACITY}
)


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
    # Stopped to be moved, not displaced (consolidation): it restarts on free GPUs elsewhere.
    move: bool = False


@dataclass(frozen=True, slots=True)
class Abandon:
    """Call off the preemption of a gang being evicted (still holding its resources): no waiting job
    counts on it any more, and its queue's quota admits it where it runs, so evicting it would buy
    nothing (docs/scheduling.md, "Preemptions that buy nothing"). It keeps running."""

    victim: str
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
    abandon: tuple[Abandon, ...] = ()
    # Diagnostics for logs/metrics: queue name -> GPUs in use / borrowed after this cycle.
    queue_usage: dict[str, int] = field(default_factory=dict)
    queue_borrowed: dict[str, int] = field(default_factory=dict)
    # When time alone may change the next cycle's decisions (a head starts starving, a running job
    # passes its minimum run or reaches an attained-service level): the shell runs a cycle then.
    wake_at: float | None = None
    # `pending` queue by queue: (queue, its Pendings). A queue's tuple is the very object of the last
    # explaining cycle when nothing it is made of changed, so the shell can skip what it derived
    # from it then (empty from cores that do not group them: the shell reads `pending` alone).
    pending_by_queue: tuple[tuple[str, tuple[Pending, ...]], ...] = ()

    def pending_queues(self) -> tuple[tuple[str, tuple[Pending, ...]], ...]:
        """`pending_by_queue`, or all of `pending` as one group from a core that does not group."""
        return self.pending_by_queue or (("", self.pending),)
