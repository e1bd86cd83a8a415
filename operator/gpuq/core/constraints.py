"""Pod-level placement constraints: what kube-scheduler would refuse, gpuq refuses too.

Hard filters (a node either passes or not): schedulable health, nodeSelector, required node affinity
(terms ORed, expressions ANDed; In/NotIn/Exists/DoesNotExist/Gt/Lt), NoSchedule/NoExecute taints without
a matching toleration, and the GPU model list. Soft preferences (a node score): preferred node affinity
weights, minus a penalty per untolerated PreferNoSchedule taint.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping

from gpuq.core.model import (
    Constraints,
    Health,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Taint,
    TaintEffect,
    Toleration,
)

# Score penalty of one untolerated PreferNoSchedule taint: larger than any preferred-affinity weight
# (Kubernetes caps those at 100), so avoiding such a taint outranks an affinity preference.
PREFER_NO_SCHEDULE_PENALTY = 101
OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
# matchFields: Kubernetes supports exactly one node field, with In/NotIn.
NODE_FIELDS = frozenset({"metadata.name"})
FIELD_OPERATORS = frozenset({"In", "NotIn"})
_INTEGER = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.ParseInt accepts (Python's int() takes "1_0")
HARD_EFFECTS = (TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE)

# Names of the hard filters, in the order they are applied (used to name the binding one).
F_SELECTOR = "nodeSelector"
F_AFFINITY = "required node affinity"
F_TAINTS = "taints"
F_MODELS = "gpuModels"
FILTERS = (F_SELECTOR, F_AFFINITY, F_TAINTS, F_MODELS)


def node_model(node: Node, label: str) -> str | None:
    """The node's GPU product: the explicit field, else the configured label."""
    return node.gpu_model if node.gpu_model is not None else node.labels.get(label)


def is_schedulable(node: Node) -> bool:
    """New work may land here: healthy, not cordoned, Ready, not damped for flapping."""
    return node.health is Health.HEALTHY and node.not_ready_since is None and not node.flapping


def tolerates(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    for t in tolerations:
        if t.effect is not None and t.effect != taint.effect:
            continue
        if t.operator == "Exists":
            if t.key == "" or t.key == taint.key:
                return True
        elif t.key == taint.key and t.value == taint.value:
            return True
    return False


def untolerated(
    node: Node, tolerations: tuple[Toleration, ...], effects: tuple[TaintEffect, ...]
) -> list[Taint]:
    return [t for t in node.taints if t.effect in effects and not tolerates(tolerations, t)]


def _as_int(value: str) -> int | None:
    return int(value) if _INTEGER.fullmatch(value) else None


def requirement_holds(labels: Mapping[str, str], req: NodeSelectorRequirement) -> bool:
    op = req.operator
    present = req.key in labels
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op == "In":
        return present and labels[req.key] in req.values
    if op == "NotIn":
        return not present or labels[req.key] not in req.values
    if op in ("Gt", "Lt"):
        if not present or len(req.values) != 1:
            return False
        have, want = _as_int(labels[req.key]), _as_int(req.values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    return False


def term_holds(node: Node, term: NodeSelectorTerm) -> bool:
    """Every expression holds on the node's labels and every field requirement on its fields; an empty
    term selects nothing (as in Kubernetes, where it is skipped)."""
    if not term.match_expressions and not term.match_fields:
        return False
    if not all(requirement_holds(node.labels, r) for r in term.match_expressions):
        return False
    return all(requirement_holds({"metadata.name": node.name}, r) for r in term.match_fields)


def first_failed_filter(node: Node, c: Constraints, model_label: str) -> str | None:
    """Name of the first hard filter the node fails for these constraints, or None if it passes."""
    labels = node.labels
    for key, value in c.node_selector.items():
        if labels.get(key) != value:
            return F_SELECTOR
    if c.required_terms and not any(term_holds(node, t) for t in c.required_terms):
        return F_AFFINITY
    if untolerated(node, c.tolerations, HARD_EFFECTS):
        return F_TAINTS
    if c.gpu_models and node_model(node, model_label) not in c.gpu_models:
        return F_MODELS
    return None


def preference_score(node: Node, c: Constraints) -> int:
    """Higher is better: matched preferred-affinity weights minus PreferNoSchedule penalties."""
    score = sum(p.weight for p in c.preferred_terms if term_holds(node, p.term))
    bad = untolerated(node, c.tolerations, (TaintEffect.PREFER_NO_SCHEDULE,))
    return score - PREFER_NO_SCHEDULE_PENALTY * len(bad)


def constraints_key(c: Constraints) -> Hashable:
    """A hashable signature: jobs with equal signatures have equal eligible node sets and scores."""
    return (
        tuple(sorted(c.node_selector.items())),
        c.required_terms,
        c.preferred_terms,
        c.tolerations,
        tuple(sorted(c.gpu_models)),
    )


def invalid_constraints(c: Constraints) -> str | None:
    """A human message if the constraints are malformed, else None."""
    for term in (*c.required_terms, *(p.term for p in c.preferred_terms)):
        for r in term.match_expressions:
            if r.operator not in OPERATORS:
                return f"node affinity operator {r.operator!r} is not one of {sorted(OPERATORS)}"
            if r.operator in ("Gt", "Lt") and (len(r.values) != 1 or _as_int(r.values[0]) is None):
                return f"node affinity {r.operator} on {r.key!r} needs exactly one integer value"
            if r.operator in ("In", "NotIn") and not r.values:
                return f"node affinity {r.operator} on {r.key!r} needs at least one value"
            if r.operator in ("Exists", "DoesNotExist") and r.values:
                return f"node affinity {r.operator} on {r.key!r} takes no values"
        for r in term.match_fields:
            if r.key not in NODE_FIELDS or r.operator not in FIELD_OPERATORS or len(r.values) != 1:
                return (
                    f"node affinity matchFields supports only metadata.name with In/NotIn and one value "
                    f"(got {r.key!r} {r.operator} {list(r.values)})"
                )
    for t in c.tolerations:
        if t.operator not in ("Equal", "Exists"):
            return f"toleration operator {t.operator!r} is not Equal or Exists"
        if t.operator == "Exists" and t.value:
            return f"toleration of {t.key!r} with operator Exists must not have a value"
        if not t.key and t.operator != "Exists":
            return "a toleration with an empty key must use operator Exists"
    return None


def describe(c: Constraints) -> str:
    """Short human description of what the constraints ask for (for pending reasons)."""
    parts = []
    if c.gpu_models:
        parts.append(f"gpuModels [{', '.join(c.gpu_models)}]")
    if c.node_selector:
        parts.append(f"nodeSelector {selector_text(c)}")
    if c.required_terms:
        parts.append("required node affinity")
    if c.tolerations:
        parts.append(f"tolerating {', '.join(sorted({toleration_text(t) for t in c.tolerations}))}")
    return ", ".join(parts)


def selector_text(c: Constraints) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(c.node_selector.items())) + "}"


def toleration_text(t: Toleration) -> str:
    """kubectl-like form: "dedicated=team-x", "dedicated:NoSchedule", "*" (tolerates everything)."""
    text = t.key or "*"
    if t.operator == "Equal" and t.value:
        text += f"={t.value}"
    return text + (f":{t.effect}" if t.effect is not None else "")


def taint_text(t: Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
