"""PreemptionTracker: a victim is evicted once it checkpointed or its grace period ended."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuq.api.trainingjob import CheckpointReport
from gpuq.controller.preemption import PreemptionTracker


def ck(step: int, t: float) -> CheckpointReport:
    return CheckpointReport(step=step, path=f"p{step}", time=datetime.fromtimestamp(t, UTC))


def test_evicts_after_a_newer_checkpoint_or_at_the_deadline() -> None:
    tr = PreemptionTracker()
    ev = tr.start("ns/v", "ns/p", "priority", now=100.0, grace_seconds=60, baseline=ck(1, 50))
    assert not tr.due(ev, ck(1, 50), now=120)  # same checkpoint as before
    assert tr.due(ev, ck(2, 110), now=120)  # a newer one
    assert tr.due(ev, ck(1, 50), now=160)  # grace over
    assert tr.next_deadline() == 160


def test_first_checkpoint_counts_when_there_was_none() -> None:
    tr = PreemptionTracker()
    ev = tr.start("ns/v", "ns/p", "r", now=0.0, grace_seconds=60, baseline=None)
    assert not tr.due(ev, None, now=1) and tr.due(ev, ck(1, 1), now=1)


def test_evicted_victims_are_not_due_again_and_leave_no_deadline() -> None:
    tr = PreemptionTracker()
    ev = tr.start("ns/v", "ns/p", "r", now=0.0, grace_seconds=0, baseline=None)
    tr.mark_evicted("ns/v")
    assert not tr.due(ev, None, now=100) and tr.next_deadline() is None
    assert "ns/v" in tr
    tr.finish("ns/v")
    assert "ns/v" not in tr
