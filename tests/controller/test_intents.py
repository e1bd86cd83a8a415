"""Status patches for admissions, pending jobs and blocked jobs; minimal, and empty when nothing changes."""

from __future__ import annotations

import pytest
from builders import T0, job

from gpuq.controller.intents import (
    Change,
    admission_note,
    admit_status,
    blocked_status,
    cosmetic,
    pending_change,
    pending_status,
    rollback_status,
)
from gpuq.controller.objects import format_time, parse_job
from gpuq.controller.snapshot import Exclusion
from gpuq.core.decisions import Admit, Pending


def test_admission_persists_attempt_and_placement() -> None:
    entry = parse_job(job("a", status={"phase": "Queued", "attempt": 2, "queuePosition": 3}))
    note = admission_note(Admit("team-a/a", ("n2", "n1"), 1.0, borrowed_gpus=8))
    patch = admit_status(entry, ("n2", "n1"), T0 - 1, T0, note=note)
    assert patch["phase"] == "Admitted" and patch["attempt"] == 3
    assert patch["placement"] == [{"rank": 0, "node": "n2"}, {"rank": 1, "node": "n1"}]
    assert patch["queuePosition"] is None  # merge patch: cleared
    assert patch.get("startedAt") is None and patch["admittedAt"] < format_time(T0)
    assert "borrowing 8 GPUs" in patch["message"]
    assert patch["conditions"][0]["type"] == "Admitted" and patch["conditions"][0]["status"] == "True"


def test_admission_of_a_gang_already_running_is_one_write() -> None:
    entry = parse_job(job("a", status={"phase": "Queued", "attempt": 0}))
    patch = admit_status(entry, ("n1",), T0 - 1, T0, running=True)
    assert patch["phase"] == "Running" and patch["attempt"] == 1
    assert patch["startedAt"] == format_time(T0) and patch["admittedAt"] == format_time(T0 - 1)
    assert patch["conditions"][0]["type"] == "Admitted" and patch["conditions"][0]["status"] == "True"


def test_first_status_of_a_new_job() -> None:
    entry = parse_job(job("a", replicas=4, gpus=8))
    patch = pending_status(entry, Pending("team-a/a", "waiting", 1, code="QuotaExceeded"), T0)
    assert patch["phase"] == "Queued" and patch["gpus"] == 32 and patch["observedGeneration"] == 1
    assert patch["conditions"][0]["reason"] == "QuotaExceeded"


def test_pending_update_is_empty_when_nothing_changed() -> None:
    entry = parse_job(job("a", status={"phase": "Queued"}))
    first = pending_status(entry, Pending("team-a/a", "needs 16 GPUs; queue has 8 free", 2), T0)
    assert first["queuePosition"] == 2 and first["message"] == "needs 16 GPUs; queue has 8 free"
    body = job("a", status={"phase": "Queued", **first})
    assert (
        pending_status(parse_job(body), Pending("team-a/a", "needs 16 GPUs; queue has 8 free", 2), T0 + 5)
        == {}
    )
    assert pending_status(
        parse_job(body), Pending("team-a/a", "needs 16 GPUs; queue has 8 free", 1), T0 + 5
    ) == {"queuePosition": 1}


def test_recovering_job_keeps_its_phase_while_waiting() -> None:
    entry = parse_job(job("a", status={"phase": "Recovering"}))
    assert "phase" not in pending_status(entry, Pending("team-a/a", "no capacity", 1), T0)


def test_blocked_job_gets_a_condition_and_one_event() -> None:
    entry = parse_job(job("a", status={"phase": "Queued", "queuePosition": 4}))
    why = Exclusion("QueueNotFound", "GPUQueue 'q' does not exist")
    patch, events = blocked_status(entry, why, T0)
    assert patch["queuePosition"] is None and patch["message"] == why.message
    blocked = next(c for c in patch["conditions"] if c["type"] == "Blocked")
    assert blocked["reason"] == "QueueNotFound" and blocked["status"] == "True"
    assert [e.reason for e in events] == ["QueueNotFound"]
    again, events = blocked_status(parse_job(job("a", status={"phase": "Queued", **patch})), why, T0 + 9)
    assert again == {} and events == ()


