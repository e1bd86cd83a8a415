"""Kueue's scheduler-benchmark generator format, and its translation to gpuq objects.

Kueue's runner (test/performance/scheduler/runner/generator in the Kueue module) reads a
generator.yaml of cohort sets -> queue sets -> workload sets. Per queue it creates a ClusterQueue
in a cohort, a namespace and a LocalQueue of the same name; per workload set of a queue, one
goroutine that waits `creationIntervalMs` before each workload it creates, `count` times over the
set's templates. `expand` reproduces the same names and the same schedule, and says how each part
maps to gpuq (docs/throughput.md, "Kueue's benchmark"):

  ClusterQueue  -> GPUQueue of the same name: nominalGPUs, borrowingLimitGPUs, cohort, preemption
                   (withinClusterQueue, reclaimWithinCohort; Kueue's LowerOrNewerEqualPriority has no
                   gpuq equivalent and becomes LowerPriority, which preempts less: said in `notes`)
  Workload      -> TrainingJob of the same name in the queue's namespace: `request` per pod ->
                   gpusPerWorker, `podCount` -> workers (only with a TAS level, as in Kueue),
                   `priority`, `runtimeMs` (kept for the runner's finish rule, perf_gpuq),
                   tasConstraint/tasLevel -> spec.topology (required -> Required, preferred ->
                   Preferred, balanced -> Required: the whole gang in one domain, which also keeps
                   every slice in one). Jobs do not checkpoint (`requestOnPreemption: false`): the
                   workloads are mimicked and report none, so a preemption evicts at once, as in Kueue.
  quantities    -> whole GPUs: one factor scales every request, quota and node capacity so that each
                   pod asks for a whole number (the TAS config's 500m and 1250m: x4)
  nodes         -> without a topology: Kueue's runs place nothing (quota is all there is); gpuq binds
                   pods, so it gets one node holding the sum of nominal quotas: placement never binds
                   before quota does, as there (`node_gpus` splits it into nodes of that size, which
                   adds a packing problem Kueue's run does not have: a 20-GPU pod then needs an empty
                   node). With a topology: the generator's levels and counts, outermost first,
                   mapped by position onto gpuq's zone/block/rack/node, capacity scaled.

Pure: no I/O but `load`, no Kubernetes client.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuq.api import meta
from gpuq.controller.resources import QuantityError, parse_quantity
from gpuq.core.model import ReclaimPreemption, TopologyMode, WithinQueuePreemption
from gpuq.devcluster.shape import Shape

# Labels on every TrainingJob, as Kueue's runner labels its Workloads (class and running time).
CLASS_LABEL = "gpuq.dev/perf-class"
RUNNING_MS_LABEL = "gpuq.dev/perf-running-ms"
GPUQ_LEVELS = ("zone", "block", "rack", "node")
MAX_GPUS_PER_WORKER = 64  # TrainingJob's workers.gpusPerWorker maximum
DEFAULT_NODE_CPU = "96"  # Kueue's topology generator's default node capacity
IMAGE = "registry.k8s.io/pause:3.10"
_NAME = re.compile(meta.NAME_PATTERN)


class GeneratorError(ValueError):
    """The generator file cannot be read or translated; the message says where and why."""


# -- the file, as Kueue's runner reads it (unknown keys are ignored there, and here) ----------------
class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


def _quantity_text(value: Any) -> Any:
    """YAML ints and floats for quantities, as sigs.k8s.io/yaml turns them into the Go strings."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


class WorkloadTemplate(_Model):
    class_name: str = Field(alias="className")
    runtime_ms: int = Field(default=0, alias="runtimeMs", ge=0)
    priority: int = 0
    request: str
    pod_count: int = Field(default=0, alias="podCount", ge=0)
    tas_constraint: str = Field(default="", alias="tasConstraint")
    tas_level: str = Field(default="", alias="tasLevel")
    slice_size: int = Field(default=0, alias="sliceSize", ge=0)

    _text = field_validator("request", mode="before")(_quantity_text)


class WorkloadsSet(_Model):
    count: int = Field(ge=0)
    creation_interval_ms: int = Field(default=0, alias="creationIntervalMs", ge=0)
    workloads: list[WorkloadTemplate] = Field(default_factory=list)


