"""A running job whose queue was deleted or no longer admits it (issue 33): a node failing under it
fails it over like any gang, and it then waits Recovering, blocked, instead of being re-placed."""

from __future__ import annotations

from typing import Any

from builders import RecordingWriter

from gpuq.controller import bodies as b
from gpuq.controller.cache import ClusterCache
from gpuq.controller.loop import SchedulingLoop
from gpuq.controller.metrics import Metrics
from gpuq.core import SchedulerConfig, schedule

JOB = "team-a/a"


class Recorder(RecordingWriter):
    """Keeps each restart handed to the writer with the re-placement that goes with it."""

    def __init__(self, cache: ClusterCache, metrics: Metrics) -> None:
        super().__init__(cache, metrics)
        self.restarts: dict[str, Any] = {}

    def submit(self, key: str, work: Any, minor: bool = False) -> bool:
        if getattr(work, "func", None) is not None and work.func.__name__ == "_restart":
            self.restarts[key] = work.args[2]  # partial(_restart, job, restart, readmit, now, failed)
        return super().submit(key, work, minor)


def loop_for(queues: list[dict[str, Any]], ns_labels: dict[str, str]) -> tuple[SchedulingLoop, Recorder]:
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team-a", **ns_labels)], "1")
    nodes = [b.node("n1", ready=False, since=b.T0), b.node("n2"), b.node("n3")]
    cache.replace("node", nodes, "1")
    cache.replace("queue", queues, "1")
    cache.replace("job", [b.job("a", replicas=1, status=b.placed_status(["n1"]))], "1")
    cache.replace("pod", b.gang_pods("a", ["n1"]), "1")
    metrics = Metrics()
    writer = Recorder(cache, metrics)
    loop = SchedulingLoop(cache, writer, SchedulerConfig(), metrics, schedule, lambda: b.T0 + 100)
    return loop, writer


def test_a_job_of_a_deleted_queue_is_failed_over_and_waits() -> None:
    loop, writer = loop_for([], {})
    d = loop.cycle()
    assert [r.job for r in d.restart] == [JOB]
    assert writer.restarts == {JOB: None}


def test_a_job_its_queue_no_longer_admits_is_failed_over_and_not_placed_again() -> None:
    """The core re-places a first restart in the same cycle; its queue would not admit it now
    (namespaceSelector), so the loop does not carry that out: the job waits, Blocked."""
    loop, writer = loop_for([b.queue("q", namespaceSelector={"matchLabels": {"team": "b"}})], {"team": "a"})
    d = loop.cycle()
    assert [r.job for r in d.restart] == [JOB] and [a.job for a in d.admit] == [JOB]
    assert writer.restarts == {JOB: None}
