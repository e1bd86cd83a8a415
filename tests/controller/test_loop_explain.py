"""Explaining every waiting job is O(waiting jobs): while it is dear, cycles in between only act
(the same admissions), and an explaining cycle still comes every EXPLAIN_SECONDS."""

from __future__ import annotations

from builders import RecordingWriter

from gpuq.controller import bodies as b
from gpuq.controller.cache import ClusterCache
from gpuq.controller.loop import EXPLAIN_SECONDS, QUEUE_RECHECK_SECONDS, SchedulingLoop
from gpuq.controller.metrics import Metrics
from gpuq.core import SchedulerConfig

QUEUED = {"phase": "Queued", "attempt": 0}


async def test_while_explaining_is_dear_cycles_act_and_explain_every_few_seconds() -> None:
    now = [b.T0]
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team-a")], "1")
    cache.replace("node", [b.node("n1")], "1")
    cache.replace("queue", [b.queue("q", nominal=64)], "1")
    jobs = [b.job(name, replicas=1, gpus=8, status=QUEUED) for name in ("a", "b", "c")]
    cache.replace("job", jobs, "1")
    cache.replace("pod", [], "1")
    metrics = Metrics()
    writer = RecordingWriter(cache, metrics)
    loop = SchedulingLoop(cache, writer, SchedulerConfig(), metrics, clock=lambda: now[0])

    first = loop.cycle()
    assert [a.job for a in first.admit] == ["team-a/a"]
    assert {p.job for p in first.pending} == {"team-a/b", "team-a/c"}

    # a runs; a second node joins; explaining had cost a second (12,000 waiting jobs, say).
    cache.upsert_job(b.job("a", replicas=1, gpus=8, status=b.placed_status(["n1"])))
    for pod in b.gang_pods("a", ["n1"]):
        cache.upsert_pod(pod)
    cache.upsert_node(b.node("n2"))
    loop._explain_cost = 1.0
    now[0] = b.T0 + 0.5
    acting = loop.cycle()
    assert [a.job for a in acting.admit] == ["team-a/b"]  # the same decision an explaining cycle takes
    assert acting.pending == ()  # nobody's reason or position recomputed
    assert loop._timer_at is not None and loop._timer_at <= b.T0 + EXPLAIN_SECONDS + 0.01

    now[0] = b.T0 + EXPLAIN_SECONDS
    explaining = loop.cycle()
    assert [p.job for p in explaining.pending] == ["team-a/c"]


async def test_between_explaining_cycles_only_what_changed_gets_its_status_work() -> None:
    """A job newly kept out gets its Blocked status in an acting cycle; one kept out as before is
    not looked at again until the next explaining cycle; a queue's status is rebuilt only when what
    it is made of changed, and every queue's at most every QUEUE_RECHECK_SECONDS."""
    now = [b.T0]
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team-a")], "1")
    cache.replace("node", [b.node("n1")], "1")
    cache.replace("queue", [b.queue("q", nominal=64), b.queue("idle", nominal=8)], "1")
    cache.replace("job", [b.job("lost", queue_name="nowhere", replicas=1, gpus=1, status=QUEUED)], "1")
    cache.replace("pod", [], "1")
    metrics = Metrics()
    writer = RecordingWriter(cache, metrics)
    loop = SchedulingLoop(cache, writer, SchedulerConfig(), metrics, clock=lambda: now[0])
    loop.cycle()
    assert {"team-a/lost", "gpuqueue/q", "gpuqueue/idle"} <= set(writer.submitted)

    writer.submitted.clear()
    loop._explain_cost = 1.0  # explaining is dear: the next cycles only act
    now[0] = b.T0 + 0.5
    cache.upsert_job(b.job("stray", queue_name="nowhere", replicas=1, gpus=1, status=QUEUED))
    cache.upsert_job(b.job("work", replicas=1, gpus=1, status=QUEUED))
    acting = loop.cycle()
    assert [a.job for a in acting.admit] == ["team-a/work"]
    # The new stray's status is written; the old one's (its write never landed here) waits for the
    # explaining cycle; queue q's figures changed, idle's did not.
    assert "team-a/stray" in writer.submitted and "team-a/lost" not in writer.submitted
    assert "gpuqueue/q" in writer.submitted and "gpuqueue/idle" not in writer.submitted

    writer.submitted.clear()
    now[0] = b.T0 + EXPLAIN_SECONDS
    loop.cycle()
    # Every job kept out is looked at again; a queue only where its status is made of something
    # new, or once every QUEUE_RECHECK_SECONDS (idle's write never landed here: it is made again).
    assert "team-a/lost" in writer.submitted and "gpuqueue/idle" not in writer.submitted
    writer.submitted.clear()
    now[0] = b.T0 + QUEUE_RECHECK_SECONDS
    loop.cycle()
    assert "gpuqueue/idle" in writer.submitted
