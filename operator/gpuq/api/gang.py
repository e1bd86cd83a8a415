"""Gang: the record gpuq keeps of a gang whose owner it did not create (an Indexed Job, a PyTorchJob).

A TrainingJob holds gpuq's status in its own `status`; a Job or PyTorchJob has no place for it, so
the operator writes the same status (phase, attempt, placement, conditions, queue position) to a
Gang named `<kind>.<owner name>` (`job.llama`) in the owner's namespace, owned by the owner (garbage
collected with it). Users read it (`kubectl get gangs`, `kubectl gpuq jobs/explain job.llama`); only
the operator writes it. docs/existing-workloads.md.
"""

from __future__ import annotations

from pydantic import Field

from gpuq.api.meta import ApiModel
from gpuq.api.trainingjob import TrainingJobStatus


class GangOwner(ApiModel):
    """The object whose pods make the gang."""

    api_version: str = Field(min_length=1, max_length=253, description="e.g. batch/v1, kubeflow.org/v1.")
    kind: str = Field(min_length=1, max_length=63, description="e.g. Job, PyTorchJob.")
    name: str = Field(min_length=1, max_length=253)
    uid: str = Field(default="", max_length=64)


class GangSpec(ApiModel):
    owner: GangOwner
    queue: str = Field(default="", max_length=63, description="The owner's gpuq.dev/queue label.")
    workers: int = Field(default=0, ge=0, le=4096, description="Pods of the gang (ranks).")


GangStatus = TrainingJobStatus
