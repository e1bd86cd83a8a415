"""Protecting interactive work: a non-preemptible queue loses no job, and a queue's
maxPreemptionsPerHour caps its victims (a plan that would exceed it is not made)."""

from __future__ import annotations

from gpuq.core.model import PreemptionPolicy

from .helpers import cluster, job, queue, run, snap

TWO_NODES = cluster(racks=1, nodes_per_rack=2)


def victims(d: object) -> set[str]:
    return {p.victim for p in d.preempt}  # type: ignore[attr-defined]


def lows() -> list:  # type: ignore[type-arg]
    return [
        job("ns/low-a", gpus=8, priority=0, on=["n0000"]),
        job("ns/low-b", gpus=8, priority=0, on=["n0001"]),
    ]


def test_a_non_preemptible_queue_loses_no_job() -> None:
    q = queue(preemption=PreemptionPolicy(preemptible=False))
    d = run(snap(TWO_NODES, [q], [*lows(), job("ns/high", gpus=8, priority=5)]))
    assert victims(d) == set()
    assert run(snap(TWO_NODES, [queue()], [*lows(), job("ns/high", gpus=8, priority=5)])).preempt


def test_the_hourly_cap_counts_recent_victims_and_this_cycles() -> None:
    one_left = queue(preemption=PreemptionPolicy(max_per_hour=3, recent=2))
    highs = [job("ns/high-1", gpus=8, priority=5), job("ns/high-2", gpus=8, priority=5)]
    d = run(snap(TWO_NODES, [one_left], [*lows(), *highs]))
    assert len(victims(d)) == 1  # the second preemptor waits
    spent = queue(preemption=PreemptionPolicy(max_per_hour=3, recent=3))
    assert run(snap(TWO_NODES, [spent], [*lows(), *highs])).preempt == ()


def test_a_plan_needing_more_victims_than_the_cap_allows_is_not_made() -> None:
    one_left = queue(preemption=PreemptionPolicy(max_per_hour=1))
    big = job("ns/big", replicas=2, gpus=8, priority=5)  # needs both low gangs gone
    assert run(snap(TWO_NODES, [one_left], [*lows(), big])).preempt == ()
    assert victims(run(snap(TWO_NODES, [queue()], [*lows(), big]))) == {"ns/low-a", "ns/low-b"}
