"""The demo's stand-in training code: which step a job has reached and when it was asked to checkpoint."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuq.demo.trainer import STEPS_PER_SECOND, checkpoint_requested_at, current_step

NOW = 1_800_000_000.0


def stamp(seconds_ago: float) -> str:
    return dt.datetime.fromtimestamp(NOW - seconds_ago, dt.UTC).isoformat().replace("+00:00", "Z")


def job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j"}, "status": status}


def test_steps_count_from_the_start_of_the_attempt() -> None:
    assert current_step(job(startedAt=stamp(10)), NOW) == 10 * STEPS_PER_SECOND


def test_steps_continue_from_the_last_checkpoint() -> None:
    resumed = job(startedAt=stamp(10), lastCheckpoint={"step": 500, "path": "p", "time": stamp(3)})
    assert current_step(resumed, NOW) == 500 + 3 * STEPS_PER_SECOND
    # restarted after the checkpoint: the steps since the new start count, not those since the report
    restarted = job(startedAt=stamp(2), lastCheckpoint={"step": 500, "path": "p", "time": stamp(30)})
    assert current_step(restarted, NOW) == 500 + 2 * STEPS_PER_SECOND


def test_a_job_that_is_not_running_stays_at_its_checkpoint() -> None:
    assert current_step(job(lastCheckpoint={"step": 7, "path": "p", "time": stamp(1)}), NOW) == 7
    assert current_step(job(), NOW) == 0


def test_checkpoint_request_is_the_true_preemption_requested_condition() -> None:
    when = stamp(1)
    asked = job(conditions=[{"type": "PreemptionRequested", "status": "True", "lastTransitionTime": when}])
    assert checkpoint_requested_at(asked) == when
    withdrawn = job(
        conditions=[{"type": "PreemptionRequested", "status": "False", "lastTransitionTime": when}]
    )
    assert checkpoint_requested_at(withdrawn) is None
    assert checkpoint_requested_at(job(conditions=[{"type": "Admitted", "status": "True"}])) is None
