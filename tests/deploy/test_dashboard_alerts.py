"""deploy/: the Grafana dashboard and the Prometheus alert rules use only metrics (and labels) the
operator registers, and are well formed. e2e/test_observability.py evaluates them for real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuq.controller.metrics import Metrics, PendingJob, QueueFigures
from gpuq.observability import (
    alert_queries,
    dashboard_queries,
    dashboard_variables,
    label_names,
    metric_names,
    to_promql,
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuq-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "gpuq-alerts.yaml"


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def alerts() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return loaded


def served_labels() -> dict[str, set[str]]:
    """Sample name -> its label names, from a registry that has seen one queue and one pending job."""
    m = Metrics()
    m.publish_cycle({"q": QueueFigures("c", 8, 8, 0, 1)}, [PendingJob("q", "QuotaExceeded", 0.0)])
    m.api_answer("get", 200)
    m.events_dropped.labels("Admitted").inc()
    out: dict[str, set[str]] = {}
    for family in m.registry.collect():
        for s in family.samples:
            out.setdefault(s.name, set()).update(set(s.labels) - {"le"})
    return out


QUERIES = [*dashboard_queries(dashboard()), *alert_queries(alerts())]


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.source)
def test_each_expression_selects_only_metrics_the_operator_serves(query: Any) -> None:
    names = metric_names(query.expr)
    assert names, f"{query.source}: no metric in {query.expr!r}"
    assert names <= Metrics().names(), f"{query.source}: unknown {sorted(names - Metrics().names())}"
    assert "$" not in to_promql(query.expr)


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.source)
def test_each_expression_uses_labels_its_metrics_have(query: Any) -> None:
    labels = served_labels()
    known = {"le", "instance", "job"}.union(*(labels[name] for name in metric_names(query.expr)))
    assert label_names(query.expr) <= known, f"{query.source}: {sorted(label_names(query.expr) - known)}"


def test_every_metric_is_on_the_dashboard_or_in_an_alert() -> None:
    """A metric nobody looks at is either missing from the dashboard or should not exist."""
    used = {name for q in QUERIES for name in metric_names(q.expr)}
    families = {f.name for f in Metrics().registry.collect()}
    unused = {f for f in families if not any(n == f or n.startswith(f + "_") for n in used)}
    # Exposed for ad-hoc queries and the docs' examples; a panel of them would say little.
    assert unused <= {"gpuq_events_dropped"}, sorted(unused)


def test_template_variables_read_a_served_label() -> None:
    labels = served_labels()
    variables = dashboard_variables(dashboard())
    assert [v.name for v in variables] == ["queue"]
    for v in variables:
        assert v.label in labels[v.metric]


def test_panels_are_laid_out_and_use_the_datasource_variable() -> None:
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
    assert {"datasource", "queue"} == {v["name"] for v in d["templating"]["list"]}


def test_alert_rules_are_complete_and_uniquely_named() -> None:
    rules = [r for g in alerts()["groups"] for r in g["rules"]]
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    assert {"GpuqJobPendingTooLong", "GpuqFailoverStorm", "GpuqNoLeader", "GpuqApiServerErrors"} <= set(names)
    for r in rules:
        assert r["labels"]["severity"] in {"info", "warning", "critical"}, r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert r["for"][-1] in "sm", r["alert"]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (queue, reason) (gpuq_pending_jobs{queue=~"a|b"})', {"gpuq_pending_jobs"}),
        (
            "histogram_quantile(0.99, sum by (le) (rate(gpuq_cycle_seconds_bucket[5m])))",
            {"gpuq_cycle_seconds_bucket"},
        ),
        ("time() - min by (queue) (x_timestamp_seconds) > 1e3", {"x_timestamp_seconds"}),
        ('sum(rate(a_total{code=~"5.."}[5m] offset 1h)) / on() group_left sum(b)', {"a_total", "b"}),
        ("absent(up) or vector(0)", {"up"}),
        ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
        ("sum(c) without (instance) and bool d", {"c", "d"}),
    ],
)
def test_metric_names_finds_the_selected_series(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_label_names_reads_matchers_and_groupings() -> None:
    expr = 'sum by (queue, le) (rate(x{code!~"2..", verb="get"}[5m])) / on(instance) group_left y'
    assert label_names(expr) == {"queue", "le", "code", "verb", "instance"}


def test_a_misspelt_metric_is_caught() -> None:
    typo = "histogram_quantile(0.9, sum by (le) (rate(gpuq_admission_wait_seconds_bucket[5m])))"
    assert metric_names(typo) - Metrics().names() == {"gpuq_admission_wait_seconds_bucket"}


def test_grafana_variables_become_promql() -> None:
    expr = 'sum(rate(x{queue=~"$queue", ns=~"${ns:regex}"}[$__rate_interval])) + sum(increase(y[$__range]))'
    assert to_promql(expr, "2m", "1h") == 'sum(rate(x{queue=~".*", ns=~".*"}[2m])) + sum(increase(y[1h]))'
