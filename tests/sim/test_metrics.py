"""Metrics on tiny hand-computable cases."""

from __future__ import annotations

import math

import pytest

from gpuq.core.config import ScoringWeights
from gpuq.sim.metrics import JobOutcome, Recorder, distribution, jain, percentile
from gpuq.sim.speed import SpeedModel, spread

PATHS = {
    "n0": ("z", "b", "r0", "n0"),
    "n1": ("z", "b", "r0", "n1"),
    "n2": ("z", "b", "r1", "n2"),
}


def test_percentile_interpolates_linearly() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4, 5], 99) == pytest.approx(4.96)
    assert math.isnan(percentile([], 50))
    assert distribution([1.0, 3.0]) == {"avg": 2.0, "p50": 2.0, "p99": pytest.approx(2.98)}


def test_jain_is_one_for_equal_shares_and_one_over_n_for_one_winner() -> None:
    assert jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([1.0, math.nan]) == pytest.approx(1.0)


def test_spread_counts_gpu_pairs_crossing_each_level() -> None:
    # 6 GPUs: 4 on n0, 2 on n2 (another rack). Pairs 15; 6 + 1 inside a node -> 8 cross node and rack.
    s = spread(("n0", "n0", "n2"), 2, PATHS)
    assert (s.gpus, s.pairs, s.crossing) == (6, 15, (0, 0, 8, 8))
    assert s.crossed == (False, False, True, True)
    assert s.cost_per_pair(ScoringWeights()) == pytest.approx(8 * 4.0 / 15)
    # Same rack: the 8 crossing pairs are split at node level only (weight 1).
    s = spread(("n0", "n0", "n1"), 2, PATHS)
    assert s.crossing == (0, 0, 0, 8) and s.cost_per_pair(ScoringWeights()) == pytest.approx(8 / 15)
    assert spread(("n1",), 8, PATHS).crossing == (0, 0, 0, 0)


def test_slowdown_multiplies_the_factors_of_every_level_crossed() -> None:
    model = SpeedModel(zone=2.0, block=1.5, rack=1.25, node=1.2)
    assert model.slowdown((False, False, False, False)) == 1.0
    assert model.slowdown((False, False, False, True)) == pytest.approx(1.2)
    assert model.slowdown((False, False, True, True)) == pytest.approx(1.5)
    assert SpeedModel(enabled=False).slowdown((True, True, True, True)) == 1.0


def test_recorder_integrates_levels_and_weights_comm_by_gpu_time() -> None:
    rec = Recorder(total_gpus=10, weights=ScoringWeights(), large_job_gpus=4)
    rec.set_levels(0, allocated=4, busy=4, fragmented=2, pending=1)
    rec.set_levels(10, allocated=10, busy=8, fragmented=0, pending=0)
    rec.advance(20)
    rec.segment(spread(("n0", "n2"), 2, PATHS), 0, 10)  # 4 GPUs, 4 of 6 pairs cross racks, 40 GPU-s
    rec.segment(spread(("n0", "n0"), 1, PATHS), 0, 30)  # 2 GPUs on one node, 60 GPU-s, not large
    rec.finished(JobOutcome("a", "q", 4, 10, 0, 0, 10))
    rec.finished(JobOutcome("b", "r", 2, 10, 0, 10, 30))
    s = rec.summary(jobs_total=3)
    assert s["gpu_allocation"] == pytest.approx((4 * 10 + 10 * 10) / 200)
    assert s["gpu_busy"] == pytest.approx((4 * 10 + 8 * 10) / 200)
    assert s["fragmentation"] == pytest.approx(2 * 10 / 200)
    assert s["comm_multi_gpu"]["cross_rack"] == pytest.approx((4 / 6) * 40 / 100)
    assert s["comm_large"]["cross_rack"] == pytest.approx(4 / 6)
    assert (s["finished"], s["unfinished"], s["makespan"]) == (2, 1, 30)
    assert s["queueing_delay"]["avg"] == 5.0 and s["jct"]["avg"] == 20.0
    assert s["per_queue"]["r"]["progress_rate"] == pytest.approx(10 / 30)
    assert s["jain_fairness"] == pytest.approx(jain([1.0, 1 / 3]))
    assert s["useful_ratio"] == pytest.approx((4 * 10 + 2 * 10) / 140)
