"""Preemption: whole gangs, allowed victims only, cheapest set, simulated before it is decided."""

from __future__ import annotations

from gpuq.core.decisions import PendingCode
from gpuq.core.model import PreemptionPolicy, ReclaimPreemption, WithinQueuePreemption

from .helpers import NOW, admitted, checkpoint, cluster, codes, job, never_preempt, pending, queue, run, snap

ONE_NODE = cluster(racks=1, nodes_per_rack=1)
TWO_NODES = cluster(racks=1, nodes_per_rack=2)


def victims(d: object) -> set[str]:
    return {p.victim for p in d.preempt}  # type: ignore[attr-defined]


def test_lower_priority_job_in_queue_is_preempted_for_a_higher_one() -> None:
    low = job("ns/low", gpus=8, priority=0, on=["n0000"])
    high = job("ns/high", gpus=8, priority=5)
    d = run(snap(ONE_NODE, [queue()], [low, high]))
    assert victims(d) == {"ns/low"}
    assert d.preempt[0].for_job == "ns/high"
    assert codes(d)["ns/high"] == PendingCode.WAITING_FOR_PREEMPTION
    assert pending(d)["ns/high"] == "waiting for 1 preempted gang to release GPUs"
    assert d.pending[0].nominated == ("n0000",)
    assert d.admit == ()  # the preemptor binds only once the victim is gone


def test_never_preempts_equal_or_higher_priority() -> None:
    d = run(
        snap(
            ONE_NODE,
            [queue()],
            [job("ns/run", gpus=8, priority=5, on=["n0000"]), job("ns/new", gpus=8, priority=5)],
        )
    )
    assert d.preempt == ()


def test_within_queue_never_policy_disables_preemption() -> None:
    q = queue(preemption=never_preempt())
    d = run(snap(ONE_NODE, [q], [job("ns/low", gpus=8, on=["n0000"]), job("ns/high", gpus=8, priority=5)]))
    assert d.preempt == ()


def test_non_preemptible_and_too_young_jobs_are_spared() -> None:
    pinned = job("ns/pinned", gpus=8, on=["n0000"], preemptible=False)
    young = job("ns/young", gpus=8, on=["n0001"], started=NOW - 10, min_runtime_seconds=60)
    d = run(snap(TWO_NODES, [queue()], [pinned, young, job("ns/high", gpus=8, priority=5)]))
    assert d.preempt == ()


def test_cheapest_victim_has_lowest_priority_first() -> None:
    jobs = [job("ns/p1", gpus=8, priority=1, on=["n0000"]), job("ns/p0", gpus=8, priority=0, on=["n0001"])]
    d = run(snap(TWO_NODES, [queue()], [*jobs, job("ns/high", gpus=8, priority=5)]))
    assert victims(d) == {"ns/p0"}


def test_cheapest_victim_loses_least_work_since_its_checkpoint() -> None:
    fresh = job("ns/fresh-ckpt", gpus=8, on=["n0000"], started=0, checkpoint=checkpoint(NOW - 5))
    stale = job("ns/stale-ckpt", gpus=8, on=["n0001"], started=0, checkpoint=checkpoint(NOW - 500))
    d = run(snap(TWO_NODES, [queue()], [fresh, stale, job("ns/high", gpus=8, priority=5)]))
    assert victims(d) == {"ns/fresh-ckpt"}


def test_fewest_victims_when_work_lost_ties() -> None:
    # Two 4-GPU jobs and one 8-GPU job, all started 50 s ago: 400 GPU-seconds lost either way.
    small = [job(f"ns/s{i}", gpus=4, on=["n0000"], started=NOW - 50) for i in range(2)]
    big = job("ns/big", gpus=8, on=["n0001"], started=NOW - 50)
    d = run(snap(TWO_NODES, [queue()], [*small, big, job("ns/high", gpus=8, priority=5)]))
    assert victims(d) == {"ns/big"}


def test_victims_are_whole_gangs() -> None:
    gang = job("ns/gang", replicas=2, gpus=8, on=["n0000", "n0001"])
    d = run(snap(TWO_NODES, [queue()], [gang, job("ns/high", gpus=8, priority=5)]))
    assert victims(d) == {"ns/gang"}
    assert len(d.pending[0].nominated) == 1


