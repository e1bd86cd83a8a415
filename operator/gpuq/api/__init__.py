"""gpuq API (gpuq.dev/v1alpha1): pydantic models of TrainingJob and GPUQueue, the one source of truth.

crds/*.yaml and the field reference in docs/api.md are generated from these models by `gpuq crds`.
"""

from gpuq.api.gpuqueue import GPUQueue, GPUQueueSpec, GPUQueueStatus, LabelSelector
from gpuq.api.meta import (
    ANNOTATION_CHECKPOINT,
    ANNOTATION_CHECKPOINT_REQUESTED,
    API_VERSION,
    GROUP,
    LABEL_ATTEMPT,
    LABEL_JOB_NAME,
    LABEL_QUEUE,
    LABEL_RANK,
    SCHEDULER_NAME,
    VERSION,
    Condition,
    ConditionStatus,
)
from gpuq.api.trainingjob import (
    CheckpointReport,
    Phase,
    PlacementEntry,
    TrainingJob,
    TrainingJobSpec,
    TrainingJobStatus,
)

__all__ = [
    "ANNOTATION_CHECKPOINT",
    "ANNOTATION_CHECKPOINT_REQUESTED",
    "API_VERSION",
    "GROUP",
    "LABEL_ATTEMPT",
    "LABEL_JOB_NAME",
    "LABEL_QUEUE",
    "LABEL_RANK",
    "SCHEDULER_NAME",
    "VERSION",
    "CheckpointReport",
    "Condition",
    "ConditionStatus",
    "GPUQueue",
    "GPUQueueSpec",
    "GPUQueueStatus",
    "LabelSelector",
    "Phase",
    "PlacementEntry",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
]