class QueuesSet(_Model):
    class_name: str = Field(alias="className")
    count: int = Field(ge=0)
    nominal_quota: str = Field(alias="nominalQuota")
    borrowing_limit: str | None = Field(default=None, alias="borrowingLimit")
    reclaim_within_cohort: str = Field(default="", alias="reclaimWithinCohort")
    within_cluster_queue: str = Field(default="", alias="withinClusterQueue")
    workloads_sets: list[WorkloadsSet] = Field(default_factory=list, alias="workloadsSets")

    _text = field_validator("nominal_quota", "borrowing_limit", mode="before")(_quantity_text)


class CohortSet(_Model):
    class_name: str = Field(alias="className")
    count: int = Field(ge=0)
    queues_sets: list[QueuesSet] = Field(default_factory=list, alias="queuesSets")


class _Capacity(_Model):
    cpu: str | None = None

    _text = field_validator("cpu", mode="before")(_quantity_text)


class TopologyLevel(_Model):
    name: str
    count: int = Field(ge=1)
    node_label: str = Field(alias="nodeLabel")
    capacity: _Capacity = Field(default_factory=_Capacity)


class TopologyConfig(_Model):
    name: str = ""
    levels: list[TopologyLevel]


class GeneratorConfig(_Model):
    topology: TopologyConfig | None = None
    cohorts: list[CohortSet] = Field(default_factory=list)


def load(path: Path) -> GeneratorConfig:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise GeneratorError(f"{path}: {exc}") from None
    return parse(raw, str(path))


def parse(raw: Any, where: str = "generator config") -> GeneratorConfig:
    try:
        config = GeneratorConfig.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise GeneratorError(f"{where}: {path}: {first['msg']}") from None
    if not config.cohorts:
        raise GeneratorError(f"{where}: config must contain at least one cohort (as Kueue's runner says)")
    return config


# -- the translation ------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueuePlan:
    """One ClusterQueue of the generator: a GPUQueue of the same name, and its namespace."""

    name: str
    cohort: str
    class_name: str
    nominal_gpus: int
    borrowing_limit_gpus: int | None
    within: WithinQueuePreemption
    reclaim: ReclaimPreemption

    @property
    def namespace(self) -> str:
        return self.name  # Kueue's runner names the namespace (and LocalQueue) after the ClusterQueue

    def body(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "nominalGPUs": self.nominal_gpus,
            "cohort": self.cohort,
            "preemption": {"withinQueue": self.within.value, "reclaimWithinCohort": self.reclaim.value},
        }
        if self.borrowing_limit_gpus is not None:
            spec["borrowingLimitGPUs"] = self.borrowing_limit_gpus
        return {
            "apiVersion": meta.API_VERSION,
            "kind": "GPUQueue",
            "metadata": {"name": self.name, "labels": {CLASS_LABEL: self.class_name}},
            "spec": spec,
        }


@dataclass(frozen=True)
class JobPlan:
    """One Workload of the generator: a TrainingJob of the same name."""

    name: str
    class_name: str
    runtime_ms: int
    priority: int
    workers: int
    gpus_per_worker: int
    topology: tuple[TopologyMode, str] | None = None  # (mode, gpuq level)

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    def body(self, queue: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "queue": queue,
            "priority": self.priority,
            "checkpoint": {"requestOnPreemption": False},
            "workers": {
                "replicas": self.workers,
                "gpusPerWorker": self.gpus_per_worker,
                "template": {
                    "spec": {
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "trainer", "image": IMAGE}],
                    }
                },
            },
        }
        if self.topology is not None:
            spec["topology"] = {"mode": self.topology[0].value, "level": self.topology[1]}
        labels = {CLASS_LABEL: self.class_name, RUNNING_MS_LABEL: str(self.runtime_ms)}
        return {
            "apiVersion": meta.API_VERSION,
            "kind": "TrainingJob",
            "metadata": {"name": self.name, "labels": labels},
            "spec": spec,
        }


@dataclass(frozen=True)
class Stream:
    """One workload set of one queue: its jobs in creation order, `interval_ms` before each."""

    queue: QueuePlan
    interval_ms: int
    jobs: tuple[JobPlan, ...]


@dataclass(frozen=True)
class Plan:
    factor: Fraction  # every request, quota and node capacity is multiplied by it
    queues: tuple[QueuePlan, ...]
    streams: tuple[Stream, ...]
    shape: Shape
    topology: bool  # the generator has a topology (Kueue's TAS mode)
    notes: tuple[str, ...] = field(default=())

    @property
    def jobs(self) -> int:
        return sum(len(s.jobs) for s in self.streams)

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(sorted({j.class_name for s in self.streams for j in s.jobs}))

    @property
    def nominal_gpus(self) -> int:
        return sum(q.nominal_gpus for q in self.queues)


