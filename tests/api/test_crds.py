"""The CRDs in crds/ and the reference in docs/api.md are generated from gpuq.api and must not drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpuq.api import GPUQueueSpec, TrainingJobSpec, crd, meta, reference

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
        forbidden = {"$ref", "anyOf", "allOf", "oneOf", "title", "$defs", "const", "propertyNames"}
        assert not (forbidden | {"patternProperties"}) & node.keys(), path
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
    assert [d["metadata"]["name"] for d in docs] == [
        "trainingjobs.gpuq.dev",
        "gpuqueues.gpuq.dev",
        "gangs.gpuq.dev",
    ]


TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "train:1"}]}}


def test_models_apply_the_same_bounds_and_defaults() -> None:
    spec = TrainingJobSpec.model_validate(
        {"queue": "team-a", "workers": {"replicas": 2, "gpusPerWorker": 8, "template": TEMPLATE}}
    )
    assert spec.priority == 0 and spec.preemptible and spec.max_restarts == 3
    assert spec.topology.mode == "Preferred" and spec.checkpoint.grace_period_seconds == 60
    with pytest.raises(ValidationError):
        TrainingJobSpec.model_validate(
            {"queue": "team-a", "workers": {"replicas": 0, "gpusPerWorker": 8, "template": TEMPLATE}}
        )
    with pytest.raises(ValidationError):
        TrainingJobSpec.model_validate(
            {"queue": "Team A", "workers": {"replicas": 1, "gpusPerWorker": 8, "template": TEMPLATE}}
        )
    q = GPUQueueSpec.model_validate({"nominalGPUs": 16, "cohort": "research"})
    assert q.nominal_gpus == 16 and q.weight == 1.0 and q.queueing_strategy == "BestEffortFIFO"
    assert q.wire() == {"nominalGPUs": 16, "cohort": "research"}


def test_object_defaults_equal_the_model_defaults() -> None:
    """The API server validates a default as written (nested defaults are not applied to it)."""
    from gpuq.api.trainingjob import CheckpointSpec, TopologySpec

    spec = crd.structural_schema(TrainingJobSpec)["properties"]
    for name, model in (("topology", TopologySpec), ("checkpoint", CheckpointSpec)):
        assert spec[name]["default"] == model().model_dump(by_alias=True, exclude_none=True, mode="json")


# -- what the schema refuses that it used to accept (issue 33) ----------------------------------


def queue_spec(**spec: object) -> dict[str, object]:
    return {"nominalGPUs": 8, **spec}


@pytest.mark.parametrize(
    "spec",
    [
        queue_spec(namespaceSelector={"matchLabels": {"bad key!": "x"}}),
        queue_spec(namespaceSelector={"matchLabels": {"team": "x y"}}),
        queue_spec(namespaceSelector={"matchExpressions": [{"key": "bad key!", "operator": "Exists"}]}),
        queue_spec(
            namespaceSelector={"matchExpressions": [{"key": "t", "operator": "In", "values": ["x y"]}]}
        ),
        queue_spec(modelQuotas={"": 4}),
        queue_spec(modelQuotas={"NVIDIA H100": 4}),
        queue_spec(modelQuotas={"NVIDIA-H100-80GB-HBM3": -1}),
    ],
)
def test_a_queue_with_an_impossible_selector_or_model_is_refused(spec: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        GPUQueueSpec.model_validate(spec)


def test_label_keys_and_values_as_kubernetes_takes_them() -> None:
    ok = {"team": "a", "example.com/team": "", "a.b-c_d": "x.Y-z_0", "k8s.io/x": "y" * 63}
    spec = GPUQueueSpec.model_validate(queue_spec(namespaceSelector={"matchLabels": ok}))
    assert spec.namespace_selector is not None and spec.namespace_selector.match_labels == ok
    for bad in ("-team", "team-", "Example.com/team", "a/b/c", "x" * 64, "example.com/"):
        with pytest.raises(ValidationError):
            GPUQueueSpec.model_validate(queue_spec(namespaceSelector={"matchLabels": {bad: "v"}}))


def test_map_keys_are_checked_by_a_cel_rule_that_names_the_key() -> None:
    """A structural schema has no propertyNames: the key pattern becomes a CEL rule on the map."""
    spec = crd.structural_schema(GPUQueueSpec)["properties"]
    selector = spec["namespaceSelector"]["properties"]["matchLabels"]
    assert selector["additionalProperties"]["pattern"] == meta.LABEL_VALUE_PATTERN
    (rule,) = selector["x-kubernetes-validations"]
    assert meta.LABEL_KEY_PATTERN in rule["rule"] and rule["rule"].startswith("self.all(k, ")
    assert "self.filter(k, " in rule["messageExpression"] and "label key" in rule["message"]
    quotas = spec["modelQuotas"]
    assert quotas["additionalProperties"] == {"type": "integer", "minimum": 0, "maximum": 10_000_000}
    (rule,) = quotas["x-kubernetes-validations"]
    assert "size(k) >= 1" in rule["rule"] and "GPU model" in rule["message"]


def test_a_training_job_needs_a_template_with_a_container() -> None:
    workers = {"replicas": 1, "gpusPerWorker": 8}
    with pytest.raises(ValidationError, match=r"workers\.template"):
        TrainingJobSpec.model_validate({"queue": "q", "workers": workers})
    schema = crd.structural_schema(TrainingJobSpec)["properties"]["workers"]
    assert "template" in schema["required"]
    template = schema["properties"]["template"]
    assert template["required"] == ["spec"] and template["x-kubernetes-preserve-unknown-fields"] is True
    pod = template["properties"]["spec"]
    assert pod["required"] == ["containers"] and pod["properties"]["containers"]["minItems"] == 1
    assert pod["properties"]["containers"]["items"]["required"] == ["name", "image"]
    assert pod["properties"]["restartPolicy"]["enum"] == ["Never", "OnFailure"]
    assert pod["x-kubernetes-validations"][0]["rule"] == "!has(self.nodeName)"
    # The template stays as written in Python (pods are rendered from it).
    spec = TrainingJobSpec.model_validate({"queue": "q", "workers": {**workers, "template": TEMPLATE}})
    assert spec.workers.template == TEMPLATE


@pytest.mark.parametrize("kind", crd.KINDS, ids=lambda k: k.kind)
def test_root_rules_name_their_field(kind: crd.Kind) -> None:
    """A rule at the root without fieldPath is reported as `<nil>: Invalid value` by the API server."""
    root = crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for rule in root.get("x-kubernetes-validations", []):
        assert rule.get("fieldPath"), rule
        assert rule["fieldPath"].lstrip(".").split(".")[0] in root["properties"], rule
    assert "name" in root["properties"]["metadata"]["properties"]
