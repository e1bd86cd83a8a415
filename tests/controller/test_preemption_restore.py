"""A preemption in progress survives a new leadership term: it is rebuilt from the victim's status
with the same deadline, and the status the tracker writes reads back the same."""

from __future__ import annotations

from builders import T0, iso, job, placed_status

from gpuq.api.trainingjob import CheckpointReport
from gpuq.controller.objects import parse_job
from gpuq.controller.preemption import PreemptionTracker
from gpuq.controller.status import patch


def test_restore_picks_up_the_deadline_written_in_status() -> None:
    preemption = {
        "preemptor": "team-a/big",
        "reason": "lower priority",
        "requestedAt": iso(T0 + 100),
        "deadline": iso(T0 + 160),
        "checkpointBefore": {"step": 5, "path": "/c/5", "time": iso(T0 + 50)},
    }
    victim = parse_job(job("small", status=placed_status(["n1"], preemption=preemption)))
    finished = parse_job(job("done", status=placed_status(["n2"], "Succeeded", preemption=preemption)))
    tracker = PreemptionTracker()
    tracker.restore([victim, finished])
    ev = tracker.get("team-a/small")
    assert ev is not None and "team-a/done" not in tracker
    assert (ev.for_job, ev.requested_at, ev.deadline) == ("team-a/big", T0 + 100, T0 + 160)
    assert ev.baseline is not None and ev.baseline.step == 5
    assert not tracker.due(ev, ev.baseline, T0 + 159)  # the same checkpoint does not end the wait
    newer = CheckpointReport.model_validate({"step": 6, "path": "/c/6", "time": iso(T0 + 120)})
    assert tracker.due(ev, newer, T0 + 130) and tracker.due(ev, None, T0 + 160)


def test_status_round_trip() -> None:
    tracker = PreemptionTracker()
    ev = tracker.start("team-a/small", "team-a/big", "reclaim", T0 + 100, 60.0, None)
    body = job("small", status=placed_status(["n1"]))
    body["status"].update(patch(parse_job(body).status, preemption=ev.to_status()))
    again = PreemptionTracker()
    again.restore([parse_job(body)])
    back = again.get("team-a/small")
    assert back is not None and (back.requested_at, back.deadline, back.reason) == (
        T0 + 100,
        T0 + 160,
        "reclaim",
    )
