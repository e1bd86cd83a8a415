"""TrainingJob (namespaced, short name `tj`): a gang of GPU worker pods scheduled whole or not at all."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from gpuq.api.meta import (
    DNS_LABEL_PATTERN,
    NAME_PATTERN,
    ApiModel,
    Condition,
    GpuModel,
    cel,
    conditions_field,
    with_rules,
)
from gpuq.core.model import TopologyMode

INT32_MAX = 2**31 - 1


class Phase(StrEnum):
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    PREEMPTED = "Preempted"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


# Phases in which a job holds (or is being given) its placement: its gang spec is frozen then.
PLACED_PHASES = (Phase.ADMITTED, Phase.RUNNING)
FINISHED_PHASES = (Phase.SUCCEEDED, Phase.FAILED)


# The worker template is a PodTemplateSpec: Kubernetes checks it when gpuq creates the pods, but by
# then the job was accepted and would only wait, Blocked. The shape below is what gpuq itself needs
# of it; the CRD schema is generated from it (so the API server refuses a job without it) and the
# operator checks a template against it (for jobs stored before the schema said so). Everything
# else in the template is kept as written (x-kubernetes-preserve-unknown-fields).
_PRESERVE: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}


def _open(*rules: dict[str, str]) -> ConfigDict:
    """An object that keeps unknown fields, with `rules` (CEL) on it."""
    extra = {**_PRESERVE, "x-kubernetes-validations": list(rules)} if rules else _PRESERVE
    return ConfigDict(**(ApiModel.model_config | {"extra": "allow", "json_schema_extra": extra}))


NODE_NAME_SET = "must not be set: gpuq places the workers"


class WorkerRestartPolicy(StrEnum):
    NEVER = "Never"
    ON_FAILURE = "OnFailure"


class ContainerShape(ApiModel):
    model_config = _open()

    name: str = Field(min_length=1, max_length=63, description="Container name.")
    image: str = Field(min_length=1, max_length=4096, description="Container image.")


class PodSpecShape(ApiModel):
    model_config = _open(cel("!has(self.nodeName)", NODE_NAME_SET, ".nodeName"))

    containers: list[ContainerShape] = Field(
        min_length=1,
        max_length=64,
        description="The worker's containers; the first gets the nvidia.com/gpu requests and limits.",
    )
    restart_policy: WorkerRestartPolicy | None = Field(
        default=None, description="Never (the default) or OnFailure; Always is refused."
    )
    node_name: str | None = Field(default=None, description=NODE_NAME_SET.capitalize() + ".")

    @model_validator(mode="after")
    def _unplaced(self) -> PodSpecShape:
        if self.node_name is not None:
            raise ValueError(f"nodeName {NODE_NAME_SET}")
        return self


class PodTemplateShape(ApiModel):
    model_config = _open()

    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Labels and annotations for the worker pods.",
        json_schema_extra=_PRESERVE,
    )
    spec: PodSpecShape = Field(description="The worker pod's spec.")


@dataclass(frozen=True, slots=True)
class SchemaOf:
    """Annotation: the field stays a plain value in Python; its JSON schema is `model`'s."""

    model: type[BaseModel]

    def __get_pydantic_json_schema__(
        self, _schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(self.model.__pydantic_core_schema__)


class Workers(ApiModel):
    """The gang: `replicas` identical workers, each needing `gpusPerWorker` GPUs on one node."""

    replicas: int = Field(ge=1, le=4096, description="Gang size: all workers are bound together or none is.")
    gpus_per_worker: int = Field(
        ge=1, le=64, description="GPUs (nvidia.com/gpu) each worker needs on its node."
    )
    # A dict in Python (pods are rendered from it as written); its schema is PodTemplateShape's, and
    # gpuq.controller.pods.check_template holds a template to that shape.
    template: Annotated[dict[str, Any], SchemaOf(PodTemplateShape)] = Field(
        description=(
            "A PodTemplateSpec for every worker (required: at least one container with a name and an "
            "image). gpuq sets nvidia.com/gpu requests and limits on the first container, "
            "schedulerName, the gpuq.dev/* labels and the MASTER_ADDR/WORLD_SIZE/RANK/GPUQ_* env."
        ),
    )
    gpu_models: list[GpuModel] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "GPU models the job accepts (any of), matched against the node's GPU product label; empty: any."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    mixed_models: bool = Field(
        default=False, description="Allow one gang to span nodes of different GPU models."
    )


_REQUIRED_LEVEL = "mode Required needs a level"


class TopologySpec(ApiModel):
    """Where the gang may be placed in the topology (levels come from the scheduler config)."""

    model_config = with_rules(
        cel("!has(self.mode) || self.mode != 'Required' || has(self.level)", _REQUIRED_LEVEL, ".level")
    )

    level: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Topology level name (default config: zone, block, rack, node); unset: no constraint.",
    )
    mode: TopologyMode = Field(
        default=TopologyMode.PREFERRED,
        description=(
            "Required: the whole gang inside one domain of `level`. Preferred: the smallest domain that "
            "fits, widening as needed; a multi-worker gang first holds out for one domain of the smallest "
            "level that could hold it, up to the scheduler's localityWaitSeconds (default one day)."
        ),
    )

    @model_validator(mode="after")
    def _required_has_a_level(self) -> TopologySpec:
        # The CEL rule's mirror, for a job stored before it (tests/api/test_rules_mirrored.py).
        if self.mode is TopologyMode.REQUIRED and self.level is None:
            raise ValueError(_REQUIRED_LEVEL)
        return self


