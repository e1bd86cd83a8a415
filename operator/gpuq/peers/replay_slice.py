"""The slice of a trace that a replay (bench/replay.py) plays on a real cluster and the simulator
plays beside it: the same jobs, times compressed by one factor, shaped into workers as the simulator
shapes them (gpuq.sim.engine.worker_spec), with names a cluster accepts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpuq.core.config import SchedulerConfig
from gpuq.peers.replay_tracker import ReplayJob
from gpuq.sim.engine import worker_spec
from gpuq.sim.trace import TraceJob


class SliceError(ValueError):
    pass


def slice_trace(
    jobs: Sequence[TraceJob],
    *,
    start: float,
    count: int,
    compress: float,
    total_gpus: int,
    max_duration: float | None = None,
) -> tuple[list[TraceJob], int]:
    """The first `count` jobs submitted at or after `start` (trace seconds) that fit the cluster,
    shifted to begin at 0, durations capped at `max_duration` (trace seconds: a heavy tail would
    otherwise set the compression), submit times and durations divided by `compress`; and how many
    larger than the cluster were left out."""
    if compress <= 0:
        raise SliceError(f"--compress must be > 0, got {compress}")
    if count < 1:
        raise SliceError(f"--jobs must be >= 1, got {count}")
    chosen: list[TraceJob] = []
    too_big = 0
    for job in sorted(jobs, key=lambda j: (j.submit_time, j.key)):
        if job.submit_time < start:
            continue
        if job.gpus > total_gpus:
            too_big += 1
            continue
        chosen.append(job)
        if len(chosen) == count:
            break
    if not chosen:
        raise SliceError(
            f"no job of the trace is submitted at or after {start:g} s and fits {total_gpus} GPUs"
        )
    t0 = chosen[0].submit_time
    cap = max_duration if max_duration is not None else float("inf")
    return [
        replace(j, submit_time=(j.submit_time - t0) / compress, duration=min(j.duration, cap) / compress)
        for j in chosen
    ], too_big


def dns_label(text: str, limit: int = 40) -> str:
    """`text` as a DNS label (lowercase letters, digits and '-', starting with a letter)."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"q-{label}".rstrip("-")
    return label[:limit].rstrip("-")


def replay_jobs(
    jobs: Sequence[TraceJob], node_gpus: int, worker_gpus: str = "whole", per_gpu: tuple[int, int] = (0, 0)
) -> list[ReplayJob]:
    """Each job of the slice as the cluster sees it: `j00001`... in submit order, its queue a DNS
    label, its workers as the simulator shapes them (GPUs, and the CPU and memory each worker asks:
    the trace's, or `per_gpu` a GPU when it has none, gpuq.sim.engine.requests_per_gpu)."""
    out = []
    for index, job in enumerate(jobs, start=1):
        shape = worker_spec(job, worker_gpus, node_gpus, per_gpu)
        out.append(
            ReplayJob(
                name=f"j{index:05d}",
                queue=dns_label(job.queue),
                priority=job.priority,
                submit=job.submit_time,
                duration=job.duration,
                workers=shape.replicas,
                gpus_per_worker=shape.gpus_per_worker,
                cpu_millis=shape.cpu_millis,
                memory_bytes=shape.memory_bytes,
            )
        )
    return out


def compressed_rules(config: SchedulerConfig, factor: float) -> SchedulerConfig:
    """gpuq's rules on the slice's clock: every threshold measured in the workload's time (attained
    GPU-hours, a run's minimum before it may be preempted or moved, how long a head waits before it
    starves, is consolidated for, or stops holding out for locality) divided by `factor`, as the
    trace's times are. A replay compressed 40x with a day's locality wait would otherwise hold gangs
    out for 40 trace-days. The machinery's timers (failover grace, back-off) stay as they are: nodes
    do not fail faster in a compressed trace."""
    service, consolidation = config.service, config.consolidation
    return replace(
        config,
        service=replace(
            service,
            thresholds_gpu_hours=tuple(t / factor for t in service.thresholds_gpu_hours),
            min_run_seconds=service.min_run_seconds / factor,
        ),
        consolidation=replace(consolidation, min_wait_seconds=consolidation.min_wait_seconds / factor),
        starvation_seconds=config.starvation_seconds / factor,
        locality_wait_seconds=config.locality_wait_seconds / factor,
    )


def rules_yaml(config: SchedulerConfig) -> dict[str, Any]:
    """The rules `compressed_rules` changes, in the operator's config.yaml spelling (gpuq.config)."""
    return {
        "service": {
            "thresholdsGPUHours": list(config.service.thresholds_gpu_hours),
            "minRunSeconds": config.service.min_run_seconds,
        },
        "consolidation": {"minWaitSeconds": config.consolidation.min_wait_seconds},
        "starvationSeconds": config.starvation_seconds,
        "localityWaitSeconds": config.locality_wait_seconds,
    }
