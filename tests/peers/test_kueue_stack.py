"""Kueue's resource names as its API serves them (a wrong plural is a 404 on create)."""

from __future__ import annotations

from gpuq.peers.kueue_stack import plural


def test_the_plural_of_each_kind_a_kueue_user_creates() -> None:
    kinds = ("Topology", "ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass", "Cohort")
    assert [plural(k) for k in kinds] == [
        "topologies",
        "resourceflavors",
        "clusterqueues",
        "localqueues",
        "workloadpriorityclasses",
        "cohorts",
    ]
