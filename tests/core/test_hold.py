"""A held queue (GPUQueue stopPolicy Hold/HoldAndDrain) admits nothing new; what runs keeps running
and a gang recovering from a node failure is still re-placed (it already holds its quota)."""

from __future__ import annotations

from gpuq.core.decisions import PendingCode
from gpuq.core.model import Health

from .helpers import admitted, cluster, codes, job, pending, queue, run, snap, with_node

NODES = cluster(racks=1, nodes_per_rack=4)


def test_a_held_queue_admits_nothing_and_says_why() -> None:
    jobs = [job("ns/a", queue="held", gpus=8), job("ns/b", queue="open", gpus=8, created=950)]
    d = run(snap(NODES, [queue("held", held=True), queue("open")], jobs))
    assert set(admitted(d)) == {"ns/b"}
    assert codes(d)["ns/a"] == PendingCode.HELD
    assert pending(d)["ns/a"] == "queue held is held: it admits no new jobs"


def test_releasing_the_queue_admits_its_jobs_in_order() -> None:
    jobs = [job(f"ns/a{i}", queue="held", gpus=8, created=900 + i) for i in range(2)]
    held = run(snap(NODES, [queue("held", held=True)], jobs))
    assert held.admit == () and [p.position for p in held.pending] == [1, 2]
    assert set(admitted(run(snap(NODES, [queue("held")], jobs)))) == {"ns/a0", "ns/a1"}


def test_a_held_queue_keeps_running_jobs_and_re_places_a_failed_gang() -> None:
    nodes = with_node(NODES, "n0000", health=Health.FAILED)
    running = job("ns/run", queue="held", gpus=8, on=["n0001"])
    failed = job("ns/fail", queue="held", gpus=8, on=["n0000"])
    d = run(snap(nodes, [queue("held", held=True)], [running, failed]))
    assert [r.job for r in d.restart] == ["ns/fail"]
    assert "ns/fail" in admitted(d) and "ns/run" not in {p.victim for p in d.preempt}
