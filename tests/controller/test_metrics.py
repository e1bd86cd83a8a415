"""The operator's metrics: pending jobs by queue and reason (through a real scheduling cycle),
admission wait, preemption reasons, failover recovery time, and what a standby publishes."""

from __future__ import annotations

from typing import Any

import pytest
from test_loop_thread import RecordingWriter

from gpuq.controller import bodies as b
from gpuq.controller.cache import ClusterCache
from gpuq.controller.loop import EXPLAIN_SECONDS, SchedulingLoop
from gpuq.controller.metrics import (
    PREEMPTION_CONSOLIDATION,
    PREEMPTION_IN_QUEUE,
    PREEMPTION_REASONS,
    PREEMPTION_RECLAIM,
    PREEMPTION_UNKNOWN,
    RECOVERY_HORIZON_SECONDS,
    Metrics,
    PendingJob,
    QueueFigures,
    preemption_reason,
)
from gpuq.controller.objects import JobEntry, parse_job, queued_since
from gpuq.core import SchedulerConfig
from gpuq.core.decisions import Admit


def entry(name: str, queue: str = "q", status: dict[str, Any] | None = None) -> JobEntry:
    return parse_job(b.job(name, ns="team", queue_name=queue, status=status))


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def requeued_status(at: float, reason: str = "Preempted") -> dict[str, Any]:
    """A job admitted once, then sent back to its queue at `at`."""
    cond = {"type": "Admitted", "status": "False", "reason": reason, "lastTransitionTime": b.iso(at)}
    return {"phase": "Queued", "attempt": 1, "conditions": [cond]}


# -- pending jobs through a real cycle --------------------------------------------------------


def cycle_loop(
    jobs: list[dict[str, Any]], now: list[float] | None = None
) -> tuple[SchedulingLoop, ClusterCache, Metrics]:
    """A loop over `jobs` whose clock reads now[0] (b.T0 + 60 unless given)."""
    clock = now if now is not None else [b.T0 + 60]
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team")], "1")
    cache.replace("node", [b.node("n0"), b.node("n1")], "1")
    cache.replace("queue", [b.queue("q", nominal=8, cohort="research"), b.queue("idle", nominal=4)], "1")
    cache.replace("job", jobs, "1")
    cache.replace("pod", [], "1")
    metrics = Metrics()
    loop = SchedulingLoop(
        cache, RecordingWriter(cache, metrics), SchedulerConfig(), metrics, clock=lambda: clock[0]
    )
    return loop, cache, metrics


def test_pending_jobs_are_counted_by_queue_and_the_reason_the_cycle_gives() -> None:
    jobs = [
        b.job("fits", ns="team", replicas=1, gpus=8),
        b.job("over-quota", ns="team", replicas=1, gpus=8),
        b.job("never", ns="team", replicas=4, gpus=8),  # 32 GPUs on a 16-GPU cluster: blocked
    ]
    now = [b.T0 + 60]
    loop, cache, m = cycle_loop(jobs, now)
    decisions = loop.cycle()
    assert [a.job for a in decisions.admit] == ["team/fits"]
    (pending,) = decisions.pending
    assert pending.job == "team/over-quota" and pending.code
    blocked = loop.builder.build(cache, b.T0 + 60, SchedulerConfig()).excluded["team/never"].reason
    assert sample(m, "gpuq_pending_jobs", queue="q", reason=pending.code) == 1
    assert sample(m, "gpuq_pending_jobs", queue="q", reason=blocked) == 1
    assert sample(m, "gpuq_oldest_pending_job_timestamp_seconds", queue="q") == b.T0
    assert sample(m, "gpuq_queue_nominal_gpus", queue="q", cohort="research") == 8
    assert sample(m, "gpuq_queue_nominal_gpus", queue="idle", cohort="") == 4
    assert sample(m, "gpuq_oldest_pending_job_timestamp_seconds", queue="idle") is None

    # The blocked job goes away: its label set reads 0 (not its last value); the other stays. The
    # next cycle that explains says so: one past EXPLAIN_SECONDS always does (a cheap one may too,
    # but how cheap depends on the machine's load).
    cache.delete_job(jobs[2])
    now[0] += EXPLAIN_SECONDS
    loop.cycle()
    assert sample(m, "gpuq_pending_jobs", queue="q", reason=blocked) == 0
    assert sample(m, "gpuq_pending_jobs", queue="q", reason=pending.code) == 1


