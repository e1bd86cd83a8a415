"""Checkpoint protocol, worker side: report a checkpoint, poll for a checkpoint request, read where to
resume from. Reports go to the pod's own `gpuq.dev/checkpoint` annotation; the operator folds the
newest report of any of the job's pods into the job's status.lastCheckpoint."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpuq.sdk.client import annotate_pod, get_pod
from gpuq.sdk.context import PodContext, SdkError
from gpuq.sdk.protocol import ANNOTATION_CHECKPOINT, ANNOTATION_CHECKPOINT_REQUESTED

MAX_PATH = 4096  # what status.lastCheckpoint.path accepts


@dataclass(frozen=True, slots=True)
class ResumeInfo:
    """Where a restarted (or requeued) worker resumes: GPUQ_RESUME_FROM / _STEP / GPUQ_RESTART_COUNT."""

    path: str
    step: int
    restart_count: int


def resume_info(env: Mapping[str, str] | None = None) -> ResumeInfo | None:
    """The checkpoint to resume from, or None on a first start (or when none was ever reported)."""
    env = os.environ if env is None else env
    path = env.get("GPUQ_RESUME_FROM")
    if not path:
        return None
    try:
        return ResumeInfo(
            path, int(env.get("GPUQ_RESUME_STEP", "0")), int(env.get("GPUQ_RESTART_COUNT", "0"))
        )
    except ValueError as exc:
        raise SdkError(f"malformed GPUQ_RESUME_STEP/GPUQ_RESTART_COUNT: {exc}") from None


def report_checkpoint(
    step: int, path: str, *, when: datetime | None = None, ctx: PodContext | None = None
) -> None:
    """Tell gpuq a checkpoint of `step` is durably stored at `path`. Call it after the save completes:
    a restarted gang resumes from the newest report, and a pending preemption proceeds on it."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise SdkError(f"step must be a non-negative int, got {step!r}")
    if not isinstance(path, str) or not path or len(path) > MAX_PATH:
        raise SdkError(f"path must be a non-empty string of at most {MAX_PATH} characters")
    at = (when or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    report = json.dumps({"step": step, "path": path, "time": at}, separators=(",", ":"))
    annotate_pod(ctx or PodContext.from_env(), {ANNOTATION_CHECKPOINT: report})


def checkpoint_requested(ctx: PodContext | None = None) -> bool:
    """True once gpuq asked this pod to checkpoint (it is about to be preempted). Cheap enough to poll
    every few steps when the pod has the downward-API annotations volume; otherwise one GET."""
    ctx = ctx or PodContext.from_env()
    if ctx.podinfo_dir is not None:
        live = _downward_annotations(ctx.podinfo_dir / "annotations")
        if live is not None:
            return ANNOTATION_CHECKPOINT_REQUESTED in live
    annotations = (get_pod(ctx).get("metadata") or {}).get("annotations") or {}
    return ANNOTATION_CHECKPOINT_REQUESTED in annotations


def _downward_annotations(path: Path) -> dict[str, str] | None:
    """Parse the kubelet's downward-API annotations file (lines key="escaped value")."""
    try:
        text = path.read_text()
    except OSError:
        return None
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = value.strip('"')
    return out
