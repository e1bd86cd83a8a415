"""GPUQueue (cluster-scoped, short name `gq`): a team's GPU quota, optionally in a borrowing cohort."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from gpuq.api.meta import (
    NAME_PATTERN,
    ApiModel,
    Condition,
    GpuModel,
    LabelKey,
    LabelValue,
    cel,
    conditions_field,
    with_rules,
)
from gpuq.core.model import (
    PreemptionPolicy,
    Queue,
    QueueingStrategy,
    ReclaimPreemption,
    WithinQueuePreemption,
)


class StopPolicy(StrEnum):
    NONE = "None"
    HOLD = "Hold"
    HOLD_AND_DRAIN = "HoldAndDrain"


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


# Each CEL rule below is also a validator of the model, so the operator refuses an object stored
# before the rule existed as the API server refuses a new one (tests/api/test_rules_mirrored.py).
_VALUES_RULE = "In/NotIn need values; Exists/DoesNotExist take none"
_LENDING_RULE = "lendingLimitGPUs cannot exceed nominalGPUs"
_COHORT_RULE = "borrowingLimitGPUs and lendingLimitGPUs need a cohort"


class LabelSelectorRequirement(ApiModel):
    model_config = with_rules(
        cel(
            "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
            _VALUES_RULE,
        )
    )

    key: LabelKey = Field(description="Namespace label key.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[LabelValue] = Field(
        default_factory=list, max_length=64, description="Label values for In/NotIn."
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        # `In []` matches no namespace: its jobs would be told to label theirs, which cannot help.
        if (self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)) != bool(self.values):
            raise ValueError(_VALUES_RULE)
        return self


class LabelSelector(ApiModel):
    """A standard label selector: all of matchLabels and matchExpressions must hold."""

    match_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, description="Labels the namespace must carry."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Set-based requirements on namespace labels."
    )


class PreemptionSpec(ApiModel):
    within_queue: WithinQueuePreemption = Field(
        default=WithinQueuePreemption.LOWER_PRIORITY,
        description=(
            "LowerPriority: a job may preempt lower-priority jobs of its own queue. Never: it may not."
        ),
    )
    reclaim_within_cohort: ReclaimPreemption = Field(
        default=ReclaimPreemption.ANY,
        description=(
            "Reclaim lent quota by preempting borrowers in the cohort: Any borrower, only LowerPriority "
            "ones, or Never."
        ),
    )
    preemptible: bool = Field(
        default=True,
        description=(
            "false: no job of this queue is ever a preemption victim (neither within the queue nor "
            "reclaimed by the cohort), e.g. for interactive work; lenders wait for its jobs to finish."
        ),
    )
    max_preemptions_per_hour: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description=(
            "Most jobs of this queue preempted in any hour (victims); unset: no cap. A preemption that "
            "would exceed it is not made: the preemptor waits."
        ),
    )


class GPUQueueSpec(ApiModel):
    model_config = with_rules(
        cel(
            "!has(self.lendingLimitGPUs) || self.lendingLimitGPUs <= self.nominalGPUs",
            _LENDING_RULE,
            ".lendingLimitGPUs",
        ),
        cel(
            "has(self.cohort) || (!has(self.borrowingLimitGPUs) && !has(self.lendingLimitGPUs))",
            _COHORT_RULE,
        ),
    )

    nominal_gpus: int = Field(alias="nominalGPUs", ge=0, le=10_000_000, description="GPUs the queue owns.")
    cohort: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=NAME_PATTERN,
        description="Queues of one cohort lend unused quota to each other.",
    )
    borrowing_limit_gpus: int | None = Field(
        default=None,
        alias="borrowingLimitGPUs",
        ge=0,
        le=10_000_000,
        description="Most GPUs the queue may borrow from its cohort; unset: no limit.",
    )
    lending_limit_gpus: int | None = Field(
        default=None,
        alias="lendingLimitGPUs",
        ge=0,
        le=10_000_000,
        description="Most of its unused nominal GPUs the queue lends; unset: all of them.",
    )
    weight: float = Field(
        default=1.0, gt=0, le=1000, description="Fair-share weight within the cohort when quota is contended."
    )
    namespace_selector: LabelSelector | None = Field(
        default=None,
        description=(
            "Namespaces allowed to submit to this queue; unset: every namespace. Others are rejected."
        ),
    )
    queueing_strategy: QueueingStrategy = Field(
        default=QueueingStrategy.BEST_EFFORT_FIFO,
        description=(
            "StrictFIFO: nothing passes the head. BestEffortFIFO: smaller jobs may pass a head that cannot "
            "fit, without starving it."
        ),
    )
    preemption: PreemptionSpec = Field(
        default_factory=PreemptionSpec, description="Preemption policy.", json_schema_extra={"default": {}}
    )
    model_quotas: dict[GpuModel, Annotated[int, Field(ge=0, le=10_000_000)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Optional per-GPU-model caps (model -> GPUs) on top of nominalGPUs.",
    )
    stop_policy: StopPolicy = Field(
        default=StopPolicy.NONE,
        description=(
            "As in Kueue. Hold: admit no new jobs (running ones keep running; a gang recovering from a node "
            "failure is still re-placed). HoldAndDrain: also evict the admitted jobs, each asked to "
            "checkpoint first, back into the queue. None: admit as usual. `gpuq queue hold|release`."
        ),
    )

    @field_validator("lending_limit_gpus")
    @classmethod
    def _lends_from_nominal(cls, value: int | None, info: ValidationInfo) -> int | None:
        nominal = info.data.get("nominal_gpus")  # absent when nominalGPUs itself failed
        if value is not None and nominal is not None and value > nominal:
            raise ValueError(_LENDING_RULE)
        return value

    @model_validator(mode="after")
    def _limits_need_a_cohort(self) -> GPUQueueSpec:
        if self.cohort is None and (
            self.borrowing_limit_gpus is not None or self.lending_limit_gpus is not None
        ):
            raise ValueError(_COHORT_RULE)
        return self

    def to_core(self, name: str) -> Queue:
        """The scheduling core's view of this queue (used by the operator and the simulator)."""
        return Queue(
            name=name,
            nominal_gpus=self.nominal_gpus,
            cohort=self.cohort,
            borrowing_limit_gpus=self.borrowing_limit_gpus,
            lending_limit_gpus=self.lending_limit_gpus,
            weight=self.weight,
            strategy=self.queueing_strategy,
            preemption=PreemptionPolicy(
                self.preemption.within_queue,
                self.preemption.reclaim_within_cohort,
                preemptible=self.preemption.preemptible,
                max_per_hour=self.preemption.max_preemptions_per_hour,
            ),
            model_quotas=dict(self.model_quotas),
            held=self.stop_policy is not StopPolicy.NONE,
        )


class GPUQueueStatus(ApiModel):
    used_gpus: int = Field(default=0, alias="usedGPUs", ge=0, description="GPUs held by admitted jobs.")
    borrowed_gpus: int = Field(
        default=0, alias="borrowedGPUs", ge=0, description="GPUs in use above nominalGPUs (borrowed)."
    )
    pending_jobs: int = Field(default=0, ge=0, description="Jobs waiting in the queue.")
    admitted_jobs: int = Field(default=0, ge=0, description="Jobs holding quota (admitted or running).")
    recent_preemptions: list[datetime] = Field(
        default_factory=list,
        max_length=1024,
        description="When jobs of this queue were preempted in the last hour (for maxPreemptionsPerHour).",
    )
    conditions: list[Condition] = conditions_field("Observations about the queue.")


class GPUQueue(ApiModel):
    spec: GPUQueueSpec
    status: GPUQueueStatus = Field(default_factory=GPUQueueStatus)
