"""The CRDs in crds/ and the reference in docs/api.md are generated from gpuq.api and must not drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpuq.api import GPUQueueSpec, TrainingJobSpec, crd, reference

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_crds_match_the_models() -> None:
    assert crd.drifted(ROOT / "crds") == [], "run `gpuq crds --write crds/ --docs docs/api.md`"


def test_api_reference_matches_the_models() -> None:
    assert not reference.docs_drifted(ROOT / "docs" / "api.md"), "run `gpuq crds --docs docs/api.md`"


def test_drift_is_detected(tmp_path: Path) -> None:
    crd.write_all(tmp_path)
    assert crd.drifted(tmp_path) == []
    victim = tmp_path / crd.TRAINING_JOB.file_name
    victim.write_text(victim.read_text().replace("maximum: 4096", "maximum: 4097"))
    assert crd.drifted(tmp_path) == [crd.TRAINING_JOB.file_name]


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, value in node.items():
            out.extend(_walk(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_walk(value, f"{path}[{i}]"))
    return out


@pytest.mark.parametrize("kind", crd.KINDS, ids=lambda k: k.kind)
def test_schema_is_structural(kind: crd.Kind) -> None:
    """Kubernetes rejects $ref/anyOf/nullable unions and needs a type on every property."""
    schema = crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert not {"$ref", "anyOf", "allOf", "oneOf", "title", "$defs", "const"} & node.keys(), path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True, path
        for name, child in node.get("properties", {}).items():
            assert "type" in child, f"{path}.properties.{name} has no type"


def test_crd_names_scope_and_columns() -> None:
    tj = crd.crd(crd.TRAINING_JOB)
    assert tj["metadata"]["name"] == "trainingjobs.gpuq.dev"
    assert tj["spec"]["names"]["shortNames"] == ["tj"]
    assert tj["spec"]["names"]["categories"] == ["gpuq"]
    assert tj["spec"]["scope"] == "Namespaced"
    version = tj["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    cols = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    for name in ("Queue", "GPUs", "Priority", "Phase", "Position", "Age"):
        assert name in cols
    gq = crd.crd(crd.GPU_QUEUE)
    assert gq["spec"]["scope"] == "Cluster" and gq["spec"]["names"]["shortNames"] == ["gq"]


def test_defaults_reach_nested_objects() -> None:
    """Objects with defaulted fields default to {} so the API server fills the nested defaults."""
    spec = crd.structural_schema(TrainingJobSpec)["properties"]
    assert spec["topology"]["default"] == {"mode": "Preferred"}
    assert spec["topology"]["properties"]["mode"]["default"] == "Preferred"
    assert spec["checkpoint"]["properties"]["gracePeriodSeconds"]["default"] == 60
    assert spec["workers"]["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True


def test_issue7_fields_are_carried() -> None:
    workers = crd.structural_schema(TrainingJobSpec)["properties"]["workers"]["properties"]
    assert workers["gpuModels"]["items"]["type"] == "string"
    assert workers["mixedModels"]["default"] is False
    queue = crd.structural_schema(GPUQueueSpec)["properties"]
    assert queue["modelQuotas"]["additionalProperties"]["type"] == "integer"
    assert {"nominalGPUs", "borrowingLimitGPUs", "lendingLimitGPUs"} <= queue.keys()


def test_printed_yaml_is_one_document_per_crd() -> None:
    docs = [d for d in yaml.safe_load_all("---\n".join(crd.render_all().values())) if d]
    assert [d["metadata"]["name"] for d in docs] == ["trainingjobs.gpuq.dev", "gpuqueues.gpuq.dev"]


def test_models_apply_the_same_bounds_and_defaults() -> None:
    spec = TrainingJobSpec.model_validate({"queue": "team-a", "workers": {"replicas": 2, "gpusPerWorker": 8}})
    assert spec.priority == 0 and spec.preemptible and spec.max_restarts == 3
    assert spec.topology.mode == "Preferred" and spec.checkpoint.grace_period_seconds == 60
    with pytest.raises(ValidationError):
        TrainingJobSpec.model_validate({"queue": "team-a", "workers": {"replicas": 0, "gpusPerWorker": 8}})
    with pytest.raises(ValidationError):
        TrainingJobSpec.model_validate({"queue": "Team A", "workers": {"replicas": 1, "gpusPerWorker": 8}})
    q = GPUQueueSpec.model_validate({"nominalGPUs": 16, "cohort": "research"})
    assert q.nominal_gpus == 16 and q.weight == 1.0 and q.queueing_strategy == "BestEffortFIFO"
    assert q.wire() == {"nominalGPUs": 16, "cohort": "research"}


def test_object_defaults_equal_the_model_defaults() -> None:
    """The API server validates a default as written (nested defaults are not applied to it)."""
    from gpuq.api.trainingjob import CheckpointSpec, TopologySpec

    spec = crd.structural_schema(TrainingJobSpec)["properties"]
    for name, model in (("topology", TopologySpec), ("checkpoint", CheckpointSpec)):
        assert spec[name]["default"] == model().model_dump(by_alias=True, exclude_none=True, mode="json")
