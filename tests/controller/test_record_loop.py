"""The loop and the admission record (gpuq.controller.record): a gang created before its status is
held, not admitted again; one that loses a worker before its status is written is decided again."""

from __future__ import annotations

from builders import RecordingWriter

from gpuq.controller import bodies as b
from gpuq.controller.cache import ClusterCache
from gpuq.controller.loop import SchedulingLoop
from gpuq.controller.metrics import Metrics
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
