"""The gpuq side's stand-in for Kueue's runner: what counts as admitted, evicted and finished, and
the finish rule (gpuq.peers.perf_gpuq.RunnerState), fed watch events as the informers deliver them."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuq.peers.perf_generator import expand, parse
from gpuq.peers.perf_gpuq import RunnerState
from gpuq.peers.perf_recorder import Recorder

RAW = {
    "topology": {
        "levels": [
            {"name": "rack", "count": 1, "nodeLabel": "x/rack"},
            {"name": "node", "count": 2, "nodeLabel": "kubernetes.io/hostname", "capacity": {"cpu": "8"}},
        ]
    },
    "cohorts": [
        {
            "className": "cohort",
            "count": 1,
            "queuesSets": [
                {
                    "className": "cq",
                    "count": 1,
                    "nominalQuota": 8,
                    "workloadsSets": [
                        {
                            "count": 1,
                            "creationIntervalMs": 0,
                            "workloads": [
                                {
                                    "className": "gang",
                                    "runtimeMs": 50,
                                    "request": 4,
                                    "podCount": 2,
                                    "tasConstraint": "required",
                                    "tasLevel": "x/rack",
                                }
                            ],
                        },
                    ],
                }
            ],
        }
    ],
}
NS, JOB = "cq-0-0-cohort-0", "gang-0-0-0"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def job(phase: str = "", attempt: int = 0) -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": JOB}, "status": {"phase": phase, "attempt": attempt}}


def pod(
    rank: int, attempt: int = 1, node: str | None = "n1", phase: str = "Pending", deleting: bool = False
) -> dict[str, Any]:
    md: dict[str, Any] = {
        "namespace": NS,
        "name": f"{JOB}-{attempt}-{rank}",
        "labels": {"gpuq.dev/job-name": JOB, "gpuq.dev/attempt": str(attempt)},
    }
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": md, "spec": {"nodeName": node}, "status": {"phase": phase}}


def make() -> tuple[RunnerState, Recorder, list[tuple[str, str]], Clock]:
    plan = expand(parse(RAW))
    assert plan.streams[0].jobs[0].workers == 2
    finished: list[tuple[str, str]] = []
    rec, clock = Recorder(), Clock()
    state = RunnerState(plan, rec, lambda ns, name: finished.append((ns, name)), clock)
    return state, rec, finished, clock


async def test_a_complete_bound_gang_is_the_admission_and_is_finished_runtime_later() -> None:
    state, rec, finished, clock = make()
    state.apply("TrainingJob", "ADDED", job("Queued"))
    state.apply("Pod", "ADDED", pod(0))
    assert state.progress.admitted == 0  # half a gang is not an admission
    clock.t = 102.0
    state.apply("Pod", "ADDED", pod(1, node=None))
    assert state.progress.admitted == 0  # created but not bound
    state.apply("Pod", "MODIFIED", pod(1))
    assert state.progress.admitted == 1  # status still says Queued (a burst's delay): the pods decide
    await asyncio.sleep(0.1)  # runtime 50 ms after the admission
    assert sorted(finished) == [(NS, f"{JOB}-1-0"), (NS, f"{JOB}-1-1")]
    clock.t = 103.0
    state.apply("TrainingJob", "MODIFIED", job("Succeeded", 1))
    summary = rec.summary()
    assert summary.workloads["gang"].avg_time_to_admission_s == 2.0
    assert (summary.admitted, summary.finished) == (1, 1)
    assert state.all_finished.is_set()


async def test_a_preempted_gang_is_evicted_and_its_finish_waits_for_the_next_admission() -> None:
    state, rec, finished, clock = make()
    state.apply("TrainingJob", "ADDED", job("Queued"))
    state.apply("TrainingJob", "MODIFIED", job("Running", 1))  # status before this watch saw the pods
    clock.t = 101.0
    state.apply("TrainingJob", "MODIFIED", job("Preempted", 1))
    state.apply("Pod", "ADDED", pod(0, deleting=True))
    await asyncio.sleep(0.1)
    assert finished == []  # evicted before its runtime was up
    clock.t = 105.0
    state.apply("TrainingJob", "MODIFIED", job("Queued", 1))
    state.apply("Pod", "DELETED", pod(0, deleting=True))
    state.apply("Pod", "ADDED", pod(0, attempt=2))
    state.apply("Pod", "ADDED", pod(1, attempt=2))  # the second admission, status still Queued
    await asyncio.sleep(0.1)
    assert sorted(finished) == [(NS, f"{JOB}-2-0"), (NS, f"{JOB}-2-1")]
    summary = rec.summary()
    assert summary.workloads["gang"].evictions == 1
    assert summary.workloads["gang"].avg_time_to_admission_s == 5.0  # to the last admission, as in Kueue


async def test_a_pod_that_kwok_moves_to_running_after_its_finish_is_finished_again() -> None:
    state, _, finished, _ = make()
    state.apply("TrainingJob", "ADDED", job("Queued"))
    state.apply("Pod", "ADDED", pod(0))
    state.apply("Pod", "ADDED", pod(1))
    await asyncio.sleep(0.1)
    assert len(finished) == 2
    state.apply("Pod", "MODIFIED", pod(0, phase="Succeeded"))
    state.apply("Pod", "MODIFIED", pod(1, phase="Running"))  # kwok's Running landed after ours
    assert finished[-1] == (NS, f"{JOB}-1-1") and len(finished) == 3
    assert state.progress.repatched == 1
    state.apply("Pod", "MODIFIED", pod(0, phase="Succeeded"))
    assert len(finished) == 3


async def test_an_older_attempt_left_behind_is_no_admission_of_the_next() -> None:
    """A gang whose pod succeeded just as gpuq preempted it keeps that pod (a finished pod is not
    deleted); the next attempt's admission must still be seen, and finished."""
    state, rec, finished, clock = make()
    state.apply("TrainingJob", "ADDED", job("Queued"))
    state.apply("Pod", "ADDED", pod(0))
    state.apply("Pod", "ADDED", pod(1))
    await asyncio.sleep(0.1)
    state.apply("Pod", "MODIFIED", pod(0, phase="Succeeded"))
    state.apply("Pod", "MODIFIED", pod(1, phase="Succeeded"))  # finished as the eviction was decided
    state.apply("TrainingJob", "MODIFIED", job("Preempted", 1))
    state.apply("TrainingJob", "MODIFIED", job("Queued", 1))  # requeued: attempt 1's pods stay
    assert rec.summary().workloads["gang"].evictions == 1
    finished.clear()
    clock.t = 110.0
    state.apply("Pod", "ADDED", pod(0, attempt=2))
    state.apply("Pod", "ADDED", pod(1, attempt=2))
    await asyncio.sleep(0.1)
    assert sorted(finished) == [(NS, f"{JOB}-2-0"), (NS, f"{JOB}-2-1")]
    assert rec.summary().workloads["gang"].avg_time_to_admission_s == 10.0