def test_every_queue_gets_its_counters_at_zero_so_a_first_event_is_an_increase() -> None:
    loop, _, m = cycle_loop([])
    loop.cycle()
    for queue in ("q", "idle"):
        assert sample(m, "gpuq_admissions_total", queue=queue) == 0
        assert sample(m, "gpuq_restarts_total", queue=queue) == 0
        assert sample(m, "gpuq_admission_wait_time_seconds_count", queue=queue) == 0
        assert sample(m, "gpuq_failover_recovery_time_seconds_count", queue=queue) == 0
        for reason in PREEMPTION_REASONS:
            assert sample(m, "gpuq_preempted_jobs_total", queue=queue, reason=reason) == 0


# -- gauges published whole -------------------------------------------------------------------


def test_a_vanished_queue_drops_its_quota_series_and_pending_reasons_fall_to_zero() -> None:
    m = Metrics()
    figures = {"a": QueueFigures("c", 8, 4, 0, 1), "b": QueueFigures("c", 8, 12, 4, 3)}
    m.publish_cycle(figures, [PendingJob("b", "Fragmented", b.T0), PendingJob("b", "Fragmented", b.T0 - 5)])
    assert sample(m, "gpuq_queue_borrowed_gpus", queue="b", cohort="c") == 4
    assert sample(m, "gpuq_pending_jobs", queue="b", reason="Fragmented") == 2
    assert sample(m, "gpuq_oldest_pending_job_timestamp_seconds", queue="b") == b.T0 - 5

    m.publish_cycle({"a": figures["a"]}, [])
    assert sample(m, "gpuq_queue_used_gpus", queue="b", cohort="c") is None
    assert sample(m, "gpuq_queue_used_gpus", queue="a", cohort="c") == 4
    assert sample(m, "gpuq_pending_jobs", queue="b", reason="Fragmented") == 0
    # A timestamp of 0 would read as "waiting since 1970": removed instead.
    assert sample(m, "gpuq_oldest_pending_job_timestamp_seconds", queue="b") is None


def test_a_standby_publishes_no_cycle_gauges() -> None:
    m = Metrics()
    m.publish_cycle({"a": QueueFigures("", 8, 8, 0, 1)}, [PendingJob("a", "QuotaExceeded", b.T0)])
    m.standby()
    assert sample(m, "gpuq_queue_used_gpus", queue="a", cohort="") is None
    assert sample(m, "gpuq_admitted_jobs", queue="a") is None
    assert sample(m, "gpuq_pending_jobs", queue="a", reason="QuotaExceeded") is None
    # Leading again publishes as before.
    m.publish_cycle({"a": QueueFigures("", 8, 0, 0, 0)}, [])
    assert sample(m, "gpuq_queue_used_gpus", queue="a", cohort="") == 0


# -- admission wait ---------------------------------------------------------------------------


def test_a_new_job_waited_since_its_creation() -> None:
    job = entry("new", status={"phase": "Queued", "conditions": []})
    assert queued_since(job) == b.T0
    m = Metrics()
    m.admitted(job, Admit(job.key, ("n0",), 0.0), b.T0 + 42)
    assert sample(m, "gpuq_admission_wait_time_seconds_count", queue="q") == 1
    assert sample(m, "gpuq_admission_wait_time_seconds_sum", queue="q") == 42
    assert sample(m, "gpuq_admission_wait_time_seconds_bucket", queue="q", le="30.0") == 0
    assert sample(m, "gpuq_admission_wait_time_seconds_bucket", queue="q", le="60.0") == 1
    assert sample(m, "gpuq_admissions_total", queue="q") == 1


