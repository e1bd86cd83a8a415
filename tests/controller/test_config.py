"""gpuq.config: YAML -> SchedulerConfig, defaults everywhere, clear errors on bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.config import ConfigError, config_from_config_map, load_config, parse_config
from gpuq.core.config import SchedulerConfig


def test_empty_document_gives_defaults() -> None:
    assert parse_config("") == SchedulerConfig()
    assert load_config(None) == SchedulerConfig()
    assert config_from_config_map({}) == SchedulerConfig()


def test_partial_config_overrides_only_what_it_names() -> None:
    cfg = parse_config(
        """
        failover: {notReadyGraceSeconds: 3}
        topology:
          levels:
            - {name: rack, label: example.com/rack}
            - {name: node, label: kubernetes.io/hostname}
        gpuModelLabel: example.com/gpu
        """
    )
    assert cfg.failover.not_ready_grace_seconds == 3
    assert cfg.failover.backoff_max_seconds == SchedulerConfig().failover.backoff_max_seconds
    assert cfg.topology.levels == ("rack", "node")
    assert cfg.topology.labels == ("example.com/rack", "kubernetes.io/hostname")
    assert cfg.gpu_model_label == "example.com/gpu"
    assert cfg.weights == SchedulerConfig().weights


def test_config_map_key_is_read(tmp_path: Path) -> None:
    assert config_from_config_map({"config.yaml": "starvationSeconds: 12"}).starvation_seconds == 12
    f = tmp_path / "config.yaml"
    f.write_text("maxAdmissionsPerCycle: 7\n")
    assert load_config(f).max_admissions_per_cycle == 7


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("failover: {notReadyGrace: 3}", "failover.notReadyGrace: Extra inputs are not permitted"),
        ("weights: {rack: -1}", "weights.rack"),
        ("extenderPort: 70000", "extenderPort"),
        ("service: {thresholdsGPUHours: [4, 1]}", "strictly ascending"),
        ("service: {minRunSeconds: -1}", "service.minRunSeconds"),
        ("localityWaitSeconds: -5", "localityWaitSeconds"),
        ("consolidation: {maxMovedGpus: 8}", "consolidation.maxMovedGpus: Extra inputs are not permitted"),
        ("consolidation: {maxMovedGPUs: -1}", "consolidation.maxMovedGPUs"),
        ("topology: {levels: [{name: rack, label: r}]}", "last (innermost) level must be 'node'"),
        ("topology: {levels: [{name: node, label: a}, {name: node, label: b}]}", "unique"),
        ("- 1", "expected a mapping"),
        ("a: [", "not YAML"),
    ],
)
def test_bad_config_names_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "test")
    assert fragment in str(err.value)
    assert "test" in str(err.value)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_every_scheduler_config_field_is_settable_from_config_yaml() -> None:
    """A field added to gpuq.core.config must be readable from the ConfigMap too (no silent drift).
    Fields derived from the others (init=False) are nobody's to set."""
    import dataclasses

    from gpuq.config import _Config, _Failover, _Service, _Weights
    from gpuq.core.config import FailoverConfig, SchedulerConfig, ScoringWeights, ServiceOrdering

    pairs = (
        (SchedulerConfig, _Config),
        (FailoverConfig, _Failover),
        (ScoringWeights, _Weights),
        (ServiceOrdering, _Service),
    )
    for core_cls, yaml_cls in pairs:
        settable = {f.name for f in dataclasses.fields(core_cls) if f.init}
        assert settable == set(yaml_cls.model_fields), core_cls.__name__


def test_preemption_search_budget_is_configurable() -> None:
    assert parse_config("maxPreemptionSearchesPerCycle: 3").max_preemption_searches_per_cycle == 3


def test_locality_wait_is_configurable_and_can_be_turned_off() -> None:
    assert parse_config("").locality_wait_seconds == SchedulerConfig().locality_wait_seconds == 86400
    assert parse_config("localityWaitSeconds: 0").locality_wait_seconds == 0
    assert parse_config("localityWaitSeconds: 1800").locality_wait_seconds == 1800


def test_attained_service_ordering_is_configurable_and_can_be_turned_off() -> None:
    cfg = parse_config("service: {thresholdsGPUHours: [0.5, 8], preempt: false, minRunSeconds: 60}")
    assert cfg.service.thresholds_gpu_hours == (0.5, 8.0) and not cfg.service.preempt
    assert cfg.service.thresholds_gpu_seconds == (1800.0, 28800.0)
    assert parse_config("service: {thresholdsGPUHours: []}").service.thresholds_gpu_hours == ()
    assert parse_config("").service.spare_larger_gangs
    assert not parse_config("service: {spareLargerGangs: false}").service.spare_larger_gangs


def test_consolidation_is_configurable_and_can_be_turned_off() -> None:
    cfg = parse_config("consolidation: {enabled: false, maxMovedGPUs: 8}")
    assert not cfg.consolidation.enabled and cfg.consolidation.max_moved_gpus == 8
    assert parse_config("").consolidation.enabled
