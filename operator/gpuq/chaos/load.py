"""A mixed training load for chaos runs (deterministic for a seed).

Gang shapes from one GPU to eight 8-GPU workers, mostly priority 0 with some priority 50 and 100 jobs
(so preemptions happen), short simulated runs (kwok finishes a pod `gpuq.dev/sim-duration` after it
starts), four team queues in one cohort whose quotas add up to the cluster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from gpuq.devcluster import SIM_DURATION

# (replicas, GPUs per worker, weight)
SHAPES = ((1, 1, 20), (1, 2, 15), (1, 4, 15), (1, 8, 20), (2, 8, 15), (4, 8, 10), (8, 8, 5))
PRIORITIES = ((0, 80), (50, 15), (100, 5))
QUEUES = ("team-a", "team-b", "team-c", "team-d")
COHORT = "chaos"


@dataclass(frozen=True)
class LoadJob:
    name: str
    queue: str
    replicas: int
    gpus: int
    priority: int
    seconds: int

    def body(self) -> dict[str, Any]:
        """A TrainingJob body (as gpuq.controller.testing.GpuqClient.job_body builds them)."""
        from gpuq.controller.testing import GpuqClient

        return GpuqClient.job_body(
            self.name,
            self.queue,
            self.replicas,
            self.gpus,
            annotations={SIM_DURATION: f"{self.seconds}s"},
            priority=self.priority,
            checkpoint={"requestOnPreemption": True, "gracePeriodSeconds": 2},
            maxRestarts=10,
        )


def _pick(rng: random.Random, table: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
    return rng.choices(table, weights=[row[-1] for row in table])[0]


def job_mix(n: int, seed: int = 1, min_seconds: int = 5, max_seconds: int = 30) -> list[LoadJob]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        replicas, gpus, _ = _pick(rng, SHAPES)
        priority, _ = _pick(rng, PRIORITIES)
        jobs.append(
            LoadJob(
                name=f"job-{i:04d}",
                queue=rng.choice(QUEUES),
                replicas=replicas,
                gpus=gpus,
                priority=priority,
                seconds=rng.randint(min_seconds, max_seconds),
            )
        )
    return jobs


def queue_specs(total_gpus: int) -> dict[str, dict[str, Any]]:
    """Equal nominal quotas adding up to the cluster, one cohort, preemption on as users set it."""
    share = total_gpus // len(QUEUES)
    return {
        q: {
            "nominalGPUs": share,
            "cohort": COHORT,
            "preemption": {"withinQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
        }
        for q in QUEUES
    }
