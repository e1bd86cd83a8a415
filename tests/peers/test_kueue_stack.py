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


def test_the_queue_objects_mirror_gpuqueues_with_a_topology_down_to_the_node() -> None:
    from gpuq.core.model import Queue
    from gpuq.devcluster.shape import HOSTNAME_LABEL
    from gpuq.peers.kueue_stack import kueue_objects, priority_class

    queues = [Queue(name="team_a", nominal_gpus=64, cohort="org"), Queue(name="b", nominal_gpus=64)]
    objs = kueue_objects(queues, {100, -5, 0}, "ns")
    kinds = [o["kind"] for o in objs]
    assert kinds.count("ClusterQueue") == kinds.count("LocalQueue") == 2
    topology = next(o for o in objs if o["kind"] == "Topology")
    # TAS replaces a failed node only when the lowest level is the node itself.
    assert topology["spec"]["levels"][-1] == {"nodeLabel": HOSTNAME_LABEL}
    classes = {o["metadata"]["name"]: o["value"] for o in objs if o["kind"] == "WorkloadPriorityClass"}
    assert classes == {priority_class(v): v for v in (100, -5, 0)}
    assert priority_class(-5) == "priority-minus-5"
    cq = next(o for o in objs if o["kind"] == "ClusterQueue" and o["spec"].get("cohortName") == "org")
    assert cq["metadata"]["name"] == "team-a"
    assert cq["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    assert all(o["metadata"]["namespace"] == "ns" for o in objs if o["kind"] == "LocalQueue")
    group = cq["spec"]["resourceGroups"][0]
    assert group["coveredResources"] == ["nvidia.com/gpu"]
    # Pods that also ask for cpu and memory need a ClusterQueue covering them; GPUs still bound.
    wide = kueue_objects(queues, {0}, "ns", {"cpu": "760", "memory": "8000Gi"})
    group = next(o for o in wide if o["kind"] == "ClusterQueue")["spec"]["resourceGroups"][0]
    assert group["coveredResources"] == ["nvidia.com/gpu", "cpu", "memory"]
    assert [r["nominalQuota"] for r in group["flavors"][0]["resources"]] == [64, "760", "8000Gi"]
