"""A gang that its eligible nodes could not hold even empty: pending ExceedsCapacity with the arithmetic,
no placement or preemption search for it, and (BestEffortFIFO) it does not hold its queue's head."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.core import SchedulerConfig, schedule
from gpuq.core import preemption as core_preemption
from gpuq.core.decisions import PendingCode
from gpuq.core.index import ClusterIndex
from gpuq.core.model import QueueingStrategy, WorkerSpec

from .helpers import GI, admitted, cluster, codes, job, node, pending, queue, run, snap

NODES = cluster(racks=1, nodes_per_rack=2)  # 2 x (8 GPUs, 64 CPUs, 512Gi)


def too_much_cpu(key: str = "ns/big", **kw: object) -> object:
    return replace(job(key, **kw), workers=WorkerSpec(1, 8, cpu_millis=65_000))  # type: ignore[arg-type]


def test_a_gang_too_big_for_the_empty_cluster_says_so_and_what_is_short() -> None:
    d = run(snap(NODES, [queue()], [too_much_cpu(), job("ns/ok", replicas=2, gpus=8, created=901)]))
    assert codes(d)["ns/big"] == PendingCode.EXCEEDS_CAPACITY
    assert pending(d)["ns/big"] == (
        "needs 1x8 GPUs (8 GPU, 65000m CPU per worker); more than the cluster holds even when empty: "
        "its 2 eligible nodes hold 0 such workers at most (short of CPU)"
    )
    assert set(admitted(d)) == {"ns/ok"}


def test_only_the_combination_can_be_short() -> None:
    odd = [node("gpu", gpus=8, cpu=1_000), node("cpu", gpus=0, cpu=64_000)]
    j = replace(job("ns/j"), workers=WorkerSpec(1, 8, cpu_millis=8_000))
    assert pending(run(snap(odd, [queue()], [j])))["ns/j"].endswith("(no node has all of it at once)")


def test_it_does_not_hold_its_queue_head_so_the_next_job_may_preempt() -> None:
    running = job("ns/low", replicas=2, gpus=8, priority=0, on=["n0000", "n0001"])
    big = too_much_cpu(priority=9)  # first in queue order
    high = job("ns/high", gpus=8, priority=5)
    d = run(snap(NODES, [queue()], [running, big, high]))
    assert {p.victim for p in d.preempt} == {"ns/low"} and d.preempt[0].for_job == "ns/high"


def test_strict_fifo_keeps_it_at_the_head() -> None:
    q = queue(strategy=QueueingStrategy.STRICT_FIFO)
    d = run(snap(NODES, [q], [too_much_cpu(priority=9), job("ns/small", gpus=1)]))
    assert d.admit == () and codes(d)["ns/small"] == PendingCode.BEHIND_QUEUE_HEAD
    assert codes(d)["ns/big"] == PendingCode.EXCEEDS_CAPACITY


def test_no_preemption_search_runs_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    searched: list[str] = []
    real = core_preemption.search

    def spy(st, book, job, *a, **kw):  # type: ignore[no-untyped-def]
        searched.append(job.key)
        return real(st, book, job, *a, **kw)

    monkeypatch.setattr(core_preemption, "search", spy)
    running = job("ns/low", replicas=2, gpus=8, priority=0, on=["n0000", "n0001"])
    q = queue(strategy=QueueingStrategy.STRICT_FIFO)  # head even so
    d = run(snap(NODES, [q], [running, too_much_cpu(priority=9)]))
    assert d.preempt == () and searched == []


def test_a_bigger_node_makes_it_fit_again() -> None:
    """Kept across cycles, the verdict is re-read when nodes change."""
    cfg = SchedulerConfig()
    s1 = snap(NODES, [queue()], [too_much_cpu()])
    ix = ClusterIndex(s1, cfg)
    assert schedule(s1, 1000.0, cfg, ix).admit == ()
    bigger = replace(NODES[0], allocatable=replace(NODES[0].allocatable, cpu_millis=128_000))
    s2 = snap([bigger, NODES[1]], [queue()], [too_much_cpu()])
    ix.apply(s2, nodes=[bigger])
    assert [a.job for a in schedule(s2, 1001.0, cfg, ix).admit] == ["ns/big"]


def test_memory_and_extended_resources_count_too() -> None:
    j = replace(job("ns/j"), workers=WorkerSpec(3, 4, memory_bytes=400 * GI, extra={"rdma/hca": 1}))
    rdma = [replace(n, allocatable=replace(n.allocatable, extra={"rdma/hca": 1})) for n in NODES]
    reason = pending(run(snap(rdma, [queue()], [j])))["ns/j"]
    assert reason.endswith("its 2 eligible nodes hold 2 such workers at most (short of memory and rdma/hca)")