def test_a_requeued_job_waited_since_it_lost_its_admission() -> None:
    job = entry("again", status=requeued_status(b.T0 + 600))
    assert queued_since(job) == b.T0 + 600
    m = Metrics()
    m.admitted(job, Admit(job.key, ("n0",), 0.0), b.T0 + 610)
    assert sample(m, "gpuq_admission_wait_time_seconds_sum", queue="q") == 10


def test_a_pending_condition_before_the_first_admission_is_not_a_requeue() -> None:
    # Admitted=False is written for every waiting job; before attempt 1 it says nothing of a requeue.
    status = requeued_status(b.T0 + 600, reason="QuotaExceeded") | {"attempt": 0}
    assert queued_since(entry("waiting", status=status)) == b.T0


# -- preemption reasons -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preemptor_queue", "reason"),
    [("q", PREEMPTION_IN_QUEUE), ("lender", PREEMPTION_RECLAIM), (None, PREEMPTION_UNKNOWN)],
)
def test_preemption_reason_follows_the_queues(preemptor_queue: str | None, reason: str) -> None:
    victim = entry("victim")
    preemptor = entry("high", queue=preemptor_queue) if preemptor_queue else None
    assert preemption_reason(victim, preemptor) == reason
    m = Metrics()
    m.preempted(victim, preemption_reason(victim, preemptor))
    assert sample(m, "gpuq_preempted_jobs_total", queue="q", reason=reason) == 1


def test_a_move_is_counted_as_consolidation_whatever_the_queues() -> None:
    victim = entry("victim")
    for preemptor in (entry("high", queue="q"), entry("high", queue="lender"), None):
        assert preemption_reason(victim, preemptor, move=True) == PREEMPTION_CONSOLIDATION


# -- failover recovery ------------------------------------------------------------------------


def test_recovery_time_runs_from_the_restart_to_the_gang_running_again() -> None:
    m = Metrics()
    job = entry("llm")
    m.running(job, b.T0)  # a first start is no recovery
    assert sample(m, "gpuq_failover_recovery_time_seconds_count", queue="q") is None
    m.restarted(job, 960.0, b.T0 + 100)
    m.restarted(job, 0.0, b.T0 + 105)  # failed again while recovering: still one failover
    m.running(job, b.T0 + 112)
    assert sample(m, "gpuq_failover_recovery_time_seconds_count", queue="q") == 1
    assert sample(m, "gpuq_failover_recovery_time_seconds_sum", queue="q") == 12
    assert sample(m, "gpuq_restarts_total", queue="q") == 2
    assert sample(m, "gpuq_lost_gpu_seconds_total", queue="q") == 960
    m.running(job, b.T0 + 200)  # running again later (e.g. after a preemption): not a recovery
    assert sample(m, "gpuq_failover_recovery_time_seconds_count", queue="q") == 1


def test_a_restart_that_never_runs_again_is_forgotten_after_the_horizon() -> None:
    m = Metrics()
    stuck, other = entry("stuck"), entry("other")
    m.restarted(stuck, 0.0, b.T0)
    m.restarted(other, 0.0, b.T0 + RECOVERY_HORIZON_SECONDS + 1)
    m.running(stuck, b.T0 + RECOVERY_HORIZON_SECONDS + 2)
    assert sample(m, "gpuq_failover_recovery_time_seconds_count", queue="q") is None


def test_names_lists_what_the_registry_exposes() -> None:
    names = Metrics().names()
    assert {"gpuq_cycle_seconds_bucket", "gpuq_api_requests_total", "gpuq_leader"} <= names
    assert "gpuq_admission_wait_time_seconds_bucket" in names and "gpuq_pending_jobs" in names