class CheckpointSpec(ApiModel):
    """How the job is asked to checkpoint before it is preempted."""

    request_on_preemption: bool = Field(
        default=True,
        description=(
            "Annotate the pods with gpuq.dev/checkpoint-requested and wait for a report before eviction."
        ),
    )
    grace_period_seconds: int = Field(
        default=60,
        ge=0,
        le=86400,
        description="How long to wait for a newer checkpoint report before evicting.",
    )


class TrainingJobSpec(ApiModel):
    queue: str = Field(
        min_length=1, max_length=63, pattern=NAME_PATTERN, description="Name of the GPUQueue to charge."
    )
    priority: int = Field(
        default=0,
        ge=-INT32_MAX,
        le=INT32_MAX,
        description="Higher runs first and may preempt lower-priority jobs of the same queue.",
    )
    preemptible: bool = Field(default=True, description="false: never chosen as a preemption victim.")
    min_runtime_seconds: int = Field(
        default=0, ge=0, le=INT32_MAX, description="Not preempted before it has run this long."
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        le=1000,
        description=(
            "Restarts after a node failure or a failed worker before the job is Failed "
            "(preemptions do not count)."
        ),
    )
    workers: Workers = Field(description="The gang of workers.")
    topology: TopologySpec = Field(
        default_factory=TopologySpec,
        description="Topology constraint of the gang.",
        json_schema_extra={"default": {"mode": TopologyMode.PREFERRED.value}},
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="Checkpoint request before preemption.",
        json_schema_extra={"default": {"requestOnPreemption": True, "gracePeriodSeconds": 60}},
    )
    suspend: bool = Field(
        default=False,
        description=(
            "true: stop the job. A running gang is asked to checkpoint (like a preemption victim) and "
            "then releases its GPUs; the job stays Suspended until this is false again, then rejoins "
            "its queue in its original order (priority, then creation time)."
        ),
    )


class PlacementEntry(ApiModel):
    rank: int = Field(ge=0, description="Worker rank (RANK / NODE_RANK).")
    node: str = Field(min_length=1, max_length=253, description="Node the worker is bound to.")


class CheckpointReport(ApiModel):
    """A checkpoint the training code reported (annotation gpuq.dev/checkpoint, JSON)."""

    step: int = Field(ge=0, description="Training step of the checkpoint.")
    path: str = Field(
        min_length=1, max_length=4096, description="Where the checkpoint is (GPUQ_RESUME_FROM)."
    )
    time: datetime = Field(description="When it was written (RFC 3339).")


class PreemptionStatus(ApiModel):
    """A preemption in progress: the victim was asked to checkpoint and is evicted at the deadline
    (or as soon as it reports a newer checkpoint). Kept in status so it survives operator restarts."""

    preemptor: str = Field(
        min_length=1,
        description=(
            "The job (namespace/name) it makes room for, or what else stops it: `suspend` (spec.suspend) "
            "or `queue-drain` (its GPUQueue's stopPolicy HoldAndDrain)."
        ),
    )
    reason: str = Field(default="", description="Why this job was chosen as a victim.")
    requested_at: datetime = Field(description="When the checkpoint was requested.")
    deadline: datetime = Field(description="When the victim is evicted at the latest.")
    checkpoint_before: CheckpointReport | None = Field(
        default=None,
        description="The victim's latest checkpoint when it was asked (a newer one ends the wait).",
    )


