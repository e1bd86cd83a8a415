"""Queue order: priority then creation time; StrictFIFO; BestEffortFIFO with the starvation rule."""

from __future__ import annotations

from dataclasses import replace

from gpuq.core import SchedulerConfig
from gpuq.core.decisions import PendingCode
from gpuq.core.model import QueueingStrategy

from .helpers import NOW, admitted, cluster, codes, job, pending, queue, run, snap

ONE_NODE = cluster(racks=1, nodes_per_rack=1)  # 8 GPUs


def test_priority_then_creation_time() -> None:
    jobs = [
        job("ns/old-low", gpus=8, priority=0, created=1),
        job("ns/new-high", gpus=8, priority=5, created=950),
        job("ns/old-high", gpus=8, priority=5, created=940),
    ]
    d = run(snap(ONE_NODE, [queue()], jobs))
    assert set(admitted(d)) == {"ns/old-high"}
    assert [p.job for p in sorted(d.pending, key=lambda p: p.position)] == ["ns/new-high", "ns/old-low"]


def test_strict_fifo_blocks_behind_head() -> None:
    q = queue(strategy=QueueingStrategy.STRICT_FIFO)
    jobs = [job("ns/head", replicas=2, gpus=8, priority=1), job("ns/small", gpus=1)]
    d = run(snap(ONE_NODE, [q], jobs))
    assert d.admit == ()
    assert pending(d)["ns/small"] == "StrictFIFO: waiting behind ns/head"
    assert codes(d)["ns/small"] == PendingCode.BEHIND_QUEUE_HEAD


def test_best_effort_fifo_lets_smaller_jobs_pass_a_head_that_cannot_fit() -> None:
    jobs = [job("ns/head", replicas=2, gpus=8, priority=1), job("ns/small", gpus=1)]
    d = run(snap(ONE_NODE, [queue()], jobs))
    assert set(admitted(d)) == {"ns/small"}


def test_starving_head_gets_a_reservation_and_others_backfill_only_around_it() -> None:
    nodes = cluster(racks=2, nodes_per_rack=2)  # 32 GPUs in two racks
    running = [job("ns/r1", gpus=8, on=["n0000"]), job("ns/r2", gpus=4, on=["n0010"])]
    head = job("ns/head", replicas=2, gpus=8, level="rack", created=NOW - 400)
    small = [job(f"ns/s{i}", gpus=4, created=900 + i) for i in range(4)]
    d = run(snap(nodes, [queue()], [*running, head, *small]))
    # Rack r001 (n0010: 4 free, n0011: 8 free) is the head's best rack: its 12 free GPUs are held.
    assert "12 GPUs reserved for it" in pending(d)["ns/head"]
    placed = {n for p in admitted(d).values() for n in p}
    assert placed == {"n0001"}  # only the other rack's free node is used for backfill
    assert len(admitted(d)) == 2


def test_head_not_yet_starving_reserves_nothing() -> None:
    nodes = cluster(racks=2, nodes_per_rack=2)
    running = [job("ns/r1", gpus=8, on=["n0000"]), job("ns/r2", gpus=4, on=["n0010"])]
    head = job("ns/head", replicas=2, gpus=8, level="rack", created=NOW - 100)
    small = [job(f"ns/s{i}", gpus=4, created=900 + i) for i in range(4)]
    d = run(snap(nodes, [queue()], [*running, head, *small]))
    assert len(admitted(d)) == 4


def test_starving_head_blocked_by_quota_keeps_the_queue_quota() -> None:
    q = queue(nominal=12)
    running = job("ns/r", gpus=8, on=["n0000"])
    head = job("ns/head", gpus=8, created=NOW - 400)
    nodes = cluster(racks=1, nodes_per_rack=2)
    d = run(snap(nodes, [q], [running, head, job("ns/small", gpus=4)]))
    assert d.admit == ()
    assert pending(d)["ns/small"].startswith("queue q keeps its quota for ns/head")
    # Without starvation the small job passes.
    d = run(snap(nodes, [q], [running, replace(head, created_at=NOW - 10), job("ns/small", gpus=4)]))
    assert set(admitted(d)) == {"ns/small"}


def test_pending_positions_follow_queue_order() -> None:
    jobs = [job(f"ns/j{i}", gpus=8, priority=i % 2, created=900 + i) for i in range(5)]
    d = run(snap(ONE_NODE, [queue()], jobs))
    order = [p.job for p in sorted(d.pending, key=lambda p: p.position)]
    assert order == ["ns/j3", "ns/j0", "ns/j2", "ns/j4"]  # j1 (priority 1, oldest) was admitted


def test_cycle_admission_limit_defers_the_rest() -> None:
    jobs = [job(f"ns/j{i}", gpus=1, created=900 + i) for i in range(5)]
    d = run(snap(ONE_NODE, [queue()], jobs), config=SchedulerConfig(max_admissions_per_cycle=2))
    assert set(admitted(d)) == {"ns/j0", "ns/j1"}
    assert {p.code for p in d.pending} == {PendingCode.CYCLE_LIMIT}


def test_backoff_job_waits_until_not_before() -> None:
    d = run(snap(ONE_NODE, [queue()], [job("ns/j", not_before=NOW + 20)]))
    assert codes(d)["ns/j"] == PendingCode.BACKING_OFF and "20s" in pending(d)["ns/j"]


def test_jobs_like_a_failed_one_wait_with_its_reason_in_queue_order() -> None:
    """Once a job fails, the interchangeable jobs behind it in its queue are not tried again in the
    cycle: they share its reason, keep their positions, and a smaller job behind them still runs."""
    nodes = cluster(racks=1, nodes_per_rack=2)  # 16 GPUs, 4 of them in use
    running = job("ns/running", gpus=4, on=["n0000"])
    big = [job(f"ns/big{i}", gpus=8, replicas=2, created=900.0 + i) for i in range(3)]
    small = job("ns/small", gpus=8, created=910.0)
    d = run(snap(nodes, [queue()], [running, *big, small]))
    assert set(admitted(d)) == {"ns/small"}
    waiting = {p.job: (p.position, p.code, p.reason) for p in d.pending}
    assert [waiting[f"ns/big{i}"][0] for i in range(3)] == [1, 2, 3]
    assert {waiting[f"ns/big{i}"][1] for i in range(3)} == {PendingCode.INSUFFICIENT_CAPACITY}
    assert waiting["ns/big1"][2] == waiting["ns/big2"][2]