def _fraction(value: str, where: str) -> Fraction:
    try:
        return Fraction(parse_quantity(value))
    except QuantityError as exc:
        raise GeneratorError(f"{where}: {exc}") from None


def _scale(value: Fraction, factor: Fraction, where: str, notes: list[str]) -> int:
    scaled = value * factor
    if scaled.denominator != 1:
        notes.append(f"{where}: {float(scaled):g} GPUs after scaling, rounded down to {math.floor(scaled)}")
    return math.floor(scaled)


def _within(policy: str, where: str, notes: list[str]) -> WithinQueuePreemption:
    if policy in ("", "Never"):  # Kueue's default is Never
        return WithinQueuePreemption.NEVER
    if policy == "LowerPriority":
        return WithinQueuePreemption.LOWER_PRIORITY
    if policy == "LowerOrNewerEqualPriority":
        notes.append(f"{where}: withinClusterQueue {policy} has no gpuq equivalent: LowerPriority")
        return WithinQueuePreemption.LOWER_PRIORITY
    raise GeneratorError(f"{where}: withinClusterQueue {policy!r} is not a Kueue preemption policy")


def _reclaim(policy: str, where: str) -> ReclaimPreemption:
    mapping = {"": ReclaimPreemption.NEVER, "Never": ReclaimPreemption.NEVER}
    mapping |= {"LowerPriority": ReclaimPreemption.LOWER_PRIORITY, "Any": ReclaimPreemption.ANY}
    if policy not in mapping:
        raise GeneratorError(f"{where}: reclaimWithinCohort {policy!r} is not a Kueue preemption policy")
    return mapping[policy]


def _check_name(name: str, what: str) -> str:
    if not _NAME.match(name) or len(name) > 63:
        raise GeneratorError(f"{what} {name!r} is not a valid Kubernetes name")
    return name


def scale_factor(config: GeneratorConfig) -> Fraction:
    """The smallest whole factor that makes every pod's request a whole number of GPUs."""
    factor = 1
    for cs in config.cohorts:
        for qs in cs.queues_sets:
            for ws in qs.workloads_sets:
                for wl in ws.workloads:
                    denominator = _fraction(wl.request, f"workload class {wl.class_name}").denominator
                    factor = math.lcm(factor, denominator)
    return Fraction(factor)


def _levels(config: GeneratorConfig) -> dict[str, str]:
    """Generator node label -> gpuq level name, matched by position from the innermost level."""
    assert config.topology is not None
    levels = config.topology.levels
    if not 2 <= len(levels) <= len(GPUQ_LEVELS):
        raise GeneratorError(
            f"topology: {len(levels)} levels; gpuq's local cluster has 2 to {len(GPUQ_LEVELS)} "
            f"({', '.join(GPUQ_LEVELS)})"
        )
    names = GPUQ_LEVELS[-len(levels) :]
    return {lvl.node_label: name for lvl, name in zip(levels, names, strict=True)}


