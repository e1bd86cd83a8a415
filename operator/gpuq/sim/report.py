"""Presenting results: the metric rows (shared by the CLI table and the benchmark), a rich table,
JSON, and ratios of one policy to another."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HOUR = 3600.0
# Keys of a run's summary that are raw series, left out of the JSON report (plots use them).
SERIES_KEYS = ("timeline", "jct_samples", "outcomes")


@dataclass(frozen=True, slots=True)
class Metric:
    label: str
    get: Callable[[dict[str, Any]], float]
    lower_is_better: bool
    fmt: str = "{:.2f}"


def _pct(path: tuple[str, ...]) -> Callable[[dict[str, Any]], float]:
    def get(r: dict[str, Any]) -> float:
        value: Any = r
        for key in path:
            value = value[key]
        return 100.0 * float(value)

    return get


METRICS: tuple[Metric, ...] = (
    Metric("avg JCT (h)", lambda r: r["jct"]["avg"] / HOUR, True),
    Metric("p50 JCT (h)", lambda r: r["jct"]["p50"] / HOUR, True),
    Metric("p99 JCT (h)", lambda r: r["jct"]["p99"] / HOUR, True),
    Metric("avg queueing delay (h)", lambda r: r["queueing_delay"]["avg"] / HOUR, True),
    Metric("p50 queueing delay (h)", lambda r: r["queueing_delay"]["p50"] / HOUR, True),
    Metric("p99 queueing delay (h)", lambda r: r["queueing_delay"]["p99"] / HOUR, True),
    Metric("avg JCT - run time (h)", lambda r: r["jct_minus_run"]["avg"] / HOUR, True),
    Metric("makespan (days)", lambda r: r["makespan"] / 86400.0, True),
    Metric("GPU allocation %", _pct(("gpu_allocation",)), False, "{:.1f}"),
    Metric("GPU busy (running gangs) %", _pct(("gpu_busy",)), False, "{:.1f}"),
    Metric("fragmentation % of GPUs", _pct(("fragmentation",)), True),
    Metric("multi-GPU pairs cross-node %", _pct(("comm_multi_gpu", "cross_node")), True, "{:.1f}"),
    Metric("multi-GPU pairs cross-rack %", _pct(("comm_multi_gpu", "cross_rack")), True, "{:.1f}"),
    Metric("multi-GPU pairs cross-block %", _pct(("comm_multi_gpu", "cross_block")), True, "{:.1f}"),
    Metric("multi-GPU comm cost per pair", lambda r: r["comm_multi_gpu"]["cost_per_pair"], True, "{:.3f}"),
    Metric("large-job pairs cross-node %", _pct(("comm_large", "cross_node")), True, "{:.1f}"),
    Metric("large-job comm cost per pair", lambda r: r["comm_large"]["cost_per_pair"], True, "{:.3f}"),
    Metric("preemptions", lambda r: float(r["preemptions"]), True, "{:.0f}"),
    Metric("restarts (failures)", lambda r: float(r["restarts"]), True, "{:.0f}"),
    Metric("lost GPU-hours", lambda r: r["lost_gpu_hours"], True, "{:.1f}"),
    Metric("restart/checkpoint GPU-hours", lambda r: r["overhead_gpu_hours"], True, "{:.1f}"),
    Metric("ETTR (productive / held GPU-time) %", _pct(("ettr",)), False, "{:.1f}"),
    Metric("useful ratio (full-speed work / held) %", _pct(("useful_ratio",)), False, "{:.1f}"),
    Metric("Jain fairness (queues)", lambda r: r["jain_fairness"], False, "{:.3f}"),
    Metric("unfinished jobs", lambda r: float(r["unfinished"]), True, "{:.0f}"),
)


def fmt(metric: Metric, value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else metric.fmt.format(value)


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs; NaN when the baseline is zero or undefined."""
    if theirs == 0 or math.isnan(theirs) or math.isnan(ours):
        return math.nan
    return ours / theirs


def results_table(results: Sequence[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    for r in results:
        table.add_column(f"{r['policy']}", justify="right")
    for metric in METRICS:
        table.add_row(metric.label, *(fmt(metric, metric.get(r)) for r in results))
    table.add_row("simulated in (s)", *(f"{r['sim']['wall_seconds']:.1f}" for r in results))
    return table


def per_queue_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"{result['policy']}: per queue")
    for column in (
        "queue",
        "jobs",
        "avg JCT (h)",
        "p99 JCT (h)",
        "avg delay (h)",
        "p50 delay (h)",
        "p99 delay (h)",
    ):
        table.add_column(column, justify="right")
    for queue, q in result["per_queue"].items():
        jct, delay = q["jct"], q["queueing_delay"]
        table.add_row(
            queue,
            str(q["jobs"]),
            *(f"{v / HOUR:.2f}" for v in (jct["avg"], jct["p99"], delay["avg"], delay["p50"], delay["p99"])),
        )
    return table


def print_results(results: Sequence[dict[str, Any]], title: str, per_queue: bool, console: Console) -> None:
    console.print(results_table(results, title))
    if per_queue:
        for r in results:
            console.print(per_queue_table(r))


def _clean(value: Any) -> Any:
    """JSON has no NaN: write null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in SERIES_KEYS}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def to_json(scenario: dict[str, Any], results: Sequence[dict[str, Any]]) -> str:
    return json.dumps({"scenario": _clean(scenario), "results": _clean(list(results))}, indent=2)


def write_json(path: str, text: str, console: Console) -> None:
    if path == "-":
        console.out(text, highlight=False)
    else:
        Path(path).write_text(text + "\n", encoding="utf-8")
