"""Load the scheduler configuration (ConfigMap `gpuq-scheduler-config`, key `config.yaml`).

The YAML uses the API's camelCase spelling. Every field is optional (defaults live in
`gpuq.core.config`); unknown keys and out-of-range values are rejected with a message that names
the offending path, so a typo never silently falls back to a default.

    topology:
      levels:                      # outermost first; the last level must be `node`
        - {name: zone,  label: topology.kubernetes.io/zone}
        - {name: block, label: gpuq.dev/block}
        - {name: rack,  label: gpuq.dev/rack}
        - {name: node,  label: kubernetes.io/hostname}
    weights: {node: 1, rack: 4, block: 16, zone: 64}
    failover: {notReadyGraceSeconds: 10, backoffBaseSeconds: 5, backoffMaxSeconds: 300,
               nodeFlapWindowSeconds: 600, nodeFlapThreshold: 3,
               disruptionFraction: 0.3, disruptionMinNodes: 3, disruptionMaxSeconds: 300,
               disruptionSettleSeconds: 15}
    service: {thresholdsGPUHours: [1, 100], preempt: true, minRunSeconds: 900,
              spareLargerGangs: true}   # thresholdsGPUHours [] : plain FIFO
    consolidation: {enabled: true, maxMovedGPUs: 32, minWaitSeconds: 3600}
    starvationSeconds: 300
    localityWaitSeconds: 86400     # Preferred topology: hold out this long for the smallest domain
    maxAdmissionsPerCycle: 10000
    maxPreemptionSearchesPerCycle: 16
    gpuModelLabel: nvidia.com/gpu.product
    extenderEnabled: true
    extenderBindAddress: 127.0.0.1
    extenderPort: 8888
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from gpuq.core.config import (
    Consolidation,
    FailoverConfig,
    SchedulerConfig,
    ScoringWeights,
    ServiceOrdering,
)
from gpuq.core.model import Topology

CONFIG_MAP_NAME = "gpuq-scheduler-config"
CONFIG_MAP_KEY = "config.yaml"

_DEFAULT = SchedulerConfig()


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which field and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class _Level(_Strict):
    name: str = Field(min_length=1)
    label: str = Field(min_length=1)


def _default_levels() -> list[_Level]:
    t = _DEFAULT.topology
    return [_Level(name=n, label=lbl) for n, lbl in zip(t.levels, t.labels, strict=True)]


class _Topology(_Strict):
    levels: list[_Level] = Field(default_factory=_default_levels, min_length=1)

    @field_validator("levels")
    @classmethod
    def _levels_are_usable(cls, levels: list[_Level]) -> list[_Level]:
        names = [lvl.name for lvl in levels]
        if len(set(names)) != len(names):
            raise ValueError(f"level names must be unique, got {names}")
        if names[-1] != "node":
            raise ValueError(f"the last (innermost) level must be 'node', got {names[-1]!r}")
        return levels


class _Weights(_Strict):
    node: float = Field(default=_DEFAULT.weights.node, ge=0)
    rack: float = Field(default=_DEFAULT.weights.rack, ge=0)
    block: float = Field(default=_DEFAULT.weights.block, ge=0)
    zone: float = Field(default=_DEFAULT.weights.zone, ge=0)


class _Failover(_Strict):
    not_ready_grace_seconds: float = Field(default=_DEFAULT.failover.not_ready_grace_seconds, ge=0)
    backoff_base_seconds: float = Field(default=_DEFAULT.failover.backoff_base_seconds, ge=0)
    backoff_max_seconds: float = Field(default=_DEFAULT.failover.backoff_max_seconds, ge=0)
    node_flap_window_seconds: float = Field(default=_DEFAULT.failover.node_flap_window_seconds, ge=0)
    node_flap_threshold: int = Field(default=_DEFAULT.failover.node_flap_threshold, ge=1)
    disruption_fraction: float = Field(default=_DEFAULT.failover.disruption_fraction, ge=0, le=1)
    disruption_min_nodes: int = Field(default=_DEFAULT.failover.disruption_min_nodes, ge=1)
    disruption_max_seconds: float = Field(default=_DEFAULT.failover.disruption_max_seconds, ge=0)
    disruption_settle_seconds: float = Field(default=_DEFAULT.failover.disruption_settle_seconds, ge=0)


class _Service(_Strict):
    thresholds_gpu_hours: list[float] = Field(
        default_factory=lambda: list(_DEFAULT.service.thresholds_gpu_hours), alias="thresholdsGPUHours"
    )
    preempt: bool = Field(default=_DEFAULT.service.preempt)
    min_run_seconds: float = Field(default=_DEFAULT.service.min_run_seconds, ge=0)
    spare_larger_gangs: bool = Field(default=_DEFAULT.service.spare_larger_gangs)

    @field_validator("thresholds_gpu_hours")
    @classmethod
    def _ascending_and_positive(cls, thresholds: list[float]) -> list[float]:
        if any(t <= 0 for t in thresholds) or thresholds != sorted(set(thresholds)):
            raise ValueError(f"thresholds must be positive and strictly ascending, got {thresholds}")
        return thresholds


class _Consolidation(_Strict):
    enabled: bool = Field(default=_DEFAULT.consolidation.enabled)
    max_moved_gpus: int = Field(default=_DEFAULT.consolidation.max_moved_gpus, ge=0, alias="maxMovedGPUs")
    min_wait_seconds: float = Field(default=_DEFAULT.consolidation.min_wait_seconds, ge=0)


class _Config(_Strict):
    topology: _Topology = Field(default_factory=_Topology)
    weights: _Weights = Field(default_factory=_Weights)
    failover: _Failover = Field(default_factory=_Failover)
    service: _Service = Field(default_factory=_Service)
    consolidation: _Consolidation = Field(default_factory=_Consolidation)
    starvation_seconds: float = Field(default=_DEFAULT.starvation_seconds, ge=0)
    locality_wait_seconds: float = Field(default=_DEFAULT.locality_wait_seconds, ge=0)
    max_admissions_per_cycle: int = Field(default=_DEFAULT.max_admissions_per_cycle, ge=1)
    max_preemption_searches_per_cycle: int = Field(default=_DEFAULT.max_preemption_searches_per_cycle, ge=1)
    gpu_model_label: str = Field(default=_DEFAULT.gpu_model_label, min_length=1)
    extender_enabled: bool = Field(default=_DEFAULT.extender_enabled)
    extender_bind_address: str = Field(default=_DEFAULT.extender_bind_address, min_length=1)
    extender_port: int = Field(default=_DEFAULT.extender_port, ge=1, le=65535)

    def to_core(self) -> SchedulerConfig:
        levels = self.topology.levels
        return SchedulerConfig(
            topology=Topology(
                levels=tuple(lvl.name for lvl in levels), labels=tuple(lvl.label for lvl in levels)
            ),
            weights=ScoringWeights(**self.weights.model_dump()),
            failover=FailoverConfig(**self.failover.model_dump()),
            service=ServiceOrdering(
                tuple(self.service.thresholds_gpu_hours),
                self.service.preempt,
                self.service.min_run_seconds,
                self.service.spare_larger_gangs,
            ),
            consolidation=Consolidation(**self.consolidation.model_dump()),
            starvation_seconds=self.starvation_seconds,
            locality_wait_seconds=self.locality_wait_seconds,
            max_admissions_per_cycle=self.max_admissions_per_cycle,
            max_preemption_searches_per_cycle=self.max_preemption_searches_per_cycle,
            gpu_model_label=self.gpu_model_label,
            extender_enabled=self.extender_enabled,
            extender_bind_address=self.extender_bind_address,
            extender_port=self.extender_port,
        )


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"invalid scheduler config ({source}):"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "<root>"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def config_from_mapping(data: Mapping[str, Any] | None, source: str = "<mapping>") -> SchedulerConfig:
    """Validate an already-parsed config document; None or {} gives the defaults."""
    try:
        return _Config.model_validate(dict(data or {})).to_core()
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def parse_config(text: str, source: str = "<text>") -> SchedulerConfig:
    """Parse `config.yaml` text; an empty document gives the defaults."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid scheduler config ({source}): not YAML: {exc}") from None
    if data is not None and not isinstance(data, Mapping):
        kind = type(data).__name__
        raise ConfigError(f"invalid scheduler config ({source}): expected a mapping, got {kind}")
    return config_from_mapping(data, source)


def load_config(path: str | Path | None) -> SchedulerConfig:
    """Read a config file (e.g. the mounted ConfigMap); None gives the defaults."""
    if path is None:
        return SchedulerConfig()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read scheduler config {p}: {exc.strerror}") from None
    return parse_config(text, str(p))


def config_from_config_map(data: Mapping[str, str] | None, name: str = CONFIG_MAP_NAME) -> SchedulerConfig:
    """Read the `config.yaml` key of a ConfigMap's data; a missing key gives the defaults."""
    text = (data or {}).get(CONFIG_MAP_KEY)
    if text is None:
        return SchedulerConfig()
    return parse_config(text, f"ConfigMap {name} key {CONFIG_MAP_KEY}")
