"""A replay's figures from what the API server recorded, by the simulator's definitions: checked
against hand-computed values on small timelines."""

from __future__ import annotations

import pytest

from gpuq.core.config import ScoringWeights
from gpuq.peers.replay_figures import Cluster, Observed, Run, figures

# Two 8-GPU nodes in two racks of one block.
CLUSTER = Cluster(
    gpus={"n1": 8, "n2": 8},
    paths={"n1": ("z", "b", "r1", "n1"), "n2": ("z", "b", "r2", "n2")},
)


def test_jct_queueing_and_the_communication_cost_of_a_gang_across_racks() -> None:
    wide = Observed("a", "q", 2, 8, 10.0, created=0.0, runs=(Run(0.0, 10.0, ("n1", "n2")),), finished=10.0)
    late = Observed("b", "q", 1, 8, 5.0, created=1.0, runs=(Run(10.0, 15.0, ("n1",)),), finished=15.0)
    out = figures([wide, late], CLUSTER)
    assert out["finished"] == 2 and out["unfinished"] == 0
    assert out["jct"]["avg"] == pytest.approx((10 + 14) / 2)
    assert out["queueing_delay"]["avg"] == pytest.approx((0 + 9) / 2)
    assert out["makespan"] == pytest.approx(15.0)
    # a: 120 GPU pairs, 64 of them split between the racks (and so between nodes), none above.
    weights = ScoringWeights()
    a_cost = weights.rack * 64 / 120
    # Weighted by GPU-time: a 16 GPUs x 10 s, b (8 GPUs on one node, no pair split) 8 x 5 s.
    assert out["comm_multi_gpu"]["cost_per_pair"] == pytest.approx(a_cost * 160 / 200)
    assert out["comm_multi_gpu"]["cross_rack"] == pytest.approx((64 / 120) * 160 / 200)


def test_idle_gpus_no_waiting_gang_can_use_count_as_fragmentation() -> None:
    small = Observed("a", "q", 1, 4, 10.0, created=0.0, runs=(Run(0.0, 10.0, ("n1",)),), finished=10.0)
    # Needs two whole nodes: while a holds half of n1, the 12 idle GPUs are of no use to it.
    gang = Observed("c", "q", 2, 8, 10.0, created=0.0, runs=(Run(10.0, 20.0, ("n1", "n2")),), finished=20.0)
    out = figures([small, gang], CLUSTER)
    assert out["fragmentation"] == pytest.approx(12 * 10 / (16 * 20))
    assert out["gpu_allocation"] == pytest.approx((4 * 10 + 16 * 10) / (16 * 20))
    fits = Observed("d", "q", 1, 8, 10.0, created=0.0, runs=(Run(10.0, 20.0, ("n2",)),), finished=20.0)
    # A waiting 1x8 job could use n2's 8 idle GPUs, so only n1's 4 are fragmented (until it starts).
    out = figures([small, fits], Cluster({"n1": 8, "n2": 8}, CLUSTER.paths))
    assert out["fragmentation"] == pytest.approx(4 * 10 / (16 * 20))


def test_an_evicted_job_waits_again_and_one_never_finished_is_counted() -> None:
    runs = (Run(0.0, 4.0, ("n1",)), Run(6.0, 12.0, ("n2",)))
    preempted = Observed("a", "q", 1, 8, 10.0, created=0.0, runs=runs, finished=12.0)
    stuck = Observed("b", "q", 3, 8, 10.0, created=2.0)  # 24 GPUs: never fits two 8-GPU nodes
    out = figures([preempted, stuck], CLUSTER, until=30.0)
    assert out["finished"] == 1 and out["unfinished"] == 1
    assert out["jct"]["avg"] == pytest.approx(12.0) and out["queueing_delay"]["avg"] == 0.0
    # a held 8 GPUs for 4 + 6 s of the 30 s the replay ran.
    assert out["gpu_allocation"] == pytest.approx(8 * 10 / (16 * 30))
    assert out["preemptions"] == 1  # a's second run followed its eviction; b never ran
