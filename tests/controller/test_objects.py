"""What a job's entry derives from its status when it is parsed (StatusFacts), and the rank order
of a placement."""

from __future__ import annotations

import json

from gpuq.api import meta
from gpuq.api.trainingjob import PlacementEntry
from gpuq.controller.bodies import T0, iso, job, placed_status
from gpuq.controller.objects import parse_job, ranked_nodes


def test_a_placement_is_read_by_rank_whatever_order_or_ranks_it_has() -> None:
    def entries(*pairs: tuple[int, str]) -> list[PlacementEntry]:
        return [PlacementEntry(rank=r, node=n) for r, n in pairs]

    assert ranked_nodes([]) == ()
    assert ranked_nodes(entries((0, "a"), (1, "b"), (2, "c"))) == ("a", "b", "c")
    assert ranked_nodes(entries((2, "c"), (0, "a"), (1, "b"))) == ("a", "b", "c")
    # Not ranks 0..n-1 once each (an edited status): sorted by rank, ties kept in their order.
    assert ranked_nodes(entries((3, "d"), (1, "b"))) == ("b", "d")
    assert ranked_nodes(entries((1, "x"), (0, "a"), (1, "y"))) == ("a", "x", "y")


def test_a_running_jobs_facts_follow_its_status() -> None:
    status = placed_status(["n2", "n1"], notBefore=iso(T0 + 90), failedNodes=["n9"])
    status["placement"].reverse()  # stored out of rank order: read by rank all the same
    status["previousPlacement"] = [{"rank": 1, "node": "n7"}, {"rank": 0, "node": "n8"}]
    facts = parse_job(job("a", status=status)).facts
    assert facts.started_at == T0 + 20  # startedAt wins over admittedAt
    assert facts.not_before == T0 + 90
    assert facts.placement == ("n2", "n1")
    assert facts.previous_placement == ("n8", "n7")
    assert facts.avoid_nodes == frozenset({"n9"})


def test_an_admitted_job_started_at_its_admission_and_a_queued_one_has_no_times() -> None:
    admitted = parse_job(job("a", status=placed_status(["n1"], phase="Admitted"))).facts
    assert admitted.started_at == T0 + 10
    queued = parse_job(job("b", status={"phase": "Queued"})).facts
    times = queued.started_at, queued.not_before
    assert times == (None, 0.0) and queued.placement == () and queued.checkpoint is None


def test_the_newer_checkpoint_of_status_and_annotation_is_the_jobs() -> None:
    def report(step: int, at: float) -> dict[str, object]:
        return {"step": step, "path": f"s3://ckpt/{step}", "time": iso(at)}

    status = placed_status(["n1"], lastCheckpoint=report(10, T0 + 100))
    annotated = {meta.ANNOTATION_CHECKPOINT: json.dumps(report(12, T0 + 200))}
    newer = parse_job(job("a", status=status, annotations=annotated)).facts.checkpoint
    assert newer is not None and (newer.time, newer.step, newer.path) == (T0 + 200, 12, "s3://ckpt/12")
    older = {meta.ANNOTATION_CHECKPOINT: json.dumps(report(8, T0 + 50))}
    kept = parse_job(job("a", status=status, annotations=older)).facts.checkpoint
    assert kept is not None and (kept.time, kept.step) == (T0 + 100, 10)