def test_borrowed_gang_reclaimed_by_lender() -> None:
    lender = queue("lender", nominal=8, cohort="c")
    borrower = queue("borrower", nominal=0, cohort="c")
    borrowed = job("ns/borrowed", queue="borrower", gpus=8, priority=9, on=["n0000"])
    d = run(snap(ONE_NODE, [lender, borrower], [borrowed, job("ns/own", queue="lender", gpus=8)]))
    assert victims(d) == {"ns/borrowed"}
    assert "runs on borrowed quota" in d.preempt[0].reason


def test_a_reclaimer_waits_for_the_borrowers_it_preempted() -> None:
    """Issue 33: once the borrower's gang was being evicted its queue no longer counted as
    borrowing, so the lender's job lost sight of it and said InsufficientCapacity (and the metric
    and explain agreed) while it waited for that very gang, as a within-queue preemptor does not."""
    a = queue("a", nominal=8, cohort="c")
    b = queue("b", nominal=8, cohort="c")
    borrowed = job("ns/borrowed", queue="b", replicas=2, gpus=8, on=["n0000", "n0001"])
    own = job("ns/own", queue="a", gpus=8)
    first = run(snap(TWO_NODES, [a, b], [borrowed, own]))
    assert victims(first) == {"ns/borrowed"}
    leaving = job("ns/borrowed", queue="b", replicas=2, gpus=8, on=["n0000", "n0001"], evicting=True)
    d = run(snap(TWO_NODES, [a, b], [leaving, own]))
    assert d.preempt == () and d.admit == ()
    assert codes(d)["ns/own"] == PendingCode.WAITING_FOR_PREEMPTION
    assert pending(d)["ns/own"] == "waiting for 1 preempted gang to release GPUs"
    assert d.pending[0].nominated == first.pending[0].nominated
    # Reclaim LowerPriority: a leaving gang of its priority or above is no victim it may wait for.
    policy = PreemptionPolicy(WithinQueuePreemption.LOWER_PRIORITY, ReclaimPreemption.LOWER_PRIORITY)
    strict = queue("a", nominal=8, cohort="c", preemption=policy)
    d = run(snap(TWO_NODES, [strict, b], [leaving, own]))
    assert codes(d)["ns/own"] == PendingCode.INSUFFICIENT_CAPACITY


def test_reclaim_lower_priority_policy_spares_higher_priority_borrowers() -> None:
    policy = PreemptionPolicy(WithinQueuePreemption.LOWER_PRIORITY, ReclaimPreemption.LOWER_PRIORITY)
    lender = queue("lender", nominal=8, cohort="c", preemption=policy)
    borrower = queue("borrower", nominal=0, cohort="c")
    borrowed = job("ns/borrowed", queue="borrower", gpus=8, priority=9, on=["n0000"])
    d = run(snap(ONE_NODE, [lender, borrower], [borrowed, job("ns/own", queue="lender", gpus=8)]))
    assert d.preempt == ()


def test_reclaim_never_touches_a_queue_within_its_nominal() -> None:
    a = queue("a", nominal=8, cohort="c")
    b = queue("b", nominal=8, cohort="c")
    within = job("ns/within", queue="b", gpus=8, on=["n0000"])
    d = run(snap(ONE_NODE, [a, b], [within, job("ns/new", queue="a", gpus=8)]))
    assert d.preempt == ()


def test_preemptor_waits_for_evicting_victims_instead_of_preempting_more() -> None:
    evicting = job("ns/going", gpus=8, on=["n0000"], evicting=True)
    other = job("ns/other", gpus=8, on=["n0001"])
    d = run(snap(TWO_NODES, [queue()], [evicting, other, job("ns/high", gpus=8, priority=5)]))
    assert d.preempt == ()
    assert pending(d)["ns/high"] == "waiting for 1 preempted gang to release GPUs"
    assert d.pending[0].nominated == ("n0000",)