class TrainingJobStatus(ApiModel):
    phase: Phase | None = Field(
        default=None, description="Queued, Admitted, Running, Recovering, Preempted, ..."
    )
    queue_position: int | None = Field(
        default=None, ge=1, description="1-based position in its queue while Queued."
    )
    reason: str | None = Field(
        default=None,
        max_length=64,
        description=(
            "Why the job waits, as a stable code (QuotaExceeded, Fragmented, Held, ...; docs/api.md lists "
            "them); unset while it holds GPUs or has finished. `message` says the same with numbers."
        ),
    )
    message: str | None = Field(default=None, description="Why the job is in its phase (e.g. why it waits).")
    gpus: int | None = Field(
        default=None, ge=0, description="Total GPUs of the gang (replicas x gpusPerWorker)."
    )
    admitted_at: datetime | None = Field(default=None, description="When the current attempt was admitted.")
    started_at: datetime | None = Field(
        default=None, description="When every worker of the attempt was Running."
    )
    finished_at: datetime | None = Field(default=None, description="When the job Succeeded or Failed.")
    restarts: int = Field(
        default=0, ge=0, description="Restarts after failures (counted against maxRestarts)."
    )
    preemptions: int = Field(default=0, ge=0, description="Times the job was preempted.")
    preemption: PreemptionStatus | None = Field(
        default=None, description="Set while the job is being preempted (waiting for its checkpoint)."
    )
    rejections: int = Field(
        default=0,
        ge=0,
        description=(
            "Admissions in a row that a kubelet refused (e.g. OutOfnvidia.com/gpu after another scheduler "
            "took the GPUs); they cost no restart. Reset when the gang runs."
        ),
    )
    attempt: int = Field(
        default=0, ge=0, description="Admission counter; pods of attempt N carry label gpuq.dev/attempt=N."
    )
    placement: list[PlacementEntry] = Field(
        default_factory=list, max_length=4096, description="Node of each rank of the current attempt."
    )
    previous_placement: list[PlacementEntry] = Field(
        default_factory=list, max_length=4096, description="Placement before the last eviction."
    )
    failed_nodes: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Nodes that failed under this job: it avoids them while other nodes fit, and takes "
        "one that has recovered (Ready, healthy, not flapping) rather than waiting.",
    )
    not_before: datetime | None = Field(
        default=None, description="Restart back-off: not re-placed before this time."
    )
    last_checkpoint: CheckpointReport | None = Field(default=None, description="Latest reported checkpoint.")
    lost_gpu_seconds: float = Field(
        default=0.0,
        alias="lostGPUSeconds",
        ge=0,
        description="GPU-seconds of work lost to restarts (since the last checkpoint).",
    )
    attained_gpu_seconds: float = Field(
        default=0.0,
        alias="attainedGPUSeconds",
        ge=0,
        description=(
            "GPU-seconds the job held running in its ended attempts (attained service: within its queue "
            "and priority, jobs with less go first; docs/scheduling.md)."
        ),
    )
    observed_generation: int | None = Field(default=None, ge=0, description="Last metadata.generation seen.")
    conditions: list[Condition] = conditions_field("Observations: Admitted, QueueNotFound, Invalid, ...")


class TrainingJob(ApiModel):
    spec: TrainingJobSpec
    status: TrainingJobStatus = Field(default_factory=TrainingJobStatus)


# Rules that span spec and status or read metadata.name: they sit at the root of the CRD schema.
_FROZEN_WHILE_PLACED = " && ".join(
    f"self.spec.{f} == oldSelf.spec.{f}"
    for f in ("queue", "workers.replicas", "workers.gpusPerWorker", "topology")
)
ROOT_VALIDATIONS = [
    cel(
        "size(self.metadata.name) <= 52 && self.metadata.name.matches('" + DNS_LABEL_PATTERN + "')",
        "name must be a DNS-1035 label of at most 52 characters (it names the Service and the worker pods)",
        ".metadata.name",
    ),
    cel(
        "!has(oldSelf.status) || !has(oldSelf.status.phase) || "
        f"!(oldSelf.status.phase in {[p.value for p in PLACED_PHASES]}) || ({_FROZEN_WHILE_PLACED})",
        "spec.queue, spec.workers.replicas, spec.workers.gpusPerWorker and spec.topology are immutable "
        "while the job is admitted or running",
        ".spec",
    ),
]
