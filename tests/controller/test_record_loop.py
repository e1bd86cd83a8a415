"""The loop and the admission record (gpuq.controller.record): a gang created before its status is
held, not admitted again; one that loses a worker before its status is written is decided again."""

from __future__ import annotations

from typing import Any

import pytest
from builders import RecordingWriter

from gpuq.controller import bodies as b
from gpuq.controller.cache import ClusterCache
from gpuq.controller.lifecycle import Plan
from gpuq.controller.loop import SchedulingLoop
from gpuq.controller.metrics import PREEMPTION_IN_QUEUE, PREEMPTION_UNKNOWN, Metrics
from gpuq.controller.objects import JobEntry
from gpuq.controller.preemption import Eviction
from gpuq.controller.writer import AdmissionFailed, Writer
from gpuq.core import SchedulerConfig, schedule

JOB = "team-a/a"


def test_an_unrecorded_gang_is_held_and_a_broken_one_is_decided_again() -> None:
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team-a")], "1")
    cache.replace("node", [b.node("n1"), b.node("n2")], "1")
    cache.replace("queue", [b.queue("q", nominal=16)], "1")
    cache.replace("job", [b.job("a", replicas=2, gpus=8, status={"phase": "Queued", "attempt": 0})], "1")
    cache.replace("pod", [], "1")
    metrics = Metrics()
    loop = SchedulingLoop(
        cache, RecordingWriter(cache, metrics), SchedulerConfig(), metrics, schedule, lambda: b.T0
    )
    # What the writer leaves behind: its assumption and the gang it created, status not written yet.
    cache.assume(JOB, 1, ("n1", "n2"), b.T0)
    gang = b.gang_pods("a", ["n1", "n2"], phase="Pending")
    for p in gang:
        cache.upsert_pod(p)
    assert loop.cycle().admit == ()  # held by its gang: not admitted a second time
    assert JOB in cache.assumed
    cache.delete_pod(gang[1])  # a worker deleted before the status recorded the admission
    writer = loop.writer
    assert isinstance(writer, RecordingWriter)
    writer.submitted.clear()
    loop.cycle()
    assert JOB not in cache.assumed and JOB in writer.submitted  # forgotten; its leftover pod deleted
    assert loop.cycle().admit == ()  # not while the leftover pod still holds n1's GPUs
    cache.delete_pod(gang[0])
    assert [a.job for a in loop.cycle().admit] == [JOB]  # then decided again


async def test_an_admission_waits_for_leftovers_of_its_attempt_being_deleted() -> None:
    """An abandoned admission's pods carry the next attempt's names: a new admission of that attempt
    must not take a terminating one for its own."""
    cache = ClusterCache()
    ticks = iter(range(10_000))  # each look at the clock is 30 s later: the wait gives up quickly
    writer = Writer(None, cache, Metrics(), on_done=lambda: None, clock=lambda: b.T0 + 30 * next(ticks))  # type: ignore[arg-type]
    leftover = b.pod("a-1-0", node_name="n1", job_name="a", attempt=1, deleting=True)
    cache.upsert_pod(leftover)
    with pytest.raises(AdmissionFailed):  # the leftover never goes
        await writer._wait_for_previous_pods(JOB, 1)
    cache.delete_pod(leftover)
    cache.upsert_pod(b.pod("a-1-0", node_name="n1", job_name="a", attempt=1))  # live, not leaving
    await writer._wait_for_previous_pods(JOB, 1)  # returns: a live pod of the attempt is reused


def test_each_admission_of_a_cycle_knows_how_many_were_decided_with_it() -> None:
    """So the first gangs of a burst are part of it too (their status waits; gpuq.controller.record),
    though the writer assumes them one at a time."""
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team-a")], "1")
    cache.replace("node", [b.node(f"n{i}") for i in range(3)], "1")
    cache.replace("queue", [b.queue("q", nominal=64)], "1")
    jobs = [b.job(f"j{i}", replicas=1, gpus=1, status={"phase": "Queued", "attempt": 0}) for i in range(20)]
    cache.replace("job", jobs, "1")
    cache.replace("pod", [], "1")
    metrics = Metrics()
    batch: dict[str, int] = {}

    class Recorder(RecordingWriter):
        def submit(self, key: str, work: Any, minor: bool = False) -> bool:
            if key.startswith("team-a/"):  # not the queue's status
                batch[key] = work.args[-1]  # partial(admit, job, decision, decided_with)
            return True

    loop = SchedulingLoop(cache, Recorder(cache, metrics), SchedulerConfig(), metrics, schedule, lambda: b.T0)
    admitted = loop.cycle().admit
    assert len(admitted) == 20
    assert batch == {a.job: 19 for a in admitted}


async def test_a_preemption_keeps_its_reason_when_the_preemptor_goes_during_the_eviction() -> None:
    """The victim's status says Preempted before its pods are deleted; a user may delete the
    preemptor in between (CI caught the metric counting such a preemption as Unknown)."""
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team-a")], "1")
    cache.replace("node", [b.node("n1"), b.node("n2")], "1")
    cache.replace("queue", [b.queue("q", nominal=16)], "1")
    high = b.job("high", priority=10, status={"phase": "Queued", "attempt": 0})
    cache.replace("job", [b.job("low", status=b.placed_status(["n1", "n2"])), high], "1")
    cache.replace("pod", b.gang_pods("low", ["n1", "n2"]), "1")
    metrics = Metrics()

    class DeletesThePreemptor(RecordingWriter):
        async def run_plan(
            self, job: JobEntry, plan: Plan, force_nodes: frozenset[str] = frozenset()
        ) -> JobEntry:
            self.cache.delete_job(high)  # its DELETE arrives while the eviction writes
            return job

    loop = SchedulingLoop(
        cache, DeletesThePreemptor(cache, metrics), SchedulerConfig(), metrics, schedule, lambda: b.T0
    )
    ev = Eviction("team-a/low", "team-a/high", "priority 10 > 0", b.T0, b.T0 + 60, None)
    await loop._evict(cache.jobs["team-a/low"], ev, b.T0, frozenset())
    count = metrics.registry.get_sample_value
    labels = {"queue": "q"}
    assert count("gpuq_preempted_jobs_total", {**labels, "reason": PREEMPTION_IN_QUEUE}) == 1
    assert count("gpuq_preempted_jobs_total", {**labels, "reason": PREEMPTION_UNKNOWN}) is None
