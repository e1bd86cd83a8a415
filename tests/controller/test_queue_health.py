"""What a GPUQueue's quota says beyond the schema: a queue that can admit no job, and one holding more
than its lowered quota allows. Each becomes a condition and a Warning Event, through a real cycle."""

from __future__ import annotations

from typing import Any

from builders import RecordingWriter

from gpuq.controller import bodies as b
from gpuq.controller import status as st
from gpuq.controller.cache import ClusterCache
from gpuq.controller.loop import SchedulingLoop
from gpuq.controller.metrics import Metrics
from gpuq.controller.queuehealth import cannot_admit, over_quota
from gpuq.core import SchedulerConfig
from gpuq.core.model import Queue


def queues(*qs: Queue) -> dict[str, Queue]:
    return {q.name: q for q in qs}


def test_a_queue_without_quota_or_anyone_to_borrow_from_cannot_admit() -> None:
    alone = Queue("alone", 0)
    assert "no cohort" in (cannot_admit(alone, queues(alone)) or "")
    capped = Queue("capped", 0, cohort="c", borrowing_limit_gpus=0)
    lender = Queue("lender", 16, cohort="c")
    assert "borrowingLimitGPUs are 0" in (cannot_admit(capped, queues(capped, lender)) or "")
    lonely = Queue("lonely", 0, cohort="c")
    assert "only queue" in (cannot_admit(lonely, queues(lonely)) or "")
    stingy = Queue("stingy", 16, cohort="c", lending_limit_gpus=0)
    assert "no other queue lends" in (cannot_admit(lonely, queues(lonely, stingy)) or "")
    # What can admit: own quota, or a peer that lends.
    assert cannot_admit(Queue("own", 8), queues(Queue("own", 8))) is None
    assert cannot_admit(lonely, queues(lonely, lender)) is None


def test_usage_above_a_lowered_quota_is_reported() -> None:
    assert over_quota(Queue("q", 16), 16) is None
    assert "holds 24 GPUs, above its nominalGPUs 16" in (over_quota(Queue("q", 16), 24) or "")
    # In a cohort, usage above nominal is borrowing: only a borrowing limit below it is a problem.
    assert over_quota(Queue("q", 16, cohort="c"), 40) is None
    limited = Queue("q", 8, cohort="c", borrowing_limit_gpus=4)
    assert over_quota(limited, 12) is None
    assert "borrows 16 GPUs" in (over_quota(limited, 24) or "")


def test_warnings_only_when_a_problem_appears_or_changes() -> None:
    now = b.T0
    ok = st.queue_conditions([], None, None, None, False, now)
    assert st.queue_warnings([], ok) == ()
    bad = st.queue_conditions(ok, None, "it can admit no job", None, False, now)
    assert [(e.type, e.reason) for e in st.queue_warnings(ok, bad)] == [("Warning", "CannotAdmit")]
    assert st.queue_warnings(bad, bad) == ()
    over = st.queue_conditions(ok, None, None, "holds 24 GPUs", False, now)
    assert [e.reason for e in st.queue_warnings(ok, over)] == ["NominalLowered"]
    # OverQuota's message carries live usage: a new number is not a new Warning.
    more = st.queue_conditions(over, None, None, "holds 32 GPUs", False, now)
    assert st.queue_warnings(over, more) == ()
    assert st.condition(st.queue_conditions(more, None, None, None, False, now), st.OVER_QUOTA) is None


class CapturingWriter(RecordingWriter):
    def __init__(self, cache: ClusterCache, metrics: Metrics) -> None:
        super().__init__(cache, metrics)
        self.work: dict[str, Any] = {}

    def submit(self, key: str, work: Any, minor: bool = False) -> bool:
        self.work[key] = work
        return super().submit(key, work, minor)


def queue_update(writer: CapturingWriter, name: str) -> tuple[dict[str, Any], list[str]]:
    """The status patch and the Warning reasons a cycle handed the writer for queue `name`."""
    work = writer.work[f"gpuqueue/{name}"]
    _, patch, events = work.args
    return patch, [e.reason for e in events if e.type == "Warning"]


def conditions(patch: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in patch["conditions"]}


def test_a_cycle_sets_the_conditions_and_warns() -> None:
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team")], "1")
    cache.replace("node", [b.node("n0"), b.node("n1")], "1")
    # `lowered` runs a 16-GPU job but its quota was lowered to 8 since.
    running = b.job("big", ns="team", queue_name="lowered", status=b.placed_status(["n0", "n1"]))
    cache.replace("queue", [b.queue("empty", nominal=0), b.queue("lowered", nominal=8), b.queue("fine")], "1")
    cache.replace("job", [running], "1")
    cache.replace("pod", b.gang_pods("big", ["n0", "n1"], ns="team"), "1")
    metrics = Metrics()
    writer = CapturingWriter(cache, metrics)
    loop = SchedulingLoop(cache, writer, SchedulerConfig(), metrics, clock=lambda: b.T0 + 60)
    loop.cycle()

    patch, warned = queue_update(writer, "empty")
    assert conditions(patch) == {"Active": ("False", "CannotAdmit")} and warned == ["CannotAdmit"]
    patch, warned = queue_update(writer, "lowered")
    assert patch["usedGPUs"] == 16
    assert conditions(patch) == {"Active": ("True", "Ready"), "OverQuota": ("True", "NominalLowered")}
    assert warned == ["NominalLowered"]
    patch, warned = queue_update(writer, "fine")
    assert conditions(patch) == {"Active": ("True", "Ready")} and warned == []
