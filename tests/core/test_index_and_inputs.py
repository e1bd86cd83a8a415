"""The reusable ClusterIndex, and what bad input does: a clear error or a pending reason, never a crash."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.core import ClusterIndex, SchedulerConfig, SnapshotError, schedule
from gpuq.core.decisions import PendingCode
from gpuq.core.model import (
    Constraints,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Resources,
    Running,
    TopologyRequest,
    WorkerSpec,
)

from .helpers import NOW, admitted, cluster, codes, job, node, pending, queue, snap


def test_index_follows_deltas_and_decides_like_a_fresh_build() -> None:
    cfg = SchedulerConfig()
    nodes = cluster(racks=2, nodes_per_rack=2)
    jobs = [job("ns/a", gpus=8, on=["n0000"]), job("ns/b", replicas=2, gpus=8)]
    s1 = snap(nodes, [queue()], jobs)
    ix = ClusterIndex(s1, cfg)
    d1 = schedule(s1, NOW, cfg, index=ix)
    # The writer binds ns/b; ns/a finishes; another team's pod lands on n0011.
    b = replace(jobs[1], running=Running(d1.admit[0].placement, NOW))
    n11 = replace(nodes[3], used_by_others=Resources(gpus=2))
    s2 = snap([*nodes[:3], n11], [queue()], [b, job("ns/c", gpus=8)])
    ix.apply(s2, nodes=[n11], jobs=[b, s2.jobs[1]], removed_jobs=["ns/a"])
    assert ix.rebuilds == 1
    assert schedule(s2, NOW, cfg, index=ix) == schedule(s2, NOW, cfg)


def test_index_rebuilds_when_nodes_come_or_go() -> None:
    cfg = SchedulerConfig()
    nodes = cluster(racks=1, nodes_per_rack=2)
    s1 = snap(nodes, [queue()], [])
    ix = ClusterIndex(s1, cfg)
    extra = node("new", rack="r9")
    s2 = snap([*nodes, extra], [queue()], [job("ns/a", gpus=8)])
    ix.apply(s2, nodes=[extra], jobs=s2.jobs)
    assert ix.rebuilds == 2
    assert schedule(s2, NOW, cfg, index=ix) == schedule(s2, NOW, cfg)


def test_index_rebuilds_when_deltas_are_incomplete() -> None:
    cfg = SchedulerConfig()
    nodes = cluster(racks=1, nodes_per_rack=2)
    ix = ClusterIndex(snap(nodes, [queue()], []), cfg)
    s2 = snap(nodes, [queue()], [job("ns/a", gpus=8), job("ns/b", gpus=8)])
    ix.apply(s2, jobs=[s2.jobs[0]])  # forgot ns/b
    assert ix.rebuilds == 2 and set(ix.jobs) == {"ns/a", "ns/b"}


def test_schedule_refuses_an_index_of_another_snapshot() -> None:
    cfg = SchedulerConfig()
    s1 = snap(cluster(), [queue()], [])
    ix = ClusterIndex(s1, cfg)
    with pytest.raises(ValueError, match="index reflects another snapshot"):
        schedule(snap(cluster(), [queue()], []), NOW, cfg, index=ix)


def test_duplicate_node_names_are_a_clear_error() -> None:
    with pytest.raises(SnapshotError, match="node 'a' appears twice"):
        schedule(snap([node("a"), node("a")], [queue()], []), NOW, SchedulerConfig())


def test_wrong_topology_path_length_is_a_clear_error() -> None:
    bad = replace(node("a"), path=("z0", "a"))
    with pytest.raises(SnapshotError, match="topology path"):
        schedule(snap([bad], [queue()], []), NOW, SchedulerConfig())


def test_duplicate_queue_is_a_clear_error() -> None:
    with pytest.raises(SnapshotError, match="queue 'q' appears twice"):
        schedule(snap([node("a")], [queue(), queue()], []), NOW, SchedulerConfig())


def test_a_kept_index_reads_queues_again_when_the_snapshot_brings_other_ones() -> None:
    """The index keeps the last cycle's queues by name and cohort while it is handed the very same
    tuple; equal-looking queues in a new tuple (a changed quota, a duplicate) are read again."""
    cfg = SchedulerConfig()
    waiting = job("ns/w", gpus=8, queue="a")
    s1 = snap(cluster(), [queue("a", nominal=0, cohort="c"), queue("b", nominal=16, cohort="c")], [waiting])
    ix = ClusterIndex(s1, cfg)
    assert list(admitted(schedule(s1, NOW, cfg, index=ix))) == ["ns/w"]
    s2 = replace(s1, queues=(queue("a", nominal=0, cohort="c"), queue("b", nominal=0, cohort="c")))
    ix.apply(s2)
    assert admitted(schedule(s2, NOW, cfg, index=ix)) == {} == admitted(schedule(s2, NOW, cfg))
    s3 = replace(s2, queues=(*s2.queues, queue("b")))
    ix.apply(s3)
    with pytest.raises(SnapshotError, match="queue 'b' appears twice"):
        schedule(s3, NOW, cfg, index=ix)


def test_invalid_jobs_pend_with_reason_and_do_not_stop_others() -> None:
    bad_term = NodeSelectorTerm((NodeSelectorRequirement("k", "Gt", ("x",)),))
    jobs = [
        replace(job("ns/zero"), workers=WorkerSpec(0, 1)),
        job("ns/level", level="galaxy"),
        job("ns/affinity", constraints=Constraints(required_terms=(bad_term,))),
        job("ns/ok"),
    ]
    d = schedule(snap([node("a")], [queue()], jobs), NOW, SchedulerConfig())
    assert set(admitted(d)) == {"ns/ok"}
    assert codes(d) == {
        "ns/zero": PendingCode.INVALID,
        "ns/level": PendingCode.INVALID,
        "ns/affinity": PendingCode.INVALID,
    }
    assert pending(d)["ns/zero"] == "invalid spec: workers.replicas must be >= 1 (got 0)"
    assert "topology level 'galaxy'" in pending(d)["ns/level"]


def test_job_of_a_missing_queue_pends_with_reason() -> None:
    d = schedule(snap([node("a")], [queue()], [job("ns/x", queue="nope")]), NOW, SchedulerConfig())
    assert pending(d)["ns/x"] == "queue nope does not exist"
    assert codes(d)["ns/x"] == PendingCode.QUEUE_NOT_FOUND


def test_preferred_topology_level_is_advisory() -> None:
    d = schedule(
        snap(
            cluster(racks=2, nodes_per_rack=1),
            [queue()],
            [replace(job("ns/a", replicas=2, gpus=8), topology=TopologyRequest("rack"))],
        ),
        NOW,
        SchedulerConfig(),
    )
    assert len(d.admit) == 1
