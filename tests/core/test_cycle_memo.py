"""The quiet-cycle memo (explain=False): a cycle after one that decided nothing recalls failed classes
instead of trying them, and must still decide exactly like a cycle that tries everything."""

from __future__ import annotations

from dataclasses import replace

from gpuq.core import ClusterIndex, SchedulerConfig, schedule

from .helpers import NOW, cluster, job, queue, snap

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
