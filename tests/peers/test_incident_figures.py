"""The lost-progress model of bench/incidents.py: one formula for gpuq and for Kueue."""

from __future__ import annotations

import pytest

from gpuq.peers.incident_figures import (
    CHECKPOINT_INTERVAL_S,
    NONE,
    Loss,
    failure_loss,
    killed_loss,
    saved_loss,
    since_checkpoint,
    victim_loss,
)


def test_work_since_the_last_checkpoint_is_half_the_interval_on_average_and_the_interval_at_worst() -> None:
    assert since_checkpoint() == Loss(300.0, 600.0)
    assert CHECKPOINT_INTERVAL_S == 600.0
    assert since_checkpoint(0.0) == NONE


def test_a_node_failure_costs_every_gpu_of_the_gang_the_work_since_the_checkpoint_and_the_recovery() -> None:
    # 4 x 8 GPUs back 14.4 s after the fault: 32 x (300 + 14.4) on average, 32 x (600 + 14.4) at worst.
    loss = failure_loss(32, 14.4)
    assert loss.expected == pytest.approx(32 * 314.4)
    assert loss.worst == pytest.approx(32 * 614.4)
    assert loss.expected_gpu_hours == pytest.approx(32 * 314.4 / 3600)


def test_a_slower_recovery_costs_its_extra_seconds_on_every_gpu() -> None:
    fast, slow = failure_loss(32, 10.0), failure_loss(32, 40.0)
    assert slow.expected - fast.expected == pytest.approx(32 * 30.0)
    assert slow.worst - fast.worst == pytest.approx(32 * 30.0)


def test_a_victim_killed_without_a_checkpoint_loses_the_work_since_its_last_one() -> None:
    assert killed_loss(16) == Loss(16 * 300.0, 16 * 600.0)
    assert victim_loss(16, None) == killed_loss(16)


def test_a_victim_that_saved_first_loses_the_save_and_what_ran_after_it_whatever_the_interval() -> None:
    assert saved_loss(16, 100.0, 131.5) == Loss(16 * 31.5, 16 * 31.5)
    assert victim_loss(16, (100.0, 131.5), interval=3600.0) == saved_loss(16, 100.0, 131.5)


def test_losses_add_up_over_victims() -> None:
    total = killed_loss(16) + saved_loss(8, 0.0, 10.0) + NONE
    assert total == Loss(16 * 300.0 + 80.0, 16 * 600.0 + 80.0)


def test_impossible_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        saved_loss(8, 10.0, 5.0)
    with pytest.raises(ValueError):
        failure_loss(8, -1.0)
    with pytest.raises(ValueError):
        since_checkpoint(-1.0)
    with pytest.raises(ValueError):
        killed_loss(-1)
