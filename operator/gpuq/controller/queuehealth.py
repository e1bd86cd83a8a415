"""What a GPUQueue's quota says about it beyond the schema (pure; docs/api.md, "GPUQueue").

The CRD schema checks each field, but not what the fields mean together or against what the queues
already hold: a queue that can admit no job at all, and one that holds more than its quota allows
now that its quota (or its cohort's) was lowered under it. The operator reports both as conditions
with a Warning Event (gpuq.controller.status); `gpuq doctor` asks the first question too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuq.core.model import Queue
from gpuq.core.quota import borrowing, lendable


def cannot_admit(q: Queue, queues: Mapping[str, Queue]) -> str | None:
    """Why the queue can admit no job whatever runs elsewhere (None when it can). A job needs at
    least one GPU, so a queue with no nominal quota admits only what it may borrow."""
    if q.nominal_gpus > 0:
        return None
    if q.cohort is None:
        return "nominalGPUs is 0 and the queue has no cohort to borrow from: it can admit no job"
    if q.borrowing_limit_gpus == 0:
        return "nominalGPUs and borrowingLimitGPUs are 0: it can admit no job"
    peers = [p for name, p in queues.items() if p.cohort == q.cohort and name != q.name]
    if not any(lendable(p, 0) > 0 for p in peers):
        lenders = "it is the only queue" if not peers else "no other queue lends GPUs"
        return (
            f"nominalGPUs is 0 and in cohort {q.cohort} {lenders} (nominalGPUs, lendingLimitGPUs): "
            "it can admit no job until one does"
        )
    return None


@dataclass(frozen=True, slots=True)
class OverQuota:
    reason: str  # NominalLowered, BorrowingLimitLowered or CohortQuotaLowered
    message: str


_NOT_EVICTED = "running jobs are not evicted for it"


def over_quotas(queues: Mapping[str, Queue], usage: Mapping[str, int]) -> dict[str, OverQuota]:
    """The queues that hold more GPUs than their quota allows now (`usage`: GPUs each holds): a
    quota was lowered under jobs already admitted. Nothing is evicted for it; new jobs are admitted
    only within the new quota (gpuq.core.quota), so it drains back as jobs finish."""
    # Per cohort: GPUs its queues borrow in all, and GPUs they lend (gpuq.core.quota's invariant:
    # the first must not exceed the second).
    borrowed_in: dict[str, int] = {}
    lent_in: dict[str, int] = {}
    for p in queues.values():
        if p.cohort is not None:
            used = usage.get(p.name, 0)
            borrowed_in[p.cohort] = borrowed_in.get(p.cohort, 0) + borrowing(p, used)
            lent_in[p.cohort] = lent_in.get(p.cohort, 0) + lendable(p, used)
    out = {}
    for name, q in queues.items():
        used = usage.get(name, 0)
        if used <= q.nominal_gpus:
            continue
        if q.cohort is None:
            out[name] = OverQuota(
                "NominalLowered",
                f"holds {used} GPUs, above its nominalGPUs {q.nominal_gpus}: {_NOT_EVICTED}; new jobs "
                "are admitted only within the quota",
            )
            continue
        borrowed, limit = used - q.nominal_gpus, q.borrowing_limit_gpus
        held = f"borrows {borrowed} GPUs ({used} held, nominalGPUs {q.nominal_gpus})"
        if limit is not None and borrowed > limit:
            out[name] = OverQuota(
                "BorrowingLimitLowered",
                f"{held}, above its borrowingLimitGPUs {limit}: {_NOT_EVICTED}; new jobs are admitted "
                "only within the limit",
            )
        elif borrowed_in[q.cohort] > lent_in[q.cohort]:
            # A lender's nominalGPUs or lendingLimitGPUs (or this queue's nominalGPUs) was lowered
            # under what the cohort already borrows: GPUs are borrowed that nobody lends any more.
            out[name] = OverQuota(
                "CohortQuotaLowered",
                f"{held}, but cohort {q.cohort} now lends {lent_in[q.cohort]} GPUs for the "
                f"{borrowed_in[q.cohort]} its queues borrow (a quota in it was lowered): {_NOT_EVICTED}; "
                "new jobs of the cohort wait until its borrowing is back within what it lends, or "
                "reclaim borrowed GPUs as their queue's preemption policy allows",
            )
    return out
