"""The cycle memo: a cycle after one that decided nothing recalls failed classes instead of trying
them, and must still decide (and, when it explains, explain) exactly like a cycle that tries
everything."""

from __future__ import annotations

from dataclasses import replace
from unittest.mock import patch

from gpuq.core import ClusterIndex, SchedulerConfig, schedule, scheduler
from gpuq.core.decisions import PendingCode
from gpuq.core.model import Checkpoint, Job, Snapshot

from .helpers import NOW, cluster, codes, job, pending, queue, snap

NODES = cluster(racks=1, nodes_per_rack=2)  # 16 GPUs
CFG = SchedulerConfig()


def test_a_new_head_that_lifts_a_reservation_lets_other_queues_in() -> None:
    running = job("ns/running", queue="a", gpus=4, on=["n0000"], priority=9)  # 12 GPUs free
    starving = job("ns/big", queue="a", gpus=8, replicas=2, created=NOW - 1000)  # reserves all 12
    other = job("ns/small", queue="b", gpus=4, created=NOW - 100)
    s1 = snap(NODES, [queue("a"), queue("b")], [running, starving, other])
    ix = ClusterIndex(s1, CFG)
    d1 = schedule(s1, NOW, CFG, index=ix, explain=False)
    assert not (d1.admit or d1.preempt or d1.restart)  # ns/small fails: the reservation holds it all
    # A higher-priority job becomes queue a's head: not starving, so no reservation any more.
    urgent = job("ns/urgent", queue="a", gpus=8, replicas=2, priority=5, created=NOW)
    s2 = replace(s1, jobs=(*s1.jobs, urgent))
    ix.apply(s2, jobs=[urgent])
    fresh = schedule(s2, NOW + 1, CFG, explain=False)
    assert [a.job for a in fresh.admit] == ["ns/small"]
    assert schedule(s2, NOW + 1, CFG, index=ix, explain=False) == fresh


def test_nothing_changed_recalls_and_decides_the_same() -> None:
    running = job("ns/running", queue="a", gpus=8, on=["n0000", "n0001"], replicas=2)
    waiting = [job(f"ns/w{i}", queue=q, gpus=8, created=NOW - 50 - i) for i, q in enumerate("ab")]
    s1 = snap(NODES, [queue("a"), queue("b")], [running, *waiting])
    ix = ClusterIndex(s1, CFG)
    assert schedule(s1, NOW, CFG, index=ix, explain=False).admit == ()
    late = job("ns/late", queue="b", gpus=8, created=NOW + 10)
    s2 = replace(s1, jobs=(*s1.jobs, late))
    ix.apply(s2, jobs=[late])
    assert schedule(s2, NOW + 10, CFG, index=ix, explain=False) == schedule(s2, NOW + 10, CFG, explain=False)


def _cohort_case() -> tuple[Snapshot, Job, SchedulerConfig]:
    """Queue b borrows from a (cohort c); b's head wants more than a lends: its reason names
    what a lends, which an admission in a changes."""
    nodes = cluster(racks=1, nodes_per_rack=4)  # 32 GPUs
    cfg = replace(CFG, locality_wait_seconds=0.0)
    qa, qb = queue("a", nominal=16, cohort="c"), queue("b", nominal=8, cohort="c")
    running = job("ns/b-run", queue="b", gpus=8, on=["n0000"])
    head = job("ns/b-big", queue="b", gpus=6, replicas=3, created=NOW)  # 18 GPUs above nominal
    return snap(nodes, [qa, qb], [running, head]), running, cfg


def test_an_explaining_cycle_recalls_a_class_across_a_checkpoint_and_queued_jobs() -> None:
    s1, running, cfg = _cohort_case()
    other = job("ns/b-other", queue="b", gpus=6, replicas=3, created=NOW + 1)
    s1 = replace(s1, jobs=(*s1.jobs, other))
    ix = ClusterIndex(s1, cfg)
    first = schedule(s1, NOW, cfg, index=ix)
    assert "ns/b-big" in {p.job for p in first.pending}
    # A checkpoint, a queued job gone and one arriving: none frees capacity or quota.
    ckpt = replace(running, checkpoint=Checkpoint(NOW, 7, "/ck"))
    late = job("ns/b-late", queue="b", gpus=6, replicas=3, created=NOW + 5)
    s2 = replace(s1, jobs=(ckpt, s1.jobs[1], late))
    ix.apply(s2, jobs=[ckpt, late], removed_jobs=["ns/b-other"])
    assert (ix.changes, ix.reprices) == (0, 1)
    with patch.object(scheduler._Cycle, "_try", autospec=True, side_effect=scheduler._Cycle._try) as tried:
        kept = schedule(s2, NOW + 1, cfg, index=ix)
    assert tried.call_count == 0  # the head's class was recalled, reason and all
    assert kept == schedule(s2, NOW + 1, cfg)