def _shape(
    config: GeneratorConfig, factor: Fraction, node_gpus: int, nominal: int, notes: list[str]
) -> Shape:
    if config.topology is None:
        count = max(1, -(-nominal // node_gpus))
        if count * node_gpus != nominal:
            notes.append(
                f"nodes: {count} x {node_gpus} GPUs = {count * node_gpus}, above the {nominal} GPUs of "
                "nominal quota (quota, not nodes, bounds what runs)"
            )
        return Shape(racks=1, nodes_per_rack=count, gpus_per_node=node_gpus, blocks=1, zones=1).validate()
    levels = config.topology.levels
    counts = [lvl.count for lvl in levels]
    cpu = levels[-1].capacity.cpu or DEFAULT_NODE_CPU
    gpus = _scale(_fraction(cpu, "topology node capacity"), factor, "node capacity", notes)
    outer = [1] * (len(GPUQ_LEVELS) - len(counts)) + counts  # zones, blocks per zone, racks per block, nodes
    zones, blocks, racks = outer[0], outer[0] * outer[1], outer[0] * outer[1] * outer[2]
    try:
        return Shape(
            racks=racks, nodes_per_rack=outer[3], gpus_per_node=gpus, blocks=blocks, zones=zones
        ).validate()
    except ValueError as exc:
        raise GeneratorError(f"topology: {exc}") from None


def _job(
    wl: WorkloadTemplate, name: str, factor: Fraction, levels: dict[str, str] | None, notes: list[str]
) -> JobPlan:
    where = f"workload class {wl.class_name}"
    per_pod = _scale(_fraction(wl.request, where), factor, where, notes)
    if not 1 <= per_pod <= MAX_GPUS_PER_WORKER:
        raise GeneratorError(
            f"{where}: {per_pod} GPUs per pod after scaling by {factor}; a TrainingJob worker takes "
            f"1 to {MAX_GPUS_PER_WORKER}"
        )
    if not wl.tas_level:  # Kueue: one pod with the whole request, podCount ignored
        return JobPlan(name, wl.class_name, wl.runtime_ms, wl.priority, 1, per_pod)
    if levels is None:
        raise GeneratorError(f"{where}: tasLevel {wl.tas_level!r} but the config has no topology")
    if wl.tas_level not in levels:
        raise GeneratorError(f"{where}: tasLevel {wl.tas_level!r} is none of the topology's node labels")
    level = levels[wl.tas_level]
    modes = {"required": TopologyMode.REQUIRED, "preferred": TopologyMode.PREFERRED}
    modes["balanced"] = TopologyMode.REQUIRED
    topology = (modes[wl.tas_constraint], level) if wl.tas_constraint in modes else None
    if wl.tas_constraint and topology is None:
        raise GeneratorError(
            f"{where}: tasConstraint {wl.tas_constraint!r} (Kueue knows required, preferred, balanced)"
        )
    return JobPlan(name, wl.class_name, wl.runtime_ms, wl.priority, wl.pod_count or 1, per_pod, topology)


def expand(config: GeneratorConfig, node_gpus: int | None = None) -> Plan:
    """Every queue and workload the runner would create, with Kueue's names, in gpuq's terms.
    `node_gpus`: node size without a topology (default: one node holding the whole nominal quota)."""
    factor = scale_factor(config)
    levels = _levels(config) if config.topology is not None else None
    notes: list[str] = []
    if factor != 1:
        notes.append(f"every request, quota and node capacity is multiplied by {factor} (whole GPUs per pod)")
    queues: list[QueuePlan] = []
    streams: list[Stream] = []
    balanced = False
    for cs in config.cohorts:
        for c in range(cs.count):
            cohort = _check_name(f"{cs.class_name}-{c}", "cohort")
            for qsi, qs in enumerate(cs.queues_sets):
                where = f"queue class {qs.class_name}"
                nominal = _scale(_fraction(qs.nominal_quota, where), factor, where, notes)
                borrowing = (
                    _scale(_fraction(qs.borrowing_limit, where), factor, where, notes)
                    if qs.borrowing_limit is not None
                    else None
                )
                within = _within(qs.within_cluster_queue, where, notes)
                reclaim = _reclaim(qs.reclaim_within_cohort, where)
                for qi in range(qs.count):
                    name = _check_name(f"{qs.class_name}-{qsi}-{qi}-{cohort}", "queue")
                    queue = QueuePlan(name, cohort, qs.class_name, nominal, borrowing, within, reclaim)
                    queues.append(queue)
                    for wsi, ws in enumerate(qs.workloads_sets):
                        jobs = []
                        for si in range(ws.count):
                            for i, wl in enumerate(ws.workloads):
                                name = _check_name(f"{wl.class_name}-{wsi}-{si}-{i}", "workload")
                                jobs.append(_job(wl, name, factor, levels, notes))
                                balanced |= wl.tas_constraint == "balanced"
                        streams.append(Stream(queue, ws.creation_interval_ms, tuple(jobs)))
    if balanced:
        notes.append("tasConstraint balanced -> Required at its level (the whole gang in one domain)")
    if not queues:
        raise GeneratorError("the config creates no queue")
    largest = max((j.gpus_per_worker for s in streams for j in s.jobs), default=1)
    nominal = sum(q.nominal_gpus for q in queues)
    shape = _shape(config, factor, node_gpus or max(nominal, largest), nominal, notes)
    if shape.gpus_per_node < largest:
        raise GeneratorError(f"nodes of {shape.gpus_per_node} GPUs cannot hold a pod of {largest}")
    return Plan(
        factor, tuple(queues), tuple(streams), shape, config.topology is not None, tuple(dict.fromkeys(notes))
    )
