"""Gang placement: smallest domain first, fewest nodes, best fit, admission needs a placement."""

from __future__ import annotations

from collections import Counter

from gpuq.core import ScoringWeights, comm_cost, level_weights
from gpuq.core.decisions import PendingCode
from gpuq.core.model import Topology

from .helpers import admitted, cluster, codes, job, node, pending, queue, run, snap


def racks_of(placement: tuple[str, ...]) -> set[str]:
    # cluster() names nodes n<zone><block><rack><node>: the rack is the name without its last digit.
    return {n[:-1] for n in placement}


def test_gang_packs_onto_fewest_nodes() -> None:
    d = run(snap(cluster(racks=1, nodes_per_rack=4), [queue()], [job("ns/a", replicas=4, gpus=2)]))
    assert len(set(admitted(d)["ns/a"])) == 1


def test_preferred_gang_uses_smallest_domain_that_fits() -> None:
    d = run(snap(cluster(racks=3, nodes_per_rack=4), [queue()], [job("ns/a", replicas=3, gpus=8)]))
    placement = admitted(d)["ns/a"]
    assert len(placement) == 3 and len(racks_of(placement)) == 1


def test_required_rack_refuses_to_span_racks() -> None:
    nodes = cluster(racks=2, nodes_per_rack=2)
    d = run(snap(nodes, [queue()], [job("ns/a", replicas=3, gpus=8, level="rack")]))
    assert "ns/a" not in admitted(d)
    assert pending(d)["ns/a"] == "needs 3x8 GPUs in one rack; the largest eligible rack has 16 GPUs"
    assert codes(d)["ns/a"] == PendingCode.TOPOLOGY_UNSATISFIABLE


def test_required_rack_waits_for_free_capacity_with_reason() -> None:
    nodes = cluster(racks=2, nodes_per_rack=4)
    blockers = [
        job(f"ns/r{i}", gpus=8, on=[f"n00{i % 2}{i // 2}"]) for i in range(4)
    ]  # 2 nodes per rack used
    d = run(snap(nodes, [queue()], [*blockers, job("ns/a", replicas=3, gpus=8, level="rack")]))
    assert pending(d)["ns/a"] == "needs 3x8 GPUs in one rack; best rack has 16 free"
    assert codes(d)["ns/a"] == PendingCode.FRAGMENTED


def test_preferred_gang_widens_when_no_rack_fits() -> None:
    nodes = cluster(racks=2, nodes_per_rack=2)
    d = run(snap(nodes, [queue()], [job("ns/a", replicas=3, gpus=8, level="rack", required=False)]))
    assert len(racks_of(admitted(d)["ns/a"])) == 2


def test_best_fit_keeps_whole_nodes_free() -> None:
    nodes = cluster(racks=1, nodes_per_rack=3)
    running = job("ns/run", gpus=6, on=["n0001"])
    d = run(snap(nodes, [queue()], [running, job("ns/small", gpus=2)]))
    assert admitted(d)["ns/small"] == ("n0001",)


def test_fills_partly_used_rack_before_an_empty_one() -> None:
    nodes = cluster(racks=2, nodes_per_rack=2)
    running = job("ns/run", gpus=8, on=["n0011"])
    d = run(snap(nodes, [queue()], [running, job("ns/a", gpus=8)]))
    assert admitted(d)["ns/a"] == ("n0010",)


def test_admission_considers_placement_not_quota_alone() -> None:
    nodes = cluster(racks=1, nodes_per_rack=4)
    fragments = [job(f"ns/f{i}", gpus=5, on=[f"n000{i}"]) for i in range(4)]  # 3 free on each node
    d = run(snap(nodes, [queue(nominal=1000)], [*fragments, job("ns/a", replicas=2, gpus=4)]))
    assert "ns/a" not in admitted(d)
    assert (
        pending(d)["ns/a"]
        == "needs 2x4 GPUs; 12 GPUs free on eligible nodes but fragmented: room for 0 workers of 4 GPUs"
    )


def test_gang_is_all_or_nothing() -> None:
    nodes = cluster(racks=1, nodes_per_rack=2)
    d = run(snap(nodes, [queue()], [job("ns/a", replicas=3, gpus=8)]))
    assert d.admit == () and pending(d)["ns/a"] == (
        "needs 3x8 GPUs; more than the cluster holds even when empty: "
        "its 2 eligible nodes hold 2 such workers at most (short of GPU)"
    )


def test_ranks_are_ordered_by_topology() -> None:
    nodes = cluster(racks=2, nodes_per_rack=2)
    d = run(snap(nodes, [queue()], [job("ns/a", replicas=4, gpus=8)]))
    placement = admitted(d)["ns/a"]
    assert list(placement) == sorted(placement)


def test_required_node_level_puts_all_ranks_on_one_node() -> None:
    nodes = cluster(racks=1, nodes_per_rack=2)
    d = run(snap(nodes, [queue()], [job("ns/a", replicas=4, gpus=2, level="node")]))
    assert len(set(admitted(d)["ns/a"])) == 1


def test_comm_cost_counts_rank_pairs_by_level() -> None:
    weights = level_weights(Topology(), ScoringWeights())
    same_node = [("z", "b", "r", "n1")] * 2
    same_rack = [("z", "b", "r", "n1"), ("z", "b", "r", "n2")]
    cross_rack = [("z", "b", "r1", "n1"), ("z", "b", "r2", "n2")]
    cross_zone = [("z1", "b", "r", "n1"), ("z2", "b", "r", "n2")]
    assert [comm_cost(p, weights) for p in (same_node, same_rack, cross_rack, cross_zone)] == [0, 1, 4, 64]
    # 4 ranks, 2 per node in one rack: 2 pairs on a node (0) and 4 across nodes (1 each).
    assert comm_cost([("z", "b", "r", "n1")] * 2 + [("z", "b", "r", "n2")] * 2, weights) == 4


def test_admit_reports_comm_cost_of_its_placement() -> None:
    nodes = cluster(racks=2, nodes_per_rack=1)
    d = run(snap(nodes, [queue()], [job("ns/a", replicas=2, gpus=8)]))
    assert d.admit[0].comm_cost == 4.0  # one pair across racks in one block


def test_zero_gpu_workers_place_by_cpu_and_memory() -> None:
    small = node("cpu1", cpu=4_000, gpus=0)
    d = run(snap([small], [queue()], [job("ns/a", replicas=2, gpus=0)]))
    assert Counter(admitted(d)["ns/a"]) == Counter({"cpu1": 2})