def test_rollback_returns_the_job_to_the_queue() -> None:
    entry = parse_job(
        job("a", status={"phase": "Admitted", "attempt": 1, "placement": [{"rank": 0, "node": "n"}]})
    )
    patch = rollback_status(entry, "binding refused", T0)
    assert patch["phase"] == "Queued" and patch["placement"] == [] and "binding refused" in patch["message"]


def test_a_refresh_of_numbers_is_cosmetic_a_new_reason_code_is_not() -> None:
    from gpuq.controller.intents import cosmetic

    fresh = Pending("team-a/a", "best rack has 8 free", 3, code="InsufficientCapacity")
    first = pending_status(parse_job(job("a")), fresh, T0)
    assert not cosmetic(parse_job(job("a")), first)  # the first status: phase, conditions, position
    queued = parse_job(job("a", status={"phase": "Queued", **first}))
    numbers = pending_status(
        queued, Pending("team-a/a", "best rack has 4 free", 2, code="InsufficientCapacity"), T0 + 5
    )
    assert set(numbers) == {"queuePosition", "message", "conditions"} and cosmetic(queued, numbers)
    code = pending_status(queued, Pending("team-a/a", "queue at quota 8/8", 2, code="QuotaExceeded"), T0 + 5)
    assert not cosmetic(queued, code)
    admitted = admit_status(queued, ("n1",), T0 + 4, T0 + 5)
    assert not cosmetic(queued, admitted)
    assert not cosmetic(queued, {})


def _conditions(variant: str) -> list[dict]:
    t = format_time(T0 - 50)
    admitted = {
        "type": "Admitted",
        "status": "False",
        "reason": "QuotaExceeded",
        "message": "m",
        "lastTransitionTime": t,
    }
    return {
        "none": [],
        "same": [admitted],
        "other message": [{**admitted, "message": "m2"}],
        "other reason": [{**admitted, "reason": "InsufficientCapacity"}],
        "true": [{**admitted, "status": "True"}],
        "no time": [{k: v for k, v in admitted.items() if k != "lastTransitionTime"}],
        "blocked": [
            admitted,
            {"type": "Blocked", "status": "True", "reason": "QueueNotFound", "lastTransitionTime": t},
        ],
    }[variant]


@pytest.mark.parametrize(
    "conditions", ["none", "same", "other message", "other reason", "true", "no time", "blocked"]
)
@pytest.mark.parametrize("phase", ["Queued", "Preempted", "Suspended", None])
@pytest.mark.parametrize("position", [None, 2, 3])
@pytest.mark.parametrize("message", ["m", "m2"])
@pytest.mark.parametrize("reason", ["QuotaExceeded", "Held"])
@pytest.mark.parametrize("identity", [True, False])
def test_pending_change_tells_what_pending_status_would_write(
    conditions: str, phase: str | None, position: int | None, message: str, reason: str, identity: bool
) -> None:
    """`pending_change` classifies without building the patch (it runs for every pending job every
    cycle); it must agree with the patch `pending_status` builds and `cosmetic` judges."""
    status: dict = {"reason": "QuotaExceeded", "message": "m", "conditions": _conditions(conditions)}
    if phase is not None:
        status["phase"] = phase
    if position is not None:
        status["queuePosition"] = position
    if identity:
        status |= {"gpus": 8, "observedGeneration": 1}
    entry = parse_job(job("a", replicas=1, gpus=8, status=status))
    pending = Pending("team-a/a", message, 2, code=reason)
    patch = pending_status(entry, pending, T0)
    expected = Change.NONE if not patch else Change.COSMETIC if cosmetic(entry, patch) else Change.MEANINGFUL
    assert pending_change(entry, pending) is expected
