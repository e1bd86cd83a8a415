"""The demo's stand-in for the training code inside the workers (the pods only run `pause` on kwok).

Real training code reports checkpoints and polls for checkpoint requests through gpuq.sdk; here the
demo does the same through the API: it writes the job's `gpuq.dev/checkpoint` annotation (JSON
{step, path, time}), which the operator folds into status.lastCheckpoint and passes to restarted
workers as GPUQ_RESUME_FROM / GPUQ_RESUME_STEP.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuq.api import meta
from gpuq.controller.testing import GpuqClient

STEPS_PER_SECOND = 10  # the simulated training speed
CHECKPOINT_ROOT = "s3://demo-checkpoints"


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str
    time: float  # epoch seconds, as the annotation allows


def _epoch(stamp: str | None) -> float | None:
    return dt.datetime.fromisoformat(stamp).timestamp() if stamp else None


def current_step(obj: Mapping[str, Any], now: float) -> int:
    """The step a job has reached: its last checkpoint plus the steps run since (or since it started)."""
    status = obj.get("status") or {}
    last = status.get("lastCheckpoint") or {}
    started = _epoch(status.get("startedAt"))
    if started is None:
        return int(last.get("step", 0))
    since = max(started, _epoch(last.get("time")) or started)
    return int(last.get("step", 0)) + max(1, int((now - since) * STEPS_PER_SECOND))


def checkpoint_requested_at(obj: Mapping[str, Any]) -> str | None:
    """When the operator asked the job to checkpoint (the PreemptionRequested condition), if it did."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PreemptionRequested" and cond.get("status") == "True":
            return str(cond.get("lastTransitionTime") or "requested")
    return None


class Trainer:
    """Reports checkpoints for the demo's jobs and answers the operator's checkpoint requests."""

    def __init__(self, gpuq: GpuqClient, namespace: str, note: Callable[[str], None]) -> None:
        self.gpuq = gpuq
        self.namespace = namespace
        self.note = note
        self._answered: set[tuple[str, str]] = set()  # (job, request time) already answered
        self.reports: dict[str, list[Checkpoint]] = {}

    def save(self, obj: Mapping[str, Any]) -> Checkpoint:
        """Write a checkpoint report for the job at the step it has reached now."""
        name = obj["metadata"]["name"]
        now = time.time()
        step = current_step(obj, now)
        ckpt = Checkpoint(step, f"{CHECKPOINT_ROOT}/{self.namespace}/{name}/step-{step:06d}", now)
        report = {"step": ckpt.step, "path": ckpt.path, "time": ckpt.time}
        self.gpuq.patch_job(
            self.namespace,
            name,
            {"metadata": {"annotations": {meta.ANNOTATION_CHECKPOINT: json.dumps(report)}}},
        )
        self.reports.setdefault(name, []).append(ckpt)
        return ckpt

    def answer_requests(self, jobs: list[dict[str, Any]]) -> None:
        """Save a checkpoint for every job the operator has asked to checkpoint (once per request)."""
        for obj in jobs:
            requested = checkpoint_requested_at(obj)
            key = (obj["metadata"]["name"], requested or "")
            if requested is None or key in self._answered:
                continue
            self._answered.add(key)
            ckpt = self.save(obj)
            self.note(f"{key[0]} was asked to checkpoint before preemption: saved step {ckpt.step}")
