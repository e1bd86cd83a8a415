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
from gpuq.controller.queuehealth import OverQuota, cannot_admit, over_quotas
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


def over_quota(q: Queue, used: int, *peers: Queue, peer_used: int = 0) -> str | None:
    """over_quotas' verdict on q holding `used` GPUs ("reason: message"), its cohort peers each
    holding `peer_used`."""
    usage = {q.name: used, **{p.name: peer_used for p in peers}}
    found = over_quotas(queues(q, *peers), usage).get(q.name)
    return None if found is None else f"{found.reason}: {found.message}"


def test_usage_above_a_lowered_quota_is_reported() -> None:
    assert over_quota(Queue("q", 16), 16) is None
    assert "NominalLowered: holds 24 GPUs, above its nominalGPUs 16" in (over_quota(Queue("q", 16), 24) or "")
    # In a cohort, usage above nominal is borrowing: only a borrowing limit below it is a problem
    # (or a cohort that no longer lends what its queues borrow).
    lender = Queue("lender", 64, cohort="c")
    assert over_quota(Queue("q", 16, cohort="c"), 40, lender) is None
    limited = Queue("q", 8, cohort="c", borrowing_limit_gpus=4)
    assert over_quota(limited, 12, lender) is None
    assert "BorrowingLimitLowered: borrows 16 GPUs" in (over_quota(limited, 24, lender) or "")


def test_borrowing_above_what_the_cohort_lends_is_reported_on_the_borrowers() -> None:
    q, peer = Queue("q", 8, cohort="c"), Queue("peer", 16, cohort="c")
    # The peer lends its unused 16 - 8: q may borrow 8, not 9.
    assert over_quota(q, 16, peer, peer_used=8) is None
    found = over_quota(q, 17, peer, peer_used=8) or ""
    assert found.startswith("CohortQuotaLowered: borrows 9 GPUs") and "lends 8 GPUs for the 9" in found
    # A lending limit lowered under what is lent counts the same way.
    assert over_quota(q, 16, Queue("peer", 16, cohort="c", lending_limit_gpus=7), peer_used=8) is not None
    # The lender itself borrows nothing: it is not over its quota.
    assert over_quota(peer, 8, q, peer_used=17) is None


def test_warnings_only_when_a_problem_appears_or_changes() -> None:
    now = b.T0
    ok = st.queue_conditions([], None, None, None, now)
    assert st.queue_warnings([], ok) == ()
    bad = st.queue_conditions(ok, None, "it can admit no job", None, now)
    assert [(e.type, e.reason) for e in st.queue_warnings(ok, bad)] == [("Warning", "CannotAdmit")]
    assert st.queue_warnings(bad, bad) == ()
    over = st.queue_conditions(ok, None, None, OverQuota("NominalLowered", "holds 24 GPUs"), now)
    assert [e.reason for e in st.queue_warnings(ok, over)] == ["NominalLowered"]
    # OverQuota's message carries live usage: a new number is not a new Warning.
    more = st.queue_conditions(over, None, None, OverQuota("NominalLowered", "holds 32 GPUs"), now)
    assert st.queue_warnings(over, more) == ()
    assert st.condition(st.queue_conditions(more, None, None, None, now), st.OVER_QUOTA) is None


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


def cohort_cycle(peer_runs: bool) -> CapturingWriter:
    """Cohort c: `lowered` runs 16 GPUs on a nominal quota since lowered to 4 (it borrows 12);
    `peer` (nominal 16) runs 16 itself when `peer_runs`, else it is idle and lends its 16."""
    cache = ClusterCache()
    cache.replace("namespace", [b.namespace("team")], "1")
    cache.replace("node", [b.node(f"n{i}") for i in range(4)], "1")
    jobs = [b.job("big", ns="team", queue_name="lowered", status=b.placed_status(["n0", "n1"]))]
    pods = b.gang_pods("big", ["n0", "n1"], ns="team")
    if peer_runs:
        jobs.append(b.job("peer", ns="team", queue_name="peer", status=b.placed_status(["n2", "n3"])))
        pods += b.gang_pods("peer", ["n2", "n3"], ns="team")
    cache.replace(
        "queue", [b.queue("lowered", nominal=4, cohort="c"), b.queue("peer", nominal=16, cohort="c")], "1"
    )
    cache.replace("job", jobs, "1")
    cache.replace("pod", pods, "1")
    metrics = Metrics()
    writer = CapturingWriter(cache, metrics)
    SchedulingLoop(cache, writer, SchedulerConfig(), metrics, clock=lambda: b.T0 + 60).cycle()
    return writer


def test_borrowing_more_than_the_cohort_lends_after_a_lowered_quota_is_reported() -> None:
    # The peer runs its own 16: the cohort lends nothing, yet `lowered` borrows 12 of it.
    writer = cohort_cycle(peer_runs=True)
    patch, warned = queue_update(writer, "lowered")
    assert (patch["usedGPUs"], patch["borrowedGPUs"]) == (16, 12)
    assert conditions(patch)["OverQuota"] == ("True", "CohortQuotaLowered")
    assert warned == ["CohortQuotaLowered"]
    message = next(c["message"] for c in patch["conditions"] if c["type"] == "OverQuota")
    assert "borrows 12 GPUs" in message and "lends 0" in message, message
    # The peer holds only its own quota: nothing to report on it.
    patch, _ = queue_update(writer, "peer")
    assert "OverQuota" not in conditions(patch)
    # With the peer idle, the same 12 GPUs are borrowed from its 16: that is what a cohort is for.
    patch, _ = queue_update(cohort_cycle(peer_runs=False), "lowered")
    assert "OverQuota" not in conditions(patch)
