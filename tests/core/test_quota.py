"""Quota: nominal, cohort borrowing and lending limits, weighted fair share."""

from __future__ import annotations

import random

from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import PendingCode
from gpuq.core.index import ClusterIndex
from gpuq.core.model import Queue
from gpuq.core.quota import QuotaBook
from gpuq.core.state import CycleState

from .helpers import admitted, cluster, codes, job, never_preempt, pending, queue, run, snap

NODES = cluster(racks=2, nodes_per_rack=4)  # 64 GPUs


def test_queue_without_cohort_stops_at_nominal() -> None:
    jobs = [job("ns/a", queue="team-a", gpus=8, on=["n0000"]), job("ns/b", queue="team-a", gpus=8)]
    d = run(snap(NODES, [queue("team-a", nominal=8)], jobs))
    assert d.admit == ()
    assert d.pending[0].reason == "queue team-a uses 8 GPUs (nominal quota 8); this job needs 8 (16 > 8)"
    assert d.pending[0].code == PendingCode.QUOTA_EXCEEDED


def test_borrows_what_the_cohort_lends() -> None:
    qs = [queue("a", nominal=8, cohort="c"), queue("b", nominal=16, cohort="c")]
    d = run(snap(NODES, qs, [job("ns/big", queue="a", replicas=3, gpus=8)]))
    assert set(admitted(d)) == {"ns/big"}
    assert d.admit[0].borrowed_gpus == 16
    assert d.queue_borrowed == {"a": 16, "b": 0}


def test_cannot_borrow_more_than_the_cohort_lends() -> None:
    qs = [queue("a", nominal=8, cohort="c"), queue("b", nominal=16, cohort="c")]
    running = job("ns/b1", queue="b", gpus=8, on=["n0000"])
    d = run(snap(NODES, qs, [running, job("ns/big", queue="a", replicas=3, gpus=8)]))
    assert d.admit == ()
    # Issue 33: "at quota 0/8" read as a full queue; it is the job that is bigger than the quota.
    assert d.pending[0].reason == (
        "queue a uses 0 GPUs (nominal quota 8); this job needs 24, 16 above its nominal, and cohort c lends 8"
    )
    assert d.pending[0].code == PendingCode.COHORT_EXHAUSTED


def test_lending_limit_caps_what_a_queue_lends() -> None:
    qs = [queue("a", nominal=8, cohort="c"), queue("b", nominal=32, cohort="c", lending_limit_gpus=8)]
    d = run(
        snap(
            NODES,
            qs,
            [job("ns/x", queue="a", replicas=2, gpus=8), job("ns/y", queue="a", replicas=3, gpus=8)],
        )
    )
    assert set(admitted(d)) == {"ns/x"}
    assert codes(d)["ns/y"] == PendingCode.COHORT_EXHAUSTED


def test_borrowing_limit_caps_what_a_queue_borrows() -> None:
    qs = [queue("a", nominal=8, cohort="c", borrowing_limit_gpus=8), queue("b", nominal=32, cohort="c")]
    d = run(
        snap(
            NODES,
            qs,
            [job("ns/x", queue="a", replicas=3, gpus=8), job("ns/y", queue="a", replicas=2, gpus=8)],
        )
    )
    assert set(admitted(d)) == {"ns/y"}
    assert "borrowing limit is 8" in d.pending[0].reason
    assert d.pending[0].code == PendingCode.BORROWING_LIMIT


def test_fair_share_splits_spare_capacity_by_weight() -> None:
    qs = [
        queue("heavy", nominal=0, cohort="c", weight=3.0),
        queue("light", nominal=0, cohort="c", weight=1.0),
        queue("lender", nominal=32, cohort="c"),
    ]
    jobs = [job(f"ns/h{i}", queue="heavy", gpus=4, created=900 + i) for i in range(8)]
    jobs += [job(f"ns/l{i}", queue="light", gpus=4, created=900 + i) for i in range(8)]
    d = run(snap(NODES, qs, jobs))
    assert d.queue_usage["heavy"] == 24 and d.queue_usage["light"] == 8


def test_heads_within_nominal_go_before_borrowers() -> None:
    qs = [
        queue("own", nominal=8, cohort="c"),
        queue("borrower", nominal=0, cohort="c"),
        queue("l", 16, cohort="c"),
    ]
    nodes = cluster(racks=1, nodes_per_rack=1)  # 8 GPUs: only one of the two jobs fits
    jobs = [
        job("ns/borrow", queue="borrower", gpus=8, created=1),
        job("ns/own", queue="own", gpus=8, created=500),
    ]
    d = run(snap(nodes, qs, jobs))
    assert set(admitted(d)) == {"ns/own"}


def test_evicting_jobs_do_not_count_against_quota() -> None:
    jobs = [job("ns/old", gpus=8, on=["n0000"], evicting=True), job("ns/new", gpus=8)]
    d = run(snap(NODES, [queue(nominal=8)], jobs))
    assert set(admitted(d)) == {"ns/new"}
    assert admitted(d)["ns/new"] != ("n0000",)