def test_a_waiting_preemptor_takes_the_first_node_whose_leaving_gangs_suffice() -> None:
    """The search's shortcut for one-node waits (preemption._waiting_plan) returns what pricing
    every node would: the first node, in pool order, that gangs already leaving free enough on; a
    node whose leaving gang is too small needs a new victim, which a wait elsewhere beats."""
    nodes = cluster(racks=1, nodes_per_rack=4)
    jobs = [
        job("ns/paying", gpus=8, on=["n0000"]),
        job("ns/small-going", gpus=4, on=["n0001"], evicting=True),
        job("ns/small-paying", gpus=4, on=["n0001"]),
        job("ns/going-2", gpus=8, on=["n0002"], evicting=True),
        job("ns/going-3", gpus=8, on=["n0003"], evicting=True),
        job("ns/high", gpus=8, priority=5),
    ]
    d = run(snap(nodes, [queue()], jobs))
    assert d.preempt == ()
    assert pending(d)["ns/high"] == "waiting for 1 preempted gang to release GPUs"
    assert d.pending[0].nominated == ("n0002",)


def test_the_waiting_shortcut_leaves_a_node_with_room_before_it_to_the_full_search() -> None:
    """The shortcut for one-node waits (preemption._waiting_plan) leaves to the full search, on any
    state, a node before the leaving gangs' one that has room already: it gives a plan without any
    victim, which pricing every node finds first (the scheduler places such a job before it
    preempts; the search alone does not)."""
    from unittest.mock import patch

    from gpuq.core import preemption
    from gpuq.core.config import SchedulerConfig
    from gpuq.core.index import ClusterIndex
    from gpuq.core.placement import Request
    from gpuq.core.quota import QuotaBook
    from gpuq.core.state import CycleState
    from gpuq.core.topology import level_weights

    nodes = cluster(racks=2, nodes_per_rack=1, gpus=16)  # n0000 and n0010, one per rack
    running = [
        job("ns/paying", gpus=8, on=["n0000"]),  # n0000 keeps 8 GPUs free
        job("ns/going", gpus=8, on=["n0010"], evicting=True),
        job("ns/busy", gpus=8, on=["n0010"]),
    ]
    high = job("ns/high", gpus=8, priority=5)
    s, cfg = snap(nodes, [queue()], [*running, high]), SchedulerConfig()
    ix = ClusterIndex(s, cfg)
    st = CycleState(ix)
    book = QuotaBook(st, {"q": s.queues[0]}, ix.usage, ix.model_usage)
    req = Request(ix.demand["ns/high"], 1, None)
    pools, weights = st.pool_tiers(high, 1, None)[-1], level_weights(s.topology, cfg.weights)
    args = (st, book, high, s.queues[0], 8, req, pools, weights, [(j, False) for j in running], NOW)
    with patch.object(preemption, "_waiting_plan", lambda *_: None):
        full = preemption.search(*args)
    assert full is not None and full.victims == full.waiting == ()  # room on n0000: nothing to wait for
    assert preemption.search(*args) == full


def test_no_preemption_when_victims_would_not_make_room() -> None:
    nodes = cluster(racks=2, nodes_per_rack=1)
    jobs = [job("ns/a", gpus=8, on=["n0000"]), job("ns/b", gpus=8, on=["n0010"], priority=9)]
    # Needs two nodes in one rack: no rack has two nodes, so evicting ns/a cannot help.
    d = run(snap(nodes, [queue()], [*jobs, job("ns/high", replicas=2, gpus=8, priority=5, level="rack")]))
    assert d.preempt == ()


def test_preemption_frees_quota_within_the_queue() -> None:
    nodes = cluster(racks=1, nodes_per_rack=2)
    d = run(
        snap(
            nodes,
            [queue(nominal=8)],
            [job("ns/low", gpus=8, on=["n0000"]), job("ns/high", gpus=8, priority=5)],
        )
    )
    assert victims(d) == {"ns/low"}


