"""IncrementalSchedule (the operator's kept index): the deltas it recovers from whole snapshots give
the same decisions as a fresh index, whatever changed between two cycles."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from gpuq.core import SchedulerConfig, schedule
from gpuq.core.incremental import IncrementalSchedule, SnapshotDelta, snapshot_delta
from gpuq.core.model import Resources, Running, Snapshot

from .helpers import NOW, cluster, job, node, queue, snap, with_node
from .strategies import scenarios


def test_the_delta_names_exactly_what_changed() -> None:
    nodes = cluster(racks=1, nodes_per_rack=3)
    a, b = job("ns/a", gpus=8, on=["n0000"]), job("ns/b")
    s1 = snap(nodes, [queue()], [a, b])
    moved = replace(nodes[1], used_by_others=Resources(gpus=1))
    s2 = snap([nodes[0], moved], [queue()], [replace(b, running=Running(("n0002",), NOW)), job("ns/c")])
    d = snapshot_delta(s1, s2)
    assert [n.name for n in d.nodes] == ["n0001"] and d.removed_nodes == ("n0002",)
    assert [j.key for j in d.jobs] == ["ns/b", "ns/c"] and d.removed_jobs == ("ns/a",)
    assert snapshot_delta(s2, s2).size == 0


@settings(max_examples=60, deadline=None)
@given(scenarios(), hs.data())
def test_a_kept_index_decides_like_a_fresh_one_cycle_after_cycle(scenario, data) -> None:  # type: ignore[no-untyped-def]
    s1, cfg = scenario
    inc = IncrementalSchedule()
    d1 = inc(s1, NOW, cfg)
    assert d1 == schedule(s1, NOW, cfg)
    # What a writer and the cluster do next: admissions start, one job goes, a node changes.
    started = {a.job: Running(a.placement, NOW) for a in d1.admit}
    jobs = [replace(j, running=started[j.key]) if j.key in started else j for j in s1.jobs]
    if jobs and data.draw(hs.booleans()):
        jobs.pop(data.draw(hs.integers(0, len(jobs) - 1)))
    nodes = list(s1.nodes)
    i = data.draw(hs.integers(0, len(nodes) - 1))
    nodes[i] = replace(nodes[i], used_by_others=Resources(gpus=data.draw(hs.integers(0, 2))))
    s2 = Snapshot(s1.topology, tuple(nodes), s1.queues, tuple(jobs))
    assert inc(s2, NOW + 1, cfg) == schedule(s2, NOW + 1, cfg)
    # Something else altogether (nodes come and go): the index rebuilds and still agrees.
    s3, _ = data.draw(scenarios())
    assert inc(s3, NOW + 2, cfg) == schedule(s3, NOW + 2, cfg)


def test_the_index_is_kept_when_only_jobs_change() -> None:
    nodes = cluster(racks=1, nodes_per_rack=2)
    s1 = snap(nodes, [queue()], [job("ns/a", gpus=8)])
    inc = IncrementalSchedule()
    d1 = inc(s1, NOW, SchedulerConfig())
    ix = inc.index
    assert ix is not None and [a.job for a in d1.admit] == ["ns/a"]
    a = replace(s1.jobs[0], running=Running(d1.admit[0].placement, NOW))
    s2 = snap(nodes, [queue()], [a, job("ns/b", gpus=8)])
    d2 = inc(s2, NOW + 1, SchedulerConfig())
    assert inc.index is ix and ix.rebuilds == 1 and inc.last_delta == 2
    assert [x.job for x in d2.admit] == ["ns/b"]


def test_a_requeued_job_that_starts_is_a_start_though_its_queued_since_is_gone() -> None:
    # The operator reports queued_since only while a job waits (its Admitted condition): a start
    # must still count as capacity taken, not as a change that throws the cycle memo away.
    nodes = cluster(racks=1, nodes_per_rack=2)
    waiting = replace(job("ns/a", gpus=8), queued_since=NOW - 30)
    s1 = snap(nodes, [queue()], [waiting])
    inc = IncrementalSchedule()
    d1 = inc(s1, NOW, SchedulerConfig())
    ix = inc.index
    assert ix is not None and [a.job for a in d1.admit] == ["ns/a"]
    started = replace(waiting, running=Running(d1.admit[0].placement, NOW), queued_since=0.0)
    inc(snap(nodes, [queue()], [started]), NOW + 1, SchedulerConfig())
    assert inc.index is ix and (ix.takes, ix.changes) == (1, 0)


def test_a_model_losing_its_last_schedulable_node_rebuilds_the_index() -> None:
    # Found by the property above: the kept index still listed H100 after its only node went
    # NotReady, so a model-quota reason was given where a fresh index says no node is schedulable.
    nodes = [node("h0", gpu_model="H100"), node("a0", gpu_model="A100")]
    q = queue(model_quotas={"H100": 8})
    s1 = snap(nodes, [q], [job("ns/a", replicas=2, gpus=8)])
    inc = IncrementalSchedule()
    assert inc(s1, NOW, SchedulerConfig()) == schedule(s1, NOW, SchedulerConfig())
    s2 = snap(with_node(nodes, "h0", not_ready_since=NOW - 60), [q], s1.jobs)
    d2 = inc(s2, NOW + 1, SchedulerConfig())
    assert inc.index is not None and inc.index.models == ["A100"]
    assert d2 == schedule(s2, NOW + 1, SchedulerConfig())


def test_a_handed_delta_is_applied_only_to_its_base_and_verified() -> None:
    """The caller's delta is taken as it is when the index holds its base (no comparison); any
    other snapshot is compared. In verify mode a delta that misses a change fails loudly."""
    nodes = cluster(racks=1, nodes_per_rack=2)
    s1 = snap(nodes, [queue()], [job("ns/a", gpus=8)])
    inc = IncrementalSchedule(verify=True)
    inc(s1, NOW, SchedulerConfig())
    b = job("ns/b", gpus=8)
    s2 = snap(nodes, [queue()], [*s1.jobs, b])
    inc(s2, NOW + 1, SchedulerConfig(), delta=SnapshotDelta((), (), (b,), (), base=s1))
    assert inc.handed == 1 and inc.last_delta == 1
    s3 = snap(nodes, [queue()], [*s2.jobs, job("ns/c", gpus=8)])
    inc(s3, NOW + 2, SchedulerConfig(), delta=SnapshotDelta((), (), (), (), base=s1))  # not its base
    assert inc.handed == 1 and inc.last_delta == 1
    s4 = snap(nodes, [queue()], [*s3.jobs, job("ns/d", gpus=8)])
    with pytest.raises(AssertionError, match="misses changes"):
        inc(s4, NOW + 3, SchedulerConfig(), delta=SnapshotDelta((), (), (), (), base=s3))