def test_an_admission_before_a_recalled_class_has_its_reason_found_again() -> None:
    s1, _, cfg = _cohort_case()
    ix = ClusterIndex(s1, cfg)
    before = schedule(s1, NOW, cfg, index=ix)
    assert "lends 16" in pending(before)["ns/b-big"]
    # Queue a admits a job first (it does not borrow): a lends less, and b's head says so.
    urgent = job("ns/a-new", queue="a", gpus=8, created=NOW)
    s2 = replace(s1, jobs=(*s1.jobs, urgent))
    ix.apply(s2, jobs=[urgent])
    after = schedule(s2, NOW + 1, cfg, index=ix)
    assert [a.job for a in after.admit] == ["ns/a-new"]
    assert "lends 8" in pending(after)["ns/b-big"]
    assert after == schedule(s2, NOW + 1, cfg)


def _explained_again(s: Snapshot, cfg: SchedulerConfig, later: float) -> None:
    """An explaining cycle, then another on the same snapshot later: the kept index's (which may
    reuse the first's Pendings, queue by queue) equals a fresh one's."""
    ix = ClusterIndex(s, cfg)
    schedule(s, NOW, cfg, index=ix)
    kept = schedule(s, later, cfg, index=ix)
    assert kept == schedule(s, later, cfg)


def test_a_queue_stopped_for_a_starving_head_is_explained_with_its_age() -> None:
    nodes = cluster(racks=1, nodes_per_rack=2)
    running = job("ns/run", gpus=8, on=["n0000"], priority=5)
    head = job("ns/head", gpus=8, created=NOW - 1000)  # starving; its queue's quota holds it back
    behind = job("ns/behind", gpus=1, created=NOW - 10)
    s = snap(nodes, [queue(nominal=8)], [running, head, behind])
    first = schedule(s, NOW, CFG)
    assert "waiting 1000s" in pending(first)["ns/behind"]
    _explained_again(s, CFG, NOW + 30)


def test_a_failed_class_behind_its_head_counts_its_back_offs_down() -> None:
    nodes = cluster(racks=1, nodes_per_rack=1)
    running = job("ns/run", gpus=8, on=["n0000"], priority=5)
    head = job("ns/head", gpus=4, created=NOW - 20)
    backing = job("ns/backing", gpus=4, created=NOW - 10, not_before=NOW + 100)
    s = snap(nodes, [queue()], [running, head, backing])
    assert "next attempt in 100s" in pending(schedule(s, NOW, CFG))["ns/backing"]
    _explained_again(s, CFG, NOW + 30)


def test_a_wait_for_evicting_gangs_not_repeated_frees_its_quota_for_a_recalled_class() -> None:
    """A head that waited for a peer's evicting gang took quota (and the gang's room) without an
    admission. The next cycle a new job of its queue is admitted ahead of it: it no longer fits its
    nominal quota, may not reclaim, and waits for nothing, so the quota it held is lent again. A class
    that failed for want of that quota behind it is tried, not recalled, though every job it failed
    with is still there, unchanged."""
    nodes = cluster(racks=1, nodes_per_rack=2)  # 16 GPUs
    qa, qb = queue("a", nominal=4, cohort="c"), queue("b", nominal=8, cohort="c")
    qx = queue("x", nominal=0, cohort="c")
    leaving = job("ns/a-leaving", queue="a", gpus=8, on=["n0000"], evicting=True)  # borrowed, being evicted
    kept = job("ns/a-kept", queue="a", gpus=4, on=["n0001"])  # a at its nominal: 4 GPUs free on n0001
    waiter = job("ns/b-waiter", queue="b", gpus=8, created=NOW - 50)  # fits b's nominal: waits for it
    borrower = job("ns/x-borrower", queue="x", gpus=2, created=NOW - 40)  # the cohort lends it nothing
    s1 = snap(nodes, [qa, qb, qx], [leaving, kept, waiter, borrower])
    ix = ClusterIndex(s1, CFG)
    first = schedule(s1, NOW, CFG, index=ix, explain=False)
    assert first == schedule(s1, NOW, CFG, explain=False)
    assert not (first.admit or first.preempt or first.abandon)  # b's head waits for a's leaving gang
    waiting = schedule(s1, NOW, CFG)
    assert codes(waiting) == {
        "ns/b-waiter": PendingCode.WAITING_FOR_PREEMPTION,
        "ns/x-borrower": PendingCode.COHORT_EXHAUSTED,
    }
    # A job that goes ahead of the waiter in b arrives: nothing started, left or changed since.
    urgent = job("ns/b-urgent", queue="b", gpus=1, priority=1, created=NOW)
    s2 = replace(s1, jobs=(*s1.jobs, urgent))
    ix.apply(s2, jobs=[urgent])
    assert ix.changes == 0 and ix.takes == 0
    fresh = schedule(s2, NOW + 1, CFG, explain=False)
    assert {a.job for a in fresh.admit} == {"ns/b-urgent", "ns/x-borrower"}
    assert schedule(s2, NOW + 1, CFG, index=ix, explain=False) == fresh
