"""The Grafana dashboard and Prometheus alert rules of deploy/, read as the PromQL they hold: for
the tests that check every expression against the metrics the operator registers
(tests/deploy/test_observability.py) and evaluate it in a real Prometheus (e2e/test_observability.py).

The dashboard uses Grafana's variables ($__rate_interval, $queue); `to_promql` replaces them with
what Grafana would send, so Prometheus can evaluate the expression as it is in the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# PromQL words that look like metric names but are not (operators, modifiers, literals).
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left"}
    | {"group_right", "inf", "nan", "atan2", "start", "end"}
)
_STRING = re.compile(r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|`[^`]*`")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*([A-Za-z_]\w*)\s*\)\s*$")
# Grafana's built-in interval variables, and a template variable ($name or ${name} or ${name:fmt}).
_GRAFANA_INTERVALS = ("$__rate_interval", "$__interval", "$__range")
_TEMPLATE_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression and where it comes from (panel title and refId, or alert name)."""

    source: str
    expr: str


@dataclass(frozen=True, slots=True)
class Variable:
    """A dashboard template variable filled from `label_values(metric, label)`."""

    name: str
    metric: str
    label: str


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, aggregations,
    keywords, label names (inside {...} or by/without/on/ignoring (...)) or durations."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        if word.lower() in _KEYWORDS or text[m.end() :].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def label_names(expr: str) -> set[str]:
    """The label names an expression matches on or groups by ({name=...}, by/without (...))."""
    text = _STRING.sub('""', expr)
    names = {m.group(1) for body in _MATCHERS.findall(text) for m in _MATCHER.finditer(body)}
    for clause in _GROUPING.findall(text):
        inside = clause[clause.index("(") + 1 : -1]
        names |= {w.strip() for w in inside.split(",") if w.strip()}
    return names


def _panels(panels: list[Any]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every target expression of every panel (rows included)."""
    out = []
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append(Query(f"{panel.get('title', '?')} [{target.get('refId', '?')}]", target["expr"]))
    return out


def dashboard_variables(dashboard: Mapping[str, Any]) -> list[Variable]:
    """The template variables filled by `label_values(metric, label)` (others are not PromQL)."""
    out = []
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, Mapping) else str(query or "")
        m = _LABEL_VALUES.match(text)
        if var.get("type") == "query" and m:
            out.append(Variable(var["name"], m.group(1), m.group(2)))
    return out


def alert_queries(rules: Mapping[str, Any]) -> list[Query]:
    """Every rule expression of a Prometheus rule file (`groups:`), alerts and recording rules."""
    return [
        Query(f"{group['name']}/{rule.get('alert') or rule.get('record')}", rule["expr"])
        for group in rules.get("groups", [])
        for rule in group.get("rules", [])
    ]


def to_promql(expr: str, window: str = "5m", range_: str = "1h") -> str:
    """The expression as Grafana sends it: $__rate_interval and $__interval become `window`, $__range
    `range_`, and a template variable (all values selected) the regex `.*`."""
    for name in _GRAFANA_INTERVALS:
        expr = expr.replace(name, range_ if name == "$__range" else window)
    return _TEMPLATE_VAR.sub(".*", expr)
