"""Label selector matching (GPUQueue.spec.namespaceSelector against a namespace's labels)."""

from __future__ import annotations

from collections.abc import Mapping

from gpuq.api.gpuqueue import LabelSelector, SelectorOperator


def matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes semantics: every matchLabels pair and expression must hold; no selector matches all."""
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for expr in selector.match_expressions:
        present = expr.key in labels
        if expr.operator == SelectorOperator.IN and not (present and labels[expr.key] in expr.values):
            return False
        if expr.operator == SelectorOperator.NOT_IN and present and labels[expr.key] in expr.values:
            return False
        if expr.operator == SelectorOperator.EXISTS and not present:
            return False
        if expr.operator == SelectorOperator.DOES_NOT_EXIST and present:
            return False
    return True


def describe(selector: LabelSelector) -> str:
    """Human form for messages, e.g. `team=a,env in (prod,dev)`."""
    parts = [f"{k}={v}" for k, v in selector.match_labels.items()]
    for e in selector.match_expressions:
        if e.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN):
            op = "in" if e.operator == SelectorOperator.IN else "notin"
            parts.append(f"{e.key} {op} ({','.join(e.values)})")
        else:
            parts.append(e.key if e.operator == SelectorOperator.EXISTS else f"!{e.key}")
    return ",".join(parts) or "<everything>"
