"""The scheduler extender's rules: GPUs gpuq promised are off limits to other schedulers, preemption
victims' nodes are off limits, and a small pod goes where it fragments gangs' capacity least."""

from __future__ import annotations

from dataclasses import replace

from gpuq.core.decisions import Admit
from gpuq.core.extender import MAX_SCORE, extender_view, filter_nodes, fragmentation, prioritize
from gpuq.core.model import Health, Resources

from .helpers import cluster, job, queue, snap

NODES = cluster(racks=2, nodes_per_rack=2)  # n0000 n0001 (r000), n0010 n0011 (r001), 8 GPUs each


def test_an_admission_in_flight_reserves_its_gpus() -> None:
    gang = job("ns/gang", replicas=2, gpus=8, on=["n0000", "n0001"])
    view = extender_view(snap(NODES, [queue()], [gang]), bound=[("ns/gang", "n0000")])
    passed, failed = filter_nodes(view, 1, ["n0000", "n0001", "n0010"])
    assert passed == ["n0010"]
    assert "reserved for gang ns/gang" in failed["n0001"] and "n0000" in failed  # n0000: bound, full


def test_this_cycles_admissions_are_reserved_before_any_status_shows_them() -> None:
    new = job("ns/new", replicas=1, gpus=8)
    view = extender_view(snap(NODES, [queue()], [new]), admitting=[Admit("ns/new", ("n0010",), 0.0)])
    assert filter_nodes(view, 1, ["n0010", "n0011"])[0] == ["n0011"]


def test_a_preemption_victims_nodes_are_drained() -> None:
    victim = replace(job("ns/victim", gpus=4, on=["n0000"]), evicting=True)
    view = extender_view(snap(NODES, [queue()], [victim]))
    passed, failed = filter_nodes(view, 1, ["n0000", "n0001"])
    assert passed == ["n0001"] and "being preempted" in failed["n0000"]


def test_other_schedulers_usage_counts_and_unknown_nodes_pass() -> None:
    nodes = [replace(NODES[0], used_by_others=Resources(gpus=7)), *NODES[1:]]
    view = extender_view(snap(nodes, [queue()], []))
    assert filter_nodes(view, 2, ["n0000", "cpu-node"]) == (
        ["cpu-node"],
        {"n0000": filter_nodes(view, 2, ["n0000"])[1]["n0000"]},
    )


def test_a_small_pod_goes_where_it_fragments_least_and_keeps_whole_nodes_free() -> None:
    # n0000 has 3 GPUs left (5 used), n0010 has 6 left, the others are empty.
    nodes = [
        replace(NODES[0], used_by_others=Resources(gpus=5)),
        NODES[1],
        replace(NODES[2], used_by_others=Resources(gpus=2)),
        NODES[3],
    ]
    view = extender_view(snap(nodes, [queue()], [job("ns/wants-8", gpus=8)]))
    scores = dict(prioritize(view, 1, [n.name for n in nodes]))
    assert scores["n0000"] == MAX_SCORE  # the most fragmented node takes it
    assert scores["n0000"] > scores["n0010"] > scores["n0001"]
    # Whole free nodes are the last choice, the one in the emptier rack last of all.
    assert scores["n0010"] > scores["n0001"] > scores["n0011"] == 0


def test_pending_gang_shapes_steer_the_choice() -> None:
    """With 4-GPU gangs waiting, a node with 5 free is better cut to 4 than a node with 4 free to 3."""
    nodes = [
        replace(NODES[0], used_by_others=Resources(gpus=3)),
        replace(NODES[1], used_by_others=Resources(gpus=4)),
    ]
    fours = [job(f"ns/four-{i}", gpus=4) for i in range(8)]
    view = extender_view(snap(nodes, [queue()], fours))
    scores = dict(prioritize(view, 1, ["n0000", "n0001"]))
    assert scores["n0000"] > scores["n0001"]


def test_fragmentation_counts_gpus_no_worker_of_a_shape_can_use() -> None:
    assert fragmentation(8, ((8, 1.0),)) == 0 and fragmentation(7, ((8, 1.0),)) == 7
    assert fragmentation(6, ((4, 0.5), (8, 0.5))) == 0.5 * 2 + 0.5 * 6


def test_other_schedulers_pods_bound_between_cycles_count_at_once() -> None:
    gang = job("ns/gang", replicas=1, gpus=4, on=["n0001"])
    view = extender_view(snap(NODES, [queue()], [gang]))
    rack = view.rack["n0000"]
    assert view.free["n0000"] == 8 and view.rack_free[rack] == 12
    view.set_others("n0000", 7)  # kube-scheduler bound a 7-GPU pod after the cycle
    assert view.free["n0000"] == 1 and view.rack_free[rack] == 5
    assert filter_nodes(view, 2, ["n0000", "n0010"])[0] == ["n0010"]
    assert dict(prioritize(view, 1, ["n0000", "n0010"]))["n0000"] == MAX_SCORE
    view.set_others("n0001", 6)  # gpuq's 4 GPUs there still count: nothing left
    assert view.free["n0001"] == 0 and view.rack_free[rack] == 1
    view.set_others("n0000", 0)
    view.set_others("n0001", 0)
    assert view.free["n0000"] == 8 and view.free["n0001"] == 4 and view.rack_free[rack] == 12


def test_an_unschedulable_node_stays_closed_whatever_other_pods_do() -> None:
    nodes = [replace(NODES[0], health=Health.CORDONED), *NODES[1:]]
    view = extender_view(snap(nodes, [queue()], []))
    view.set_others("n0000", 2)
    assert view.free["n0000"] == 0 and filter_nodes(view, 1, ["n0000"])[0] == []
