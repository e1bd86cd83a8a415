"""Training progress lost to a node failure or a preemption, one model for gpuq and for Kueue
(bench/incidents.py; docs/failover.md, "Against Kueue").

The model: the training script saves a checkpoint to shared storage every `interval` seconds and
resumes from the newest one when its gang starts again (on gpuq the operator hands it the path,
GPUQ_RESUME_FROM; a Kueue user's script finds it itself). An incident strikes at a time uniform within
the checkpoint interval, so the work since the last checkpoint is interval / 2 on average and at most
interval. Every GPU of the gang loses it, since no rank can step without the others.

- Node failure: the gang loses the work since its last checkpoint, and its GPUs do nothing useful
  until the whole gang runs again (`recovery`, measured from the fault):
  lost = gpus x (since_checkpoint + recovery).
- Preemption, victim killed without a checkpoint (Kueue; gpuq when a victim does not answer within its
  grace period): lost = gpus x since_checkpoint.
- Preemption, victim asked to checkpoint first (gpuq): it saves (training stops for the save) and is
  evicted after its report; what it ran after the save started is lost:
  lost = gpus x (evicted - save_started).

Restarting (loading the checkpoint, warming up) costs both sides the same and is left out; time a
victim then waits in its queue is queueing, not lost progress.
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINT_INTERVAL_S = 600.0


@dataclass(frozen=True)
class Loss:
    """GPU-seconds of training lost: on average over when the incident strikes, and at worst (it
    strikes just before a checkpoint)."""

    expected: float
    worst: float

    def __add__(self, other: Loss) -> Loss:
        return Loss(self.expected + other.expected, self.worst + other.worst)

    @property
    def expected_gpu_hours(self) -> float:
        return self.expected / 3600.0

    @property
    def worst_gpu_hours(self) -> float:
        return self.worst / 3600.0


NONE = Loss(0.0, 0.0)


def since_checkpoint(interval: float = CHECKPOINT_INTERVAL_S) -> Loss:
    """Seconds of work since the last periodic checkpoint (per GPU): interval / 2 on average, at most
    interval."""
    if interval < 0:
        raise ValueError(f"checkpoint interval {interval} < 0")
    return Loss(interval / 2.0, interval)


def failure_loss(gpus: int, recovery: float, interval: float = CHECKPOINT_INTERVAL_S) -> Loss:
    """A gang of `gpus` GPUs that ran again `recovery` seconds after a node under it failed."""
    if gpus < 0 or recovery < 0:
        raise ValueError(f"gpus {gpus} and recovery {recovery} must be >= 0")
    work = since_checkpoint(interval)
    return Loss(gpus * (work.expected + recovery), gpus * (work.worst + recovery))


def killed_loss(gpus: int, interval: float = CHECKPOINT_INTERVAL_S) -> Loss:
    """A preemption victim of `gpus` GPUs killed without a checkpoint."""
    if gpus < 0:
        raise ValueError(f"gpus {gpus} < 0")
    work = since_checkpoint(interval)
    return Loss(gpus * work.expected, gpus * work.worst)


def saved_loss(gpus: int, save_started: float, evicted: float) -> Loss:
    """A preemption victim of `gpus` GPUs that started saving at `save_started` and was evicted at
    `evicted` (same clock): the save and whatever ran after it are lost, whenever the request came."""
    if gpus < 0 or evicted < save_started:
        raise ValueError(f"gpus {gpus} < 0 or evicted {evicted} before the save started {save_started}")
    lost = gpus * (evicted - save_started)
    return Loss(lost, lost)


def victim_loss(
    gpus: int, saved: tuple[float, float] | None, interval: float = CHECKPOINT_INTERVAL_S
) -> Loss:
    """A preemption victim: `saved` = (save started, evicted) when it checkpointed before it went,
    None when it was killed without one."""
    return killed_loss(gpus, interval) if saved is None else saved_loss(gpus, *saved)