def test_preemption_respects_required_topology_of_the_preemptor() -> None:
    nodes = cluster(racks=2, nodes_per_rack=2)
    jobs = [
        job("ns/r0a", gpus=8, on=["n0000"], priority=0),
        job("ns/r0b", gpus=8, on=["n0001"], priority=0),
        job("ns/r1a", gpus=8, on=["n0010"], priority=1),
        job("ns/r1b", gpus=8, on=["n0011"], priority=0),
    ]
    d = run(snap(nodes, [queue()], [*jobs, job("ns/high", replicas=2, gpus=8, priority=5, level="rack")]))
    assert victims(d) == {"ns/r0a", "ns/r0b"}
    assert admitted(d) == {}


def test_preemption_search_budget_defers_later_preemptors() -> None:
    from gpuq.core import SchedulerConfig

    low = [job(f"ns/low{i}", queue=f"q{i}", gpus=8, on=[f"n000{i}"]) for i in range(2)]
    high = [job(f"ns/high{i}", queue=f"q{i}", gpus=8, priority=5, created=900 + i) for i in range(2)]
    d = run(
        snap(TWO_NODES, [queue("q0"), queue("q1")], [*low, *high]),
        config=SchedulerConfig(max_preemption_searches_per_cycle=1),
    )
    assert len(d.preempt) == 1
    assert pending(d)["ns/high1"].endswith(
        "preemption search deferred to the next cycle (per-cycle budget used)"
    )


def test_only_the_queue_head_preempts_in_a_cycle() -> None:
    """Like Kueue, one preemptor per queue per cycle: the job behind a preempting head waits for the
    next cycle instead of evicting more gangs now (no reclaim churn over leftovers)."""
    low = [job(f"ns/low{i}", gpus=8, on=[f"n000{i}"]) for i in range(2)]
    high = [job(f"ns/high{i}", gpus=8, priority=5, created=900 + i) for i in range(2)]
    d = run(snap(TWO_NODES, [queue()], [*low, *high]))
    assert [p.for_job for p in d.preempt] == ["ns/high0"]
    assert codes(d)["ns/high0"] == PendingCode.WAITING_FOR_PREEMPTION
    assert codes(d)["ns/high1"] == PendingCode.INSUFFICIENT_CAPACITY


# ---- preemptions that buy nothing (issue 33) ------------------------------------------------------


def test_a_preemption_is_called_off_when_its_preemptor_fits_elsewhere() -> None:
    """The preemptor found room on a node that came back while its victim checkpointed: evicting the
    victim now would cost it a restart and buy nothing."""
    low = job("ns/low", gpus=8, on=["n0000"])
    high = job("ns/high", gpus=8, priority=5)
    busy = job("ns/busy", gpus=8, priority=9, on=["n0001"])
    first = run(snap(TWO_NODES, [queue()], [low, busy, high]))
    assert victims(first) == {"ns/low"} and first.abandon == ()
    leaving = job("ns/low", gpus=8, on=["n0000"], evicting=True)
    still = run(snap(TWO_NODES, [queue()], [leaving, busy, high]))
    assert still.abandon == () and codes(still)["ns/high"] == PendingCode.WAITING_FOR_PREEMPTION
    freed = run(snap(TWO_NODES, [queue()], [leaving, high]))  # busy ended: room on n0001
    assert admitted(freed) == {"ns/high": ("n0001",)}
    assert [a.victim for a in freed.abandon] == ["ns/low"]
    assert "no job waits for its GPUs any more" in freed.abandon[0].reason
    gone = run(snap(TWO_NODES, [queue()], [leaving, busy]))  # the preemptor was deleted
    assert [a.victim for a in gone.abandon] == ["ns/low"]


