"""What a GPUQueue's quota says about it beyond the schema (pure; docs/api.md, "GPUQueue").

The CRD schema checks each field, but not what the fields mean together or against what the queue
already holds: a queue that can admit no job at all, and one that holds more than its quota allows
now that its quota was lowered under it. The operator reports both as conditions with a Warning
Event (gpuq.controller.status); `gpuq doctor` asks the same questions.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuq.core.model import Queue
from gpuq.core.quota import lendable


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


def over_quota(q: Queue, used: int) -> str | None:
    """Why the queue holds more GPUs than its quota allows (None when it does not): its quota was
    lowered under jobs already admitted. Nothing is evicted for it; the queue admits new jobs only
    within the new quota (gpuq.core.quota), so it drains back as its jobs finish."""
    if q.cohort is None:
        if used <= q.nominal_gpus:
            return None
        return (
            f"holds {used} GPUs, above its nominalGPUs {q.nominal_gpus}: running jobs are not evicted "
            "for it; new jobs are admitted only within the quota"
        )
    borrowed = used - q.nominal_gpus
    limit = q.borrowing_limit_gpus
    if limit is None or borrowed <= limit:
        return None
    return (
        f"borrows {borrowed} GPUs ({used} held, nominalGPUs {q.nominal_gpus}), above its "
        f"borrowingLimitGPUs {limit}: running jobs are not evicted for it; new jobs are admitted only "
        "within the limit"
    )
