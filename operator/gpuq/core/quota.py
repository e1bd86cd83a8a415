"""Quota: nominal GPUs per queue, cohort lending/borrowing, weighted fair share, per-model quotas.

Semantics (docs/scheduling.md, "Quota"):
- usage(q): GPUs of q's running jobs that are not being evicted, plus jobs recovering from a failure
  (they keep their quota), plus what this cycle admitted or reserved.
- A queue without a cohort admits while usage + request <= nominal.
- In a cohort, q lends min(lendable(q), nominal(q) - usage(q)) when below nominal, where lendable(q) is
  lendingLimitGPUs (default: all of its nominal). Borrowed(q) = max(0, usage - nominal). A request
  that takes q above nominal is admitted only if borrowed(q) stays <= borrowingLimitGPUs (default: no
  limit). Every admission in a cohort, within nominal or not, must keep the cohort's total borrowed
  <= its total lent: GPUs q lent out come back to q only by reclaim (preemption) or release.
- Fair share: share(q) = borrowed(q) / weight(q). Among queue heads that need to borrow, the lowest
  share goes first, so spare cohort capacity is split in proportion to weights.
- modelQuotas {model: GPUs}: a cap on top of nominal for GPUs of that model, never borrowed or lent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuq.core.decisions import PendingCode
from gpuq.core.model import Queue
from gpuq.core.reasons import counted
from gpuq.core.state import CycleState


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    ok: bool
    borrowed: int = 0  # GPUs of this request above the queue's nominal
    reason: str = ""
    code: PendingCode = PendingCode.QUOTA_EXCEEDED


OK = QuotaCheck(True)


def borrowing(q: Queue, used: int) -> int:
    """GPUs q borrows from its cohort while it uses `used`: what it uses above its nominal quota."""
    over = used - q.nominal_gpus
    return over if over > 0 else 0


def lendable(q: Queue, used: int) -> int:
    """GPUs q lends to its cohort while it uses `used`: its unused nominal, up to its lending limit."""
    unused = q.nominal_gpus - used
    if unused <= 0:
        return 0
    limit = q.lending_limit_gpus
    cap = q.nominal_gpus if limit is None or limit > q.nominal_gpus else limit
    return unused if unused < cap else max(cap, 0)


def lent_out(queues: Iterable[Queue], usage: Mapping[str, int]) -> dict[str, int]:
    """GPUs of each queue's nominal quota that its cohort peers use now (column LENT of `gpuq
    queues`). Borrowing is pooled in a cohort, so what its queues borrow in all is split among the
    lending ones in proportion to what each lends now (largest remainders, then names, get the odd
    GPUs): exact with one lender, and the column adds up to what the cohort borrows."""
    cohorts: dict[str, list[Queue]] = {}
    for q in queues:
        if q.cohort is not None:
            cohorts.setdefault(q.cohort, []).append(q)
    out: dict[str, int] = {}
    for members in cohorts.values():
        borrowed = sum(borrowing(q, usage.get(q.name, 0)) for q in members)
        lends = {q.name: lendable(q, usage.get(q.name, 0)) for q in members}
        total = sum(lends.values())
        share = {n: min(lent, borrowed * lent // total) if total else 0 for n, lent in lends.items()}
        odd = min(borrowed, total) - sum(share.values())
        by_remainder = sorted(lends, key=lambda n: (-(borrowed * lends[n] % total) if total else 0, n))
        for n in by_remainder:
            if odd <= 0:
                break
            if share[n] < lends[n]:
                share[n] += 1
                odd -= 1
        out.update(share)
    return out


def fair_share(q: Queue, used: int) -> float:
    """share(q) = borrowed / weight: the lowest goes first among heads that need to borrow."""
    over = borrowing(q, used)
    if not over:
        return 0.0
    return over / q.weight if q.weight > 0 else over * 1e9


# Quota reasons say usage and quota apart, e.g. "queue a uses 8 GPUs (nominal quota 48); this job
# needs 48 (56 > 48)": "at quota 8/48" read as a full queue (issue 33), "8/48" as a fraction.


def _in_use(q: Queue, used: int, gpus: int) -> str:
    return (
        f"queue {q.name} uses {counted(used, 'GPU')} (nominal quota {q.nominal_gpus}); this job needs {gpus}"
    )


def model_quota_reason(
    q: Queue, usage: Mapping[str, int], models: Iterable[str], need: int, per_worker: bool = False
) -> str:
    """Why q's model quotas refuse a job, e.g. "queue q uses 8 H100 GPUs (model quota 8); this job
    needs 8". `models`: the quota'd models too full for it; `per_worker`: a gang that may mix
    models needs room for one worker of `need` GPUs per model."""
    full = set(models)
    parts = ", ".join(
        f"{counted(usage.get(m, 0), m + ' GPU')} (model quota {lim})"
        for m, lim in sorted(q.model_quotas.items())
        if m in full
    )
    who = "a worker of this job needs" if per_worker else "this job needs"
    return f"queue {q.name} uses {parts}; {who} {need}"


def cohorts_of(queues: Mapping[str, Queue]) -> dict[str, list[Queue]]:
    """Each cohort's queues, by queue name."""
    out: dict[str, list[Queue]] = {}
    for q in sorted(queues):
        c = queues[q].cohort
        if c is not None:
            out.setdefault(c, []).append(queues[q])
    return out


class QuotaBook:
    def __init__(
        self,
        st: CycleState,
        queues: Mapping[str, Queue],
        usage: Mapping[str, int],
        model_usage: Mapping[str, Mapping[str, int]],
        cohorts: Mapping[str, Sequence[Queue]] | None = None,
    ) -> None:
        """`cohorts`: cohorts_of(queues), when the caller keeps it (read only)."""
        self.st = st
        self.queues = queues
        self.usage: dict[str, int] = dict(usage)
        self.model_usage: dict[str, dict[str, int]] = {q: dict(m) for q, m in model_usage.items()}
        self.cohorts: Mapping[str, Sequence[Queue]] = cohorts_of(queues) if cohorts is None else cohorts
        # Per cohort: GPUs its queues lend and borrow in total, kept current by add() so a quota check
        # is O(1) however many queues share the cohort.
        self.cohort_lent: dict[str, int] = {}
        self.cohort_borrowed: dict[str, int] = {}
        for c, members in self.cohorts.items():
            self.cohort_lent[c] = sum(self.lent(p) for p in members)
            self.cohort_borrowed[c] = sum(self.borrowed(p) for p in members)

    # ---- accounting -----------------------------------------------------------------------------

    def add(self, queue: str, gpus: int, models: Mapping[str, int]) -> None:
        """Count (or with negative numbers release) usage of a queue; journaled for rollbacks."""
        if not gpus and not models:
            return
        q = self.queues.get(queue)
        old = self.usage.get(queue, 0)
        new = self.usage[queue] = old + gpus
        if gpus and q is not None and q.cohort is not None:  # lent() and borrowed() before and after
            self.cohort_lent[q.cohort] += lendable(q, new) - lendable(q, old)
            self.cohort_borrowed[q.cohort] += borrowing(q, new) - borrowing(q, old)
        if models:
            mu = self.model_usage.setdefault(queue, {})
            for m, g in models.items():
                mu[m] = mu.get(m, 0) + g
        negated = {m: -g for m, g in models.items()}
        self.st.record(lambda: self.add(queue, -gpus, negated))

    # The small methods below run millions of times per simulated trace: kept to plain arithmetic.

    def used(self, queue: str) -> int:
        return self.usage.get(queue, 0)

    def borrowed(self, q: Queue) -> int:
        return borrowing(q, self.usage.get(q.name, 0))

    def lent(self, q: Queue) -> int:
        """GPUs q currently lends to its cohort."""
        return lendable(q, self.usage.get(q.name, 0))

    def share(self, q: Queue) -> float:
        return fair_share(q, self.usage.get(q.name, 0))

    def needs_borrow(self, q: Queue, gpus: int) -> bool:
        return self.used(q.name) + gpus > q.nominal_gpus

    def cohort_lends(self, q: Queue) -> tuple[int, int]:
        """(GPUs the cohort lends to q now, GPUs already borrowed by q's peers)."""
        if q.cohort is None:
            return 0, 0
        return (
            self.cohort_lent[q.cohort] - self.lent(q),
            self.cohort_borrowed[q.cohort] - self.borrowed(q),
        )

    # ---- checks ---------------------------------------------------------------------------------

    def admits(self, q: Queue, gpus: int) -> bool:
        """check(q, gpus).ok without a reason to format (searches ask it for every set they try)."""
        return self._refusal(q, self.used(q.name) + gpus) is None

    def _refusal(self, q: Queue, after: int) -> PendingCode | None:
        """Which rule refuses q using `after` GPUs (None: none does)."""
        if q.cohort is None:
            return None if after <= q.nominal_gpus else PendingCode.QUOTA_EXCEEDED
        borrow_after = borrowing(q, after)
        if q.borrowing_limit_gpus is not None and borrow_after > q.borrowing_limit_gpus:
            return PendingCode.BORROWING_LIMIT
        # The cohort invariant must hold after the admission even when q stays within its nominal
        # quota: GPUs q lent to peers are not free for q until they are reclaimed or released.
        lent, peers_borrowed = self.cohort_lends(q)
        if peers_borrowed + borrow_after > lent + lendable(q, after):
            return PendingCode.COHORT_EXHAUSTED
        return None

    def check(self, q: Queue, gpus: int) -> QuotaCheck:
        used = self.used(q.name)
        after = used + gpus
        refusal = self._refusal(q, after)
        borrow_after = borrowing(q, after)
        if refusal is None:
            return OK if q.cohort is None else QuotaCheck(True, borrowed=min(gpus, borrow_after))
        if refusal is PendingCode.QUOTA_EXCEEDED:
            return QuotaCheck(False, reason=f"{_in_use(q, used, gpus)} ({after} > {q.nominal_gpus})")
        if refusal is PendingCode.BORROWING_LIMIT:
            return QuotaCheck(
                False,
                reason=(
                    f"{_in_use(q, used, gpus)}, {borrow_after} above its nominal, but its borrowing "
                    f"limit is {q.borrowing_limit_gpus}"
                ),
                code=refusal,
            )
        lent, peers_borrowed = self.cohort_lends(q)
        if borrow_after == 0:
            reason = (
                f"queue {q.name} would use {after} GPUs with this job, within its nominal quota of "
                f"{q.nominal_gpus}, but cohort {q.cohort} peers borrow {peers_borrowed} of its lent "
                "GPUs; waiting for them to be reclaimed or released"
            )
        else:
            free = max(0, lent - peers_borrowed)
            reason = (
                f"{_in_use(q, used, gpus)}, {borrow_after} above its nominal, and cohort {q.cohort} "
                f"lends {free}"
            )
        return QuotaCheck(False, reason=reason, code=refusal)

    def model_headroom(self, q: Queue) -> dict[str, int]:
        """GPUs left per quota'd model (models without a model quota are absent: unlimited)."""
        mu = self.model_usage.get(q.name, {})
        return {m: limit - mu.get(m, 0) for m, limit in q.model_quotas.items()}