def test_a_preemption_the_quota_forced_is_carried_through_and_says_so() -> None:
    """`gpuq resume` of an 8-GPU priority-10 job preempted a 48-GPU one while GPUs were free: its
    queue's quota (48) had no room for both. The victim's reason says so; the preemptor is then
    admitted on the free GPUs, and the victim still goes: keeping it would overrun the quota."""
    nodes = cluster(racks=1, nodes_per_rack=8)
    big = job("ns/big", replicas=6, gpus=8, on=[f"n000{i}" for i in range(6)])
    small = job("ns/small", gpus=8, priority=10)
    first = run(snap(nodes, [queue(nominal=48)], [big, small]))
    assert victims(first) == {"ns/big"}
    assert first.preempt[0].reason == (
        "preempted by ns/small (priority 10 > 0) in queue q to free quota: "
        + run(snap(nodes, [queue(nominal=48, preemption=never_preempt())], [big, small])).pending[0].reason
    )
    leaving = job("ns/big", replicas=6, gpus=8, on=[f"n000{i}" for i in range(6)], evicting=True)
    then = run(snap(nodes, [queue(nominal=48)], [leaving, small]))
    assert set(admitted(then)) == {"ns/small"} and then.abandon == ()


def test_a_capacity_preemption_says_it_frees_room() -> None:
    d = run(
        snap(ONE_NODE, [queue()], [job("ns/low", gpus=8, on=["n0000"]), job("ns/high", gpus=8, priority=5)])
    )
    assert d.preempt[0].reason == "preempted by ns/high (priority 5 > 0) in queue q to free room on its nodes"


def test_a_reclaim_is_called_off_only_if_the_cohort_can_lend_again() -> None:
    a = queue("a", nominal=8, cohort="c")
    b = queue("b", nominal=8, cohort="c")
    leaving = job("ns/borrowed", queue="b", replicas=2, gpus=8, on=["n0000", "n0001"], evicting=True)
    three = cluster(racks=1, nodes_per_rack=3)
    # The lender's job got in on a third node: the borrower running again would borrow what a lends.
    own = job("ns/own", queue="a", gpus=8)
    d = run(snap(three, [a, b], [leaving, own]))
    assert admitted(d) == {"ns/own": ("n0002",)} and d.abandon == ()
    # The lender's job went away instead: nothing needs the borrowed GPUs back.
    assert [x.victim for x in run(snap(three, [a, b], [leaving])).abandon] == ["ns/borrowed"]


def test_stops_and_incomplete_cycles_call_nothing_off() -> None:
    from gpuq.core import SchedulerConfig

    stopping = job("ns/low", gpus=8, on=["n0000"], evicting=True, stopping=True)
    assert run(snap(TWO_NODES, [queue()], [stopping])).abandon == ()
    # A preemptor whose search the per-cycle budget deferred may still count on it.
    leaving = job("ns/low", gpus=8, on=["n0000"], evicting=True)
    busy = job("ns/busy", gpus=8, priority=9, on=["n0001"])
    high = job("ns/high", gpus=8, priority=5)
    capped = SchedulerConfig(max_preemption_searches_per_cycle=0)
    d = run(snap(TWO_NODES, [queue()], [leaving, busy, high]), config=capped)
    assert d.abandon == () and "deferred" in pending(d)["ns/high"]


def test_a_preemptor_waiting_for_an_evicting_gang_verifies_that_node_only() -> None:
    """Once a plan without new victims on one node is verified, no other domain could replace it
    (issue 34): the other candidate nodes are not verified, and the decision is the same as with."""
    from unittest.mock import patch

    from gpuq.core import preemption

    nodes = cluster(racks=1, nodes_per_rack=4)
    low = [
        job(f"ns/low{i}", gpus=8, priority=0, on=[f"n000{i}"], evicting=i == 2, started=100.0)
        for i in range(4)
    ]
    s = snap(nodes, [queue()], [*low, job("ns/high", gpus=8, priority=5)])
    verified: list[int] = []
    real = preemption._Search.verify

    def spy(self, pool, dom, depth, chosen, bucket):  # type: ignore[no-untyped-def]
        verified.append(dom)
        return real(self, pool, dom, depth, chosen, bucket)

    with patch.object(preemption._Search, "verify", spy):
        d = run(s)
        assert len(verified) == 1
        with (
            patch.object(preemption._Search, "_unbeatable", lambda *_: False),
            patch.object(preemption, "_waiting_plan", lambda *_: None),
        ):
            assert run(s) == d
        assert len(verified) == 5  # every candidate node, without the shortcuts (both stop there)
    assert d.preempt == () and codes(d)["ns/high"] == PendingCode.WAITING_FOR_PREEMPTION