def test_lender_within_nominal_cannot_take_back_lent_gpus_without_reclaim() -> None:
    """GPUs a queue lent are not free for it while a peer borrows them, even on an idle cluster:
    admitting it anyway would run the cohort above its total quota."""
    qs = [
        queue("a", nominal=16, cohort="c", preemption=never_preempt()),
        queue("b", nominal=16, cohort="c"),
    ]
    borrower = job("ns/b-big", queue="b", replicas=4, gpus=8, on=["n0000", "n0001", "n0002", "n0003"])
    d = run(snap(NODES, qs, [borrower, job("ns/a1", queue="a", replicas=2, gpus=8)]))
    assert d.admit == () and d.preempt == ()
    assert codes(d)["ns/a1"] == PendingCode.COHORT_EXHAUSTED
    assert "peers borrow 16 of its lent GPUs" in pending(d)["ns/a1"]


def test_lender_within_nominal_reclaims_lent_gpus_by_preemption() -> None:
    qs = [queue("a", nominal=16, cohort="c"), queue("b", nominal=16, cohort="c")]
    own = job("ns/b-own", queue="b", replicas=2, gpus=8, on=["n0000", "n0001"])
    lent = job("ns/b-lent", queue="b", replicas=2, gpus=8, on=["n0002", "n0003"])
    d = run(snap(NODES, qs, [own, lent, job("ns/a1", queue="a", replicas=2, gpus=8)]))
    assert [p.victim for p in d.preempt] in (["ns/b-own"], ["ns/b-lent"])  # one gang frees 16
    assert codes(d)["ns/a1"] == PendingCode.WAITING_FOR_PREEMPTION


def _random_queues(rnd: random.Random, borrowing_limits: tuple[int | None, ...] = ()) -> dict[str, Queue]:
    """Six queues in two cohorts or none, random nominals, lending and (if given) borrowing limits."""
    return {
        f"q{i}": queue(
            f"q{i}",
            nominal=rnd.choice((0, 4, 8, 16)),
            cohort=rnd.choice(("c1", "c2", None)),
            lending_limit_gpus=rnd.choice((None, 0, 4)),
            borrowing_limit_gpus=rnd.choice(borrowing_limits) if borrowing_limits else None,
        )
        for i in range(6)
    }


def test_cohort_totals_stay_exact_under_any_usage_changes() -> None:
    """QuotaBook keeps per-cohort lent/borrowed sums incrementally; they equal a recount always."""
    rnd = random.Random(7)
    qs = _random_queues(rnd)
    s = snap(NODES, qs.values(), [])
    st = CycleState(ClusterIndex(s, SchedulerConfig()))
    book = QuotaBook(st, qs, {q: rnd.randint(0, 20) for q in qs}, {})
    for step in range(500):
        mark = st.begin()
        book.add(rnd.choice(list(qs)), rnd.randint(-8, 8), {})
        if step % 3 == 0:
            st.rollback(mark)
        else:
            st.commit(mark)
        for q in qs.values():
            peers = [p for p in qs.values() if p.cohort == q.cohort and p.name != q.name]
            expected = (sum(book.lent(p) for p in peers), sum(book.borrowed(p) for p in peers))
            assert book.cohort_lends(q) == (expected if q.cohort else (0, 0))


def test_admits_is_check_ok_without_the_reason() -> None:
    """QuotaBook.admits (what preemption searches ask for every victim set) says what check().ok
    says, under every rule: nominal alone, borrowing limits, lending limits, the cohort invariant."""
    rnd = random.Random(11)
    qs = _random_queues(rnd, borrowing_limits=(None, 0, 4, 8))
    st = CycleState(ClusterIndex(snap(NODES, qs.values(), []), SchedulerConfig()))
    book = QuotaBook(st, qs, {q: rnd.randint(0, 20) for q in qs}, {})
    seen: set[tuple[bool, PendingCode]] = set()
    for _ in range(2000):
        book.add(rnd.choice(list(qs)), rnd.randint(-6, 6), {})
        q, gpus = qs[rnd.choice(list(qs))], rnd.randint(0, 24)
        check = book.check(q, gpus)
        assert book.admits(q, gpus) == check.ok
        seen.add((check.ok, check.code))
    refused = {code for ok, code in seen if not ok}
    assert refused == {PendingCode.QUOTA_EXCEEDED, PendingCode.BORROWING_LIMIT, PendingCode.COHORT_EXHAUSTED}


def test_lent_is_what_peers_borrow_split_among_the_lenders() -> None:
    """`gpuq queues` LENT: GPUs of a queue's quota its peers use now, not what it could lend."""
    from gpuq.core.quota import lent_out

    qs = [
        queue("a", nominal=8, cohort="c"),
        queue("b", nominal=16, cohort="c"),
        queue("l1", nominal=10, cohort="c"),
        queue("l2", nominal=20, cohort="c", lending_limit_gpus=5),
        queue("solo", nominal=8),
    ]
    # a borrows 8, b 2: 10 in all, from l1 (lends 10) and l2 (lends 5): 2:1, exactly.
    lent = lent_out(qs, {"a": 16, "b": 18, "solo": 8})
    assert lent == {"a": 0, "b": 0, "l1": 7, "l2": 3}  # 6.67 + 3.33: the larger remainder gets the odd one
    assert sum(lent.values()) == 10
    assert lent_out(qs, {"l1": 4})["l1"] == 0  # nothing borrowed: nothing lent, whatever is lendable
