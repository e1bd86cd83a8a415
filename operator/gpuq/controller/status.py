"""TrainingJob/GPUQueue status building blocks: conditions, Events, and minimal status patches.

Conditions (documented in docs/api.md):
  Admitted             True while the job holds a placement; False with the reason it does not.
  Blocked              True when something other than capacity keeps the job out (QueueNotFound,
                       NamespaceNotAllowed, UnknownTopologyLevel, InvalidPodTemplate, Invalid,
                       ExceedsCapacity, Suspended).
  PreemptionRequested  True while a preemption waits for the victim's checkpoint.
  CheckpointReportInvalid  True when the gpuq.dev/checkpoint annotation cannot be read.
GPUQueue conditions (gpuq.controller.queuehealth says why):
  Active               True (Ready) when the queue can admit jobs; False with the reason: InvalidSpec
                       (the spec fails gpuq's checks) or CannotAdmit (its quota admits no job).
  OverQuota            True while the queue holds more than its lowered quota allows (reason
                       NominalLowered, BorrowingLimitLowered or CohortQuotaLowered); absent otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuq.api.meta import Condition, ConditionStatus
from gpuq.controller.queuehealth import OverQuota
from gpuq.core.reasons import counted

ADMITTED = "Admitted"
BLOCKED = "Blocked"
PREEMPTION_REQUESTED = "PreemptionRequested"
CHECKPOINT_INVALID = "CheckpointReportInvalid"
ACTIVE = "Active"  # GPUQueue: True when it can admit jobs, False (InvalidSpec, CannotAdmit) otherwise
OVER_QUOTA = "OverQuota"  # GPUQueue: True while it holds more than its (lowered) quota allows


@dataclass(frozen=True, slots=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


def normal(reason: str, message: str) -> Event:
    return Event("Normal", reason, message)


def warning(reason: str, message: str) -> Event:
    return Event("Warning", reason, message)


def on_nodes(placement: Sequence[str], show: int = 8) -> str:
    """'2 workers on 1 node: n0' for a placement (rank -> node): each node named once."""
    nodes = sorted(set(placement))
    names = ", ".join(nodes[:show]) + (" ..." if len(nodes) > show else "")
    return f"{counted(len(placement), 'worker')} on {counted(len(nodes), 'node')}: {names}"


def when(epoch: float) -> datetime:
    return datetime.fromtimestamp(int(epoch), UTC)


def with_condition(
    conditions: Sequence[Condition], type_: str, status: bool, reason: str, message: str, now: float
) -> list[Condition]:
    """Conditions with `type_` set; lastTransitionTime moves only when the status flips."""
    new_status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    out: list[Condition] = []
    found = False
    for c in conditions:
        if c.type != type_:
            out.append(c)
            continue
        found = True
        changed = c.status != new_status
        out.append(
            Condition(
                type=type_,
                status=new_status,
                reason=reason,
                message=message,
                last_transition_time=when(now)
                if changed or c.last_transition_time is None
                else c.last_transition_time,
            )
        )
    if not found:
        out.append(
            Condition(
                type=type_, status=new_status, reason=reason, message=message, last_transition_time=when(now)
            )
        )
    return out


def queue_conditions(
    conditions: Sequence[Condition],
    error: str | None,
    cannot_admit: str | None,
    over_quota: OverQuota | None,
    now: float,
) -> list[Condition]:
    """A GPUQueue's conditions: `error` (its spec failed gpuq's checks), `cannot_admit` and
    `over_quota` (gpuq.controller.queuehealth) say what is wrong, None when nothing is."""
    if error is not None:
        out = with_condition(conditions, ACTIVE, False, "InvalidSpec", error, now)
    elif cannot_admit is not None:
        out = with_condition(conditions, ACTIVE, False, "CannotAdmit", cannot_admit, now)
    else:
        out = with_condition(conditions, ACTIVE, True, "Ready", "the queue admits jobs", now)
    if over_quota is None:
        return without_condition(out, OVER_QUOTA)
    return with_condition(out, OVER_QUOTA, True, over_quota.reason, over_quota.message, now)


# Queue conditions that are a problem in this state, and whether a new message alone is news (not
# for OverQuota, whose message carries the live usage); a Warning Event reports each as it appears.
_QUEUE_PROBLEMS = {ACTIVE: (ConditionStatus.FALSE, True), OVER_QUOTA: (ConditionStatus.TRUE, False)}


def queue_warnings(old: Sequence[Condition], new: Sequence[Condition]) -> tuple[Event, ...]:
    """Warning Events for the queue problems `new` has and `old` had not (or not so)."""
    events = []
    for type_, (bad, by_message) in _QUEUE_PROBLEMS.items():
        cond, before = condition(new, type_), condition(old, type_)
        if cond is None or cond.status != bad:
            continue
        key = (cond.status, cond.reason, cond.message if by_message else "")
        if before is None or (before.status, before.reason, before.message if by_message else "") != key:
            events.append(warning(cond.reason, cond.message))
    return tuple(events)


def without_condition(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c.type != type_]


def condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    for c in conditions:  # a loop, not next(genexpr): asked per job, twice, in a first cycle
        if c.type == type_:
            return c
    return None


def is_true(conditions: Sequence[Condition], type_: str) -> bool:
    c = condition(conditions, type_)
    return c is not None and c.status == ConditionStatus.TRUE


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if hasattr(value, "value"):  # enums
        return value.value
    return value


def patch(current: Any, **fields: Any) -> dict[str, Any]:
    """A merge patch of the fields (snake_case names of the status model) whose value differs from
    `current`; None clears a field. Empty when nothing changes, so callers can skip the write."""
    out: dict[str, Any] = {}
    if not fields:
        return out  # the common case in a term's first cycle: every job looked at, most unchanged
    model_fields = type(current).model_fields
    for name, value in fields.items():
        if _plain(getattr(current, name)) == _plain(value):
            continue
        alias = model_fields[name].alias or name
        out[alias] = _plain(value)
    return out
