"""Every CEL rule of the CRDs' spec schemas is also the operator's own check.

The API server refuses what breaks a rule, but objects stored before the rule existed (an older
gpuq's CRDs; validation ratcheting keeps them on update) reach the operator anyway. It must refuse
them too, naming the field, rather than act on them: a selector `In []` that no namespace matches
gave its jobs the fix "label the namespace", which no label satisfies. A new rule without a case
below fails the first test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuq.api import crd
from gpuq.controller import bodies as b
from gpuq.controller.objects import parse_job, parse_queue
from gpuq.controller.pods import TemplateError, check_template

TEMPLATE = {"spec": {"containers": [{"name": "w", "image": "x"}]}}

# CEL rule message -> (kind, a spec that breaks only that rule, the field the operator names).
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "every key must be a label key": (
        "GPUQueue",
        {"nominalGPUs": 4, "namespaceSelector": {"matchLabels": {"bad key!": "x"}}},
        'spec.namespaceSelector.matchLabels["bad key!"] (key)',
    ),
    "In/NotIn need values": (
        "GPUQueue",
        {"nominalGPUs": 4, "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
        "spec.namespaceSelector.matchExpressions[0]",
    ),
    "every key must be a GPU model": (
        "GPUQueue", {"nominalGPUs": 4, "modelQuotas": {"": 4}}, 'spec.modelQuotas[""] (key)'
    ),
    "lendingLimitGPUs cannot exceed nominalGPUs": (
        "GPUQueue",
        {"nominalGPUs": 4, "cohort": "c", "lendingLimitGPUs": 8},
        "spec.lendingLimitGPUs",
    ),
    "borrowingLimitGPUs and lendingLimitGPUs need a cohort": (
        "GPUQueue",
        {"nominalGPUs": 4, "borrowingLimitGPUs": 2},
        "spec",
    ),
    "must not be set: gpuq places the workers": (
        "TrainingJob",
        {"queue": "q", "workers": {"replicas": 1, "gpusPerWorker": 1, "template": {
            "spec": {"containers": [{"name": "w", "image": "x"}], "nodeName": "n0"}}}},
        "spec.workers.template.spec",
    ),
    "mode Required needs a level": (
        "TrainingJob",
        {"queue": "q", "workers": {"replicas": 1, "gpusPerWorker": 1, "template": TEMPLATE},
         "topology": {"mode": "Required"}},
        "spec.topology",
    ),
}  # fmt: skip


def spec_rules(node: Any) -> Iterator[dict[str, str]]:
    """The x-kubernetes-validations entries anywhere below a schema node."""
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", ())
        for value in node.values():
            yield from spec_rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from spec_rules(value)


def rules_of(kind: crd.Kind) -> list[str]:
    schema = crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return [r["message"] for r in spec_rules(schema["properties"]["spec"])]


def operator_refusal(kind: str, spec: dict[str, Any]) -> str | None:
    """What the operator says of an object with this spec that the API server stored anyway."""
    if kind == "GPUQueue":
        return parse_queue(b.queue("q") | {"spec": spec}).error
    entry = parse_job(b.job("j") | {"spec": spec})
    if entry.error is not None or entry.spec is None:
        return entry.error
    try:
        check_template(entry.spec.workers.template)  # the worker template's shape (pods.py)
    except TemplateError as exc:
        return str(exc)
    return None


def test_every_spec_rule_has_a_case() -> None:
    for kind in crd.KINDS:
        for message in rules_of(kind):
            assert any(message.startswith(known) for known in CASES), f"{kind.kind}: no case for {message!r}"


@pytest.mark.parametrize("rule", CASES)
def test_the_operator_refuses_what_the_rule_refuses_naming_the_field(rule: str) -> None:
    kind, spec, path = CASES[rule]
    refusal = operator_refusal(kind, spec)
    assert refusal is not None, f"the operator accepts a {kind} that breaks {rule!r}"
    assert f"{path}: " in refusal, refusal
    assert "<nil>" not in refusal


def test_the_cases_are_valid_once_the_rule_holds() -> None:
    """Each case breaks only its rule: the same spec made to hold it is accepted (so the tests
    above fail for the rule, not for something else in the case)."""
    held = {
        "every key must be a label key": {"nominalGPUs": 4, "namespaceSelector": {"matchLabels": {"k": "x"}}},
        "In/NotIn need values": {
            "nominalGPUs": 4,
            "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["v"]}]},
        },
        "every key must be a GPU model": {"nominalGPUs": 4, "modelQuotas": {"L4": 4}},
        "lendingLimitGPUs cannot exceed nominalGPUs": {
            "nominalGPUs": 4,
            "cohort": "c",
            "lendingLimitGPUs": 4,
        },
        "borrowingLimitGPUs and lendingLimitGPUs need a cohort": {
            "nominalGPUs": 4,
            "cohort": "c",
            "borrowingLimitGPUs": 2,
        },
        "must not be set: gpuq places the workers": {
            "queue": "q",
            "workers": {"replicas": 1, "gpusPerWorker": 1, "template": TEMPLATE},
        },
        "mode Required needs a level": {
            "queue": "q",
            "workers": {"replicas": 1, "gpusPerWorker": 1, "template": TEMPLATE},
            "topology": {"mode": "Required", "level": "rack"},
        },
    }
    assert held.keys() == CASES.keys()
    for rule, spec in held.items():
        assert operator_refusal(CASES[rule][0], spec) is None, rule
