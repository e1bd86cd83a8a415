"""Render a few panels of deploy/grafana/gpuq-dashboard.json from a live Prometheus to one PNG
(matplotlib, as Grafana would draw them: the same queries, legends and units), for docs/img/.
Used by e2e/test_observability.py when GPUQ_DASHBOARD_PNG names a directory."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuq.observability import to_promql

PANELS = (
    "GPUs used vs nominal quota",
    "Pending jobs by reason",
    "Admission wait time",
    "Preemptions by reason",
    "Failover recovery time",
    "Scheduling cycle duration",
)
# The plot's time range and its points: the workload's last minutes, one point every 2 s. Rates
# over a short window follow the events closely (Grafana's $__rate_interval at this step).
SPAN_SECONDS, STEP = 6 * 60, "2s"
WINDOW = "30s"

Api = Callable[..., Any]


def _legend(fmt: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def _series(
    api: Api, target: Mapping[str, Any], start: float, end: float
) -> list[tuple[str, list[float], list[float]]]:
    data = api("query_range", query=to_promql(target["expr"], WINDOW, f"{SPAN_SECONDS}s"),
               start=str(start), end=str(end), step=STEP)  # fmt: skip
    out = []
    for s in data["result"]:
        xs = [float(t) - end for t, _ in s["values"]]
        ys = [float(v) for _, v in s["values"]]
        out.append((_legend(target.get("legendFormat", ""), s["metric"]), xs, ys))
    return out


def render_panels(api: Api, dashboard: Mapping[str, Any], directory: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {p["title"]: p for p in dashboard["panels"] if p.get("type") == "timeseries"}
    end = time.time()
    fig, axes = plt.subplots(2, 3, figsize=(16, 8), constrained_layout=True)
    for ax, title in zip(axes.flat, PANELS, strict=True):
        panel = panels[title]
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        for target in panel["targets"]:
            for legend, xs, ys in _series(api, target, end - SPAN_SECONDS, end):
                dashed = legend.endswith("nominal")
                ax.plot(xs, ys, label=legend, linestyle="--" if dashed else "-", linewidth=1.4)
        ax.set_title(title, fontsize=11, loc="left")
        ax.set_xlabel("seconds before now", fontsize=8)
        ax.set_ylabel({"s": "seconds", "short": ""}.get(unit, unit), fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "gpuq dashboard panels (deploy/grafana/gpuq-dashboard.json) on a real Prometheus", fontsize=12
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "gpuq-dashboard.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
