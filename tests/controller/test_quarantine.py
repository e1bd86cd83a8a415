"""Finding the jobs the core fails on: alone, several, only together, or none (not input-related)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuq.controller.quarantine import MAX_GROUP, Quarantine, culprits
from gpuq.core.model import Job, WorkerSpec


def jobs(n: int) -> list[Job]:
    return [
        Job(key=f"ns/j{i:02d}", queue="q", priority=0, created_at=0.0, workers=WorkerSpec(1, 1))
        for i in range(n)
    ]


def test_single_and_several_culprits_are_found_with_few_runs() -> None:
    runs = []

    def fails(part: Sequence[Job]) -> bool:
        runs.append(len(part))
        return any(j.key in ("ns/j07", "ns/j30") for j in part)

    assert culprits(jobs(40), fails) == ["ns/j07", "ns/j30"]
    assert len(runs) <= 1 + 2 * 2 * 6  # O(k log n), not O(n)


def test_a_failure_of_two_jobs_together_is_pinned_on_that_pair_only() -> None:
    def fails(part: Sequence[Job]) -> bool:
        keys = {j.key for j in part}
        return {"ns/j02", "ns/j03"} <= keys

    assert culprits(jobs(4), fails) == ["ns/j02", "ns/j03"]
    assert culprits(jobs(16), fails) == ["ns/j02", "ns/j03"]


def test_a_failure_only_a_large_group_causes_is_pinned_on_nobody() -> None:
    def fails(part: Sequence[Job]) -> bool:
        return len(part) > MAX_GROUP  # e.g. a resource problem: not one job's fault

    assert culprits(jobs(20), fails) == []


def test_no_culprit_when_the_whole_list_passes() -> None:
    assert culprits(jobs(5), lambda part: False) == []


def test_a_new_generation_lifts_the_quarantine() -> None:
    q = Quarantine()
    q.add(["ns/a", "ns/b"], {"ns/a": 3, "ns/b": 1})
    assert q.active({"ns/a": 3, "ns/b": 1}) == {"ns/a": 3, "ns/b": 1}
    assert q.active({"ns/a": 4}) == {}  # a edited, b deleted
