"""Rows for `gpuq queues` and `gpuq jobs` (pure: from a State)."""

from __future__ import annotations

from typing import Any

from gpuq.api.trainingjob import PLACED_PHASES, Phase
from gpuq.controller.objects import JobEntry
from gpuq.core.quota import borrowing, fair_share, lendable, lent_out
from gpuq.ctl.state import State

WAITING = (Phase.QUEUED, Phase.PREEMPTED, Phase.RECOVERING, None)
# `gpuq jobs --status`: every phase, and `pending` for all the waiting ones.
PENDING_PHASES = (Phase.QUEUED, Phase.PREEMPTED, Phase.RECOVERING, Phase.SUSPENDED)
STATUSES = ("pending", *(p.value.lower() for p in Phase))


def queue_rows(state: State) -> list[dict[str, Any]]:
    """One row per GPUQueue, cohort members together under their cohort (`tree` is the name indented
    as a tree), with quota figures as the core counts them."""
    ix = state.ix
    core = state.queues()
    pending: dict[str, int] = {}
    admitted: dict[str, int] = {}
    for job in state.cache.jobs.values():
        if job.spec is None:
            continue
        if job.status.phase in PLACED_PHASES:
            admitted[job.spec.queue] = admitted.get(job.spec.queue, 0) + 1
        elif job.status.phase in WAITING:
            pending[job.spec.queue] = pending.get(job.spec.queue, 0) + 1
    lent = lent_out(core.values(), ix.usage)
    rows = []
    for name, entry in state.cache.queues.items():
        spec = entry.spec
        q = core.get(name)
        used = ix.usage.get(name, 0)
        rows.append(
            {
                "name": name,
                "cohort": spec.cohort if spec else None,
                "nominal": q.nominal_gpus if q else None,
                "used": used,
                "borrowed": borrowing(q, used) if q else 0,
                "lent": lent.get(name, 0),
                "lendable": lendable(q, used) if q and q.cohort else 0,
                "borrowingLimit": q.borrowing_limit_gpus if q else None,
                "weight": q.weight if q else None,
                "fairShare": round(fair_share(q, used), 3) if q else None,
                "pending": pending.get(name, 0),
                "admitted": admitted.get(name, 0),
                "stopPolicy": str(spec.stop_policy) if spec else None,
                "error": entry.error,
            }
        )
    rows.sort(key=lambda r: (r["cohort"] is None, r["cohort"] or "", r["name"]))
    _tree(rows)
    return rows


def _tree(rows: list[dict[str, Any]]) -> None:
    by_cohort: dict[str | None, list[dict[str, Any]]] = {}
    for r in rows:
        by_cohort.setdefault(r["cohort"], []).append(r)
    for cohort, members in by_cohort.items():
        for i, r in enumerate(members):
            if cohort is None:
                r["tree"] = r["name"]
            else:
                glyph = "└─" if i == len(members) - 1 else "├─"
                r["tree"] = (
                    f"{cohort} {glyph} {r['name']}" if i == 0 else f"{' ' * len(cohort)} {glyph} {r['name']}"
                )


def job_rows(state: State, queue: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
    """One row per TrainingJob, queue order first (by queue, then position), then the others."""
    positions = {p.job: (p.position, p.code, p.reason) for p in state.decisions.pending}
    rows = []
    for key, job in state.cache.jobs.items():
        if queue is not None and (job.spec is None or job.spec.queue != queue):
            continue
        row = _job_row(state, key, job, positions.get(key))
        if status is not None and not _status_matches(row, status):
            continue
        rows.append(row)
    rows.sort(
        key=lambda r: (r["queue"] or "", r["position"] is None, r["position"] or 0, r["namespace"], r["name"])
    )
    return rows


def _job_row(state: State, key: str, job: JobEntry, pending: tuple[int, str, str] | None) -> dict[str, Any]:
    s = job.status
    excluded = state.view.excluded.get(key)
    reason, message = s.reason, s.message
    position = s.queue_position
    if excluded is not None:
        reason, message, position = excluded.reason, excluded.message, None
    elif pending is not None:
        position, reason, message = pending
    elif state.admitted_next(key):
        reason, message = None, "fits now: admitted in the operator's next cycle"
    return {
        "namespace": job.namespace,
        "name": job.name,
        "queue": job.spec.queue if job.spec else None,
        "phase": str(s.phase or Phase.QUEUED),
        "position": position if s.phase not in PLACED_PHASES else None,
        "reason": reason if s.phase not in PLACED_PHASES else None,
        "gpus": job.spec.workers.replicas * job.spec.workers.gpus_per_worker if job.spec else s.gpus,
        "priority": job.spec.priority if job.spec else None,
        "attempt": s.attempt,
        "restarts": s.restarts,
        "nodes": sorted({p.node for p in s.placement}),
        "age": max(0.0, state.now - job.created_at),
        "message": message,
    }


def _status_matches(row: dict[str, Any], status: str) -> bool:
    want = status.lower()
    phase = str(row["phase"]).lower()
    if want == "pending":
        return phase in (p.value.lower() for p in PENDING_PHASES)
    return phase == want
