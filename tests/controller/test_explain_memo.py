"""An explaining cycle derives waiting jobs' statuses and the pending gauges again only for the
queues where something changed: the core hands each queue's Pendings as the same tuple while
nothing they are made of changed (Decisions.pending_by_queue), and the loop knows which jobs
changed since the last explaining cycle. What it reuses must be what it would derive."""

from __future__ import annotations

from typing import Any

import pytest
from builders import RecordingWriter

from gpuq.controller import bodies as b
from gpuq.controller import intents
from gpuq.controller.cache import ClusterCache
from gpuq.controller.loop import EXPLAIN_SECONDS, SchedulingLoop
from gpuq.controller.metrics import Metrics, PendingFigures
from gpuq.core import SchedulerConfig
from gpuq.core.decisions import Decisions

QUEUED = {"phase": "Queued", "attempt": 0}
NAMES = {"qa": ("a1", "a2", "a3"), "qb": ("b1", "b2")}


def _cluster() -> tuple[ClusterCache, SchedulingLoop, RecordingWriter, list[float]]:
    """Two queues of 4 GPUs each and jobs of 8: every job waits on its queue's quota."""
    now = [b.T0]
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team-a")], "1")
    cache.replace("node", [b.node("n1")], "1")
    cache.replace("queue", [b.queue(q, nominal=4) for q in NAMES], "1")
    jobs = [b.job(n, queue_name=q, replicas=1, gpus=8, status=QUEUED) for q, ns in NAMES.items() for n in ns]
    cache.replace("job", jobs, "1")
    cache.replace("pod", [], "1")
    metrics = Metrics()
    writer = RecordingWriter(cache, metrics)
    loop = SchedulingLoop(cache, writer, SchedulerConfig(), metrics, clock=lambda: now[0])
    return cache, loop, writer, now


def _land(cache: ClusterCache, d: Decisions, now: float, only: set[str] | None = None) -> None:
    """The status writes the loop makes for waiting jobs, landed as their watch events would."""
    for p in d.pending:
        if only is not None and p.job not in only:
            continue
        job = cache.jobs[p.job]
        status = job.status.model_dump(by_alias=True, exclude_none=True, mode="json")
        status.update(intents.pending_status(job, p, now))
        name = p.job.split("/")[1]
        queue = job.spec.queue if job.spec is not None else "qa"
        body = b.job(name, queue_name=queue, replicas=1, gpus=8, status=status)
        body["metadata"]["uid"] = job.uid
        cache.upsert_job(body)


def _count_classifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = intents.pending_change

    def counting(job: Any, pending: Any) -> intents.Change:
        seen.append(pending.job)
        return real(job, pending)

    monkeypatch.setattr(intents, "pending_change", counting)
    return seen


async def test_unchanged_queues_are_not_classified_again_and_a_changed_job_gets_its_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache, loop, writer, now = _cluster()
    first = loop.cycle()
    assert {q for q, _ in first.pending_by_queue} == {"qa", "qb"}
    _land(cache, first, now[0])
    now[0] += EXPLAIN_SECONDS
    settled = loop.cycle()  # every entry changed: all derived again, nothing left to write
    assert not {p.job for p in settled.pending} & set(writer.submitted[len(first.pending) :])

    seen = _count_classifications(monkeypatch)
    writer.submitted.clear()
    now[0] += EXPLAIN_SECONDS
    again = loop.cycle()
    assert dict(again.pending_by_queue)["qa"] is dict(settled.pending_by_queue)["qa"]  # the core kept it
    assert seen == [] and writer.submitted == []  # nothing changed: nothing classified or written

    # a1's status is edited (its reason no longer what gpuq says): its queue alone is looked at
    # again, and a1 gets its status written back.
    a1 = cache.jobs["team-a/a1"]
    status = a1.status.model_dump(by_alias=True, exclude_none=True, mode="json")
    body = b.job("a1", queue_name="qa", replicas=1, gpus=8, status={**status, "reason": "Edited"})
    body["metadata"]["uid"] = a1.uid
    cache.upsert_job(body)
    now[0] += EXPLAIN_SECONDS
    loop.cycle()
    assert seen == ["team-a/a1"]  # qa's other jobs keep their classification (same entry, same Pending)
    assert "team-a/a1" in writer.submitted and not {"team-a/b1", "team-a/b2"} & set(writer.submitted)


async def test_a_queue_with_a_write_in_flight_is_derived_again() -> None:
    """A job whose status is being written when its queue was explained is retried, even if nothing
    else changed (the loop does not reuse a queue that had a busy job)."""
    cache, loop, writer, now = _cluster()
    first = loop.cycle()
    _land(cache, first, now[0], only={"team-a/b1", "team-a/b2", "team-a/a2", "team-a/a3"})
    writer.busy.add("team-a/a1")  # its Queued write still runs
    now[0] += EXPLAIN_SECONDS
    loop.cycle()
    writer.busy.discard("team-a/a1")
    writer.submitted.clear()
    now[0] += EXPLAIN_SECONDS
    loop.cycle()
    assert "team-a/a1" in writer.submitted  # its status is still to be written: it is, now


def test_kept_pending_figures_equal_fresh_ones_as_jobs_change() -> None:
    """PendingFigures reuses a queue's counts only for the same Pendings of unchanged jobs: after a
    job's entry changes (its queued_since moves) in a queue marked dirty, the gauges follow it."""
    cache, loop, _, now = _cluster()
    d = loop.cycle()
    kept = PendingFigures()
    first = kept.update(d, {}, cache.jobs, None)
    assert first == PendingFigures().update(d, {}, cache.jobs)
    assert first[0] == {("qa", d.pending[0].code): 3, ("qb", d.pending[-1].code): 2}

    # qa's jobs all lost an admission 50 s from now: qa has been waiting since then, qb as before.
    cond = {
        "type": "Admitted",
        "status": "False",
        "reason": "Preempted",
        "lastTransitionTime": b.iso(now[0] + 50),
    }
    for name in NAMES["qa"]:
        uid = cache.jobs[f"team-a/{name}"].uid
        body = b.job(
            name, queue_name="qa", replicas=1, gpus=8, status={**QUEUED, "attempt": 1, "conditions": [cond]}
        )
        body["metadata"]["uid"] = uid
        cache.upsert_job(body)
    assert kept.update(d, {}, cache.jobs, set()) == first  # told nothing changed: reused
    fresh = PendingFigures().update(d, {}, cache.jobs)
    assert fresh[1][("qa",)] == now[0] + 50 and fresh[1][("qb",)] == first[1][("qb",)]
    assert kept.update(d, {}, cache.jobs, {"qa"}) == fresh
