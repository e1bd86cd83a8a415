"""Status patches that carry out the core's decisions (pure: time is an argument).

An admission's status follows its bound pods (gpuq.controller.record): the next attempt number,
the placement, and phase Admitted, or Running when the workers already run. Pending jobs get their
queue position and the core's reason; jobs kept out of the snapshot get condition Blocked with the
reason, plus a Warning Event the first time.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from gpuq.api.meta import ConditionStatus
from gpuq.api.trainingjob import Phase, PlacementEntry
from gpuq.controller import status as st
from gpuq.controller.objects import JobEntry
from gpuq.controller.snapshot import SUSPENDED, Exclusion
from gpuq.core.decisions import Admit, Pending


def all_workers(n: int, state: str) -> str:
    """'all 2 workers running', 'its worker running' (not 'all 1 workers')."""
    return f"its worker {state}" if n == 1 else f"all {n} workers {state}"


def _identity(job: JobEntry) -> dict[str, Any]:
    """Fields written with the job's first status (there is no separate "first seen" write)."""
    if job.spec is None:
        return {}
    w = job.spec.workers
    return {"gpus": w.replicas * w.gpus_per_worker, "observed_generation": job.generation}


def admission_message(placement: tuple[str, ...]) -> str:
    return f"admitted: {st.on_nodes(placement)}"


def admission_note(admit: Admit) -> str:
    """What the decision adds to the admission message (the placement itself is in the pods)."""
    return f"borrowing {admit.borrowed_gpus} GPUs from the cohort" if admit.borrowed_gpus else ""


def admit_status(
    job: JobEntry,
    placement: tuple[str, ...],
    admitted_at: float,
    now: float,
    running: bool = False,
    note: str = "",
) -> dict[str, Any]:
    """The status of an admission whose gang exists (gpuq.controller.record): the next attempt, its
    placement, and Running at once when every worker already runs."""
    s = job.status
    msg = admission_message(placement)
    if note:
        msg += f"; {note}"
    conds = st.with_condition(s.conditions, st.ADMITTED, True, "Admitted", msg, now)
    if running:
        msg = all_workers(len(placement), "running")
    return st.patch(
        s,
        phase=Phase.RUNNING if running else Phase.ADMITTED,
        attempt=s.attempt + 1,
        placement=[PlacementEntry(rank=r, node=n) for r, n in enumerate(placement)],
        admitted_at=st.when(admitted_at),
        started_at=st.when(now) if running else None,
        queue_position=None,
        not_before=None,
        reason=None,
        message=msg,
        conditions=st.without_condition(conds, st.BLOCKED),
        **({"rejections": 0} if running else {}),
        **_identity(job),
    )


def _waiting_phase(job: JobEntry) -> Phase:
    # Recovering says so while it waits for capacity; Preempted turns Queued once its pods are gone;
    # Suspended turns Queued once spec.suspend is false again.
    return job.status.phase if job.status.phase in (Phase.RECOVERING, Phase.PREEMPTED) else Phase.QUEUED


def pending_status(job: JobEntry, pending: Pending, now: float) -> dict[str, Any]:
    s = job.status
    reason = pending.code or "Pending"
    conds = st.with_condition(s.conditions, st.ADMITTED, False, reason, pending.reason, now)
    return st.patch(
        s,
        phase=_waiting_phase(job),
        queue_position=pending.position,
        reason=reason,
        message=pending.reason,
        conditions=st.without_condition(conds, st.BLOCKED),
        **_identity(job),
    )


class Change(Enum):
    """What `pending_status` would write for a pending job, told without building the patch."""

    NONE = "none"  # the status says it all already
    COSMETIC = "cosmetic"  # only numbers: the position, the message (`cosmetic`)
    MEANINGFUL = "meaningful"  # the phase, a reason code, a condition or the job's identity


def pending_change(job: JobEntry, pending: Pending) -> Change:
    """The kind of patch `pending_status(job, pending, now)` makes (empty: NONE, `cosmetic`:
    COSMETIC, else MEANINGFUL), from field comparisons alone: every pending job is classified
    every cycle, and building the patch (pydantic dumps of every condition) cost the operator a
    quarter of its time with 10,000 jobs waiting (bench/kueue_perf.py). Tests hold it to the rule."""
    s = job.status
    code = pending.code or "Pending"
    if s.phase != _waiting_phase(job) or s.reason != code:
        return Change.MEANINGFUL
    if any(getattr(s, k) != v for k, v in _identity(job).items()):
        return Change.MEANINGFUL
    if (pending.position is None) != (s.queue_position is None):
        return Change.MEANINGFUL
    admitted = st.condition(s.conditions, st.ADMITTED)
    if admitted is None or admitted.status != ConditionStatus.FALSE or admitted.reason != code:
        return Change.MEANINGFUL
    if st.condition(s.conditions, st.BLOCKED) is not None:
        return Change.MEANINGFUL
    if (
        s.queue_position != pending.position
        or s.message != pending.reason
        or admitted.message != pending.reason
        or admitted.last_transition_time is None
    ):
        return Change.COSMETIC
    return Change.NONE


def cosmetic(job: JobEntry, patch: dict[str, Any]) -> bool:
    """A status patch that only refreshes numbers (queue position, the message's live figures): the
    phase, every condition's status and reason (the code tools and alerts use), and whether the job
    has a position all stay as they are. Such writes are rate-limited; a change of meaning is not."""
    if not patch or set(patch) - {"queuePosition", "message", "conditions"}:
        return False
    if "queuePosition" in patch and (patch["queuePosition"] is None) != (job.status.queue_position is None):
        return False
    if "conditions" in patch:
        old = {(c.type, str(c.status.value), c.reason) for c in job.status.conditions}
        new = {(c["type"], c["status"], c.get("reason")) for c in patch["conditions"]}
        return old == new
    return True


def blocked_status(job: JobEntry, why: Exclusion, now: float) -> tuple[dict[str, Any], tuple[st.Event, ...]]:
    s = job.status
    old = st.condition(s.conditions, st.BLOCKED)
    conds = st.with_condition(s.conditions, st.BLOCKED, True, why.reason, why.message, now)
    conds = st.with_condition(conds, st.ADMITTED, False, why.reason, why.message, now)
    suspended = why.reason == SUSPENDED
    patch = st.patch(
        s,
        phase=Phase.SUSPENDED if suspended else _waiting_phase(job),
        queue_position=None,
        reason=why.reason,
        message=why.message,
        conditions=conds,
        **_identity(job),
    )
    is_new = old is None or old.status != ConditionStatus.TRUE or old.reason != why.reason
    # A running gang stopped by spec.suspend got its Suspended Event with its eviction already.
    if not is_new or (suspended and s.phase == Phase.SUSPENDED):
        return patch, ()
    # Suspension is what the user asked for: worth a Normal Event, not a Warning.
    return patch, ((st.normal if suspended else st.warning)(why.reason, why.message),)


def rollback_status(job: JobEntry, why: str, now: float) -> dict[str, Any]:
    """Undo an admission whose pods could not all be created and bound: back to the queue."""
    s = job.status
    msg = f"admission rolled back: {why}"
    return st.patch(
        s,
        phase=Phase.QUEUED,
        placement=[],
        admitted_at=None,
        reason=None,
        message=msg,
        conditions=st.with_condition(s.conditions, st.ADMITTED, False, "RolledBack", msg, now),
    )
