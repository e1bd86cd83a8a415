"""Stopping work without a preemptor: spec.suspend on a job, stopPolicy on a queue. What the snapshot
keeps out or marks for eviction, and the statuses the loop writes."""

from __future__ import annotations

from builders import T0, gang_pods, job, node, placed_status, queue

from gpuq.controller.cache import ClusterCache
from gpuq.controller.intents import blocked_status, pending_status
from gpuq.controller.objects import parse_job
from gpuq.controller.preemption import STOP_DRAIN, STOP_SUSPEND, Eviction
from gpuq.controller.snapshot import SUSPENDED, SnapshotBuilder, View
from gpuq.core import schedule
from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Pending, PendingCode

CFG = SchedulerConfig()


def build(*bodies: dict, evicting: frozenset[str] = frozenset()) -> View:
    cache = ClusterCache()
    for b in bodies:
        kind = {"GPUQueue": "queue", "TrainingJob": "job"}.get(b["kind"], b["kind"].lower())
        getattr(cache, f"upsert_{kind}")(b)
    return SnapshotBuilder().build(cache, T0 + 100, CFG, evicting)


def test_a_suspended_queued_job_is_kept_out_as_suspended() -> None:
    v = build(node("n1"), node("n2"), queue("q"), job("a", suspend=True), job("b"))
    assert v.excluded["team-a/a"].reason == SUSPENDED
    assert [j.key for j in v.snapshot.jobs] == ["team-a/b"] and v.stopping == {}


def test_a_suspended_running_job_keeps_its_nodes_until_evicted() -> None:
    running = job("a", suspend=True, status=placed_status(["n1", "n2"]))
    v = build(node("n1"), node("n2"), queue("q"), running, *gang_pods("a", ["n1", "n2"]))
    assert v.stopping == {"team-a/a": STOP_SUSPEND}
    assert "team-a/a" in v.holding and "team-a/a" not in v.excluded


def test_a_draining_queue_evicts_its_placed_jobs_and_holds_its_queued_ones() -> None:
    q = queue("q", stopPolicy="HoldAndDrain")
    running = job("a", status=placed_status(["n1"]), replicas=1)
    waiting = job("b", replicas=1)
    v = build(node("n1"), node("n2"), q, running, waiting, *gang_pods("a", ["n1"]))
    assert v.stopping == {"team-a/a": STOP_DRAIN}
    d = schedule(v.snapshot, T0 + 100, CFG)
    assert d.admit == () and {p.job: p.code for p in d.pending} == {"team-a/b": PendingCode.HELD}


def test_hold_keeps_running_jobs() -> None:
    running = job("a", status=placed_status(["n1"]), replicas=1)
    v = build(node("n1"), queue("q", stopPolicy="Hold"), running, *gang_pods("a", ["n1"]))
    assert v.stopping == {} and v.snapshot.queues[0].held


def test_suspended_status_and_resume() -> None:
    entry = parse_job(job("a", suspend=True, status={"phase": "Preempted", "reason": "Preempted"}))
    v_excl = build(node("n1"), queue("q"), job("a", suspend=True)).excluded["team-a/a"]
    patch, events = blocked_status(entry, v_excl, T0)
    assert patch["phase"] == "Suspended" and patch["reason"] == "Suspended"
    assert [(e.type, e.reason) for e in events] == [("Normal", "Suspended")]
    # A running gang stopped by its eviction (phase Suspended, its own Event): no second Event.
    stopped = parse_job(job("a", suspend=True, status={"phase": "Suspended", "reason": "Suspended"}))
    patch, events = blocked_status(stopped, v_excl, T0)
    assert events == ()
    # Resumed: back to the queue, with the core's reason.
    resumed = parse_job(job("a", status={"phase": "Suspended", "reason": "Suspended"}))
    again = pending_status(resumed, Pending("team-a/a", "needs 16 GPUs", 1, code="InsufficientCapacity"), T0)
    assert again["phase"] == "Queued" and again["reason"] == "InsufficientCapacity"


def test_stops_describe_themselves_and_are_not_preemptions() -> None:
    stop = Eviction("team-a/a", STOP_SUSPEND, "suspended (spec.suspend)", T0, T0 + 60, None)
    pre = Eviction("team-a/a", "team-a/b", "priority 5 > 0", T0, T0 + 60, None)
    assert stop.is_stop and stop.describe() == "suspended (spec.suspend)"
    assert not pre.is_stop and pre.describe() == "preempted by team-a/b (priority 5 > 0)"
    # The core's reasons name the preemptor themselves: not "preempted by X (preempted by X (...))".
    why = "preempted by team-a/b (priority 5 > 0) in queue q to free room on its nodes"
    assert Eviction("team-a/a", "team-a/b", why, T0, T0 + 60, None).describe() == why
