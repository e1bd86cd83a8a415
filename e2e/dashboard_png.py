"""Render a few panels of deploy/grafana/gpuq-dashboard.json from a live Prometheus to one PNG
(matplotlib, as Grafana would draw them: the same queries, legends and units), for docs/img/, after
a scripted four-minute scenario on the local cluster (`run_showcase`): three team queues, borrowing
in a cohort, a reclaim, a priority preemption, a node failure, jobs finishing and queued ones moving
in. Used by e2e/test_observability.py when GPUQ_DASHBOARD_PNG names a directory."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuq.observability import to_promql

SHOWCASE_QUEUES = {"research": {"nominal": 48, "cohort": "lab"}, "prod": {"nominal": 48, "cohort": "lab"},
                   "batch": {"nominal": 32}}  # fmt: skip
NO_CHECKPOINT = {"requestOnPreemption": False}  # victims go at once: the scenario stays short


def run_showcase(cluster: Any, gpuq: Any, ns: str) -> None:
    """About four minutes of a shared 128-GPU cluster (every job is 2 workers x 8 GPUs unless said)."""
    from gpuq.devcluster import SIM_DURATION

    start = time.monotonic()

    def at(second: float) -> None:
        time.sleep(max(0.0, start + second - time.monotonic()))

    def job(name: str, queue: str, seconds: int, replicas: int = 2, **spec: Any) -> None:
        sim = {SIM_DURATION: f"{seconds}s"}
        body = gpuq.job_body(name, queue, replicas, 8, sim, checkpoint=NO_CHECKPOINT, **spec)
        gpuq.create_job(ns, body)

    for name, q in SHOWCASE_QUEUES.items():
        gpuq.delete_queue(name)
        gpuq.create_queue(name, q["nominal"], **({"cohort": q["cohort"]} if "cohort" in q else {}))
    try:
        at(10)  # the queues' counters scraped at 0 first
        for name, seconds in [("r1", 150), ("r2", 170), ("r3", 100), ("b1", 200), ("b2", 210), ("b3", 60)]:
            job(name, "research" if name[0] == "r" else "batch", seconds)
        job("b-huge", "batch", 60, replicas=64)  # more than the cluster: blocked
        at(30)
        job("r4", "research", 120)  # research borrows prod's idle quota
        job("r5", "research", 120)
        at(60)
        for name in ("p1", "p2", "p3"):  # prod wants its quota back: reclaims from research
            job(name, "prod", 110)
        at(90)
        job("r6", "research", 60, priority=10)  # preempts a lower-priority research job
        at(120)
        victim = gpuq.status(ns, "b1")["placement"][0]["node"]
        cluster.fail_node(victim)
        at(150)
        cluster.recover_node(victim)
        at(250)
    finally:
        for name in SHOWCASE_QUEUES:
            gpuq.delete_queue(name)


PANELS = (
    "GPUs used vs nominal quota",
    "Pending jobs by reason",
    "Admission wait time",
    "Preemptions by reason",
    "Failover recovery time",
    "Scheduling cycle duration",
)
# One point every 2 s; rates over a short window follow the events closely (what Grafana's
# $__rate_interval would be at this resolution).
STEP, WINDOW = "2s", "30s"

Api = Callable[..., Any]


def _legend(fmt: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def _series(
    api: Api, target: Mapping[str, Any], start: float, end: float
) -> list[tuple[dict[str, str], list[float], list[float]]]:
    # The queue selector set to the scenario's queues, as one would pick them in Grafana.
    expr = target["expr"].replace("$queue", "|".join(SHOWCASE_QUEUES))
    data = api("query_range", query=to_promql(expr, WINDOW, f"{int(end - start)}s"),
               start=str(start), end=str(end), step=STEP)  # fmt: skip
    return [
        (s["metric"], [float(t) - start for t, _ in s["values"]], [float(v) for _, v in s["values"]])
        for s in data["result"]
    ]


def _draw(ax: Any, api: Api, panel: Mapping[str, Any], start: float, end: float) -> None:
    """One panel. Stacked panels are stacked (as Grafana draws them: no series hides behind
    another); series split by queue keep one colour per queue across targets (used solid, nominal
    dashed, borrowed dotted), as the dashboard's overrides style them."""
    styles = ("-", "--", ":")
    colours: dict[str, str] = {}
    stacked = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {})
    layers: dict[str, dict[float, float]] = {}
    for i, target in enumerate(panel["targets"]):
        for labels, xs, ys in _series(api, target, start, end):
            legend = _legend(target.get("legendFormat", ""), labels)
            if stacked.get("mode") == "normal":
                layers[legend] = dict(zip(xs, ys, strict=True))
                continue
            queue = labels.get("queue")
            colour = colours.setdefault(queue, f"C{len(colours)}") if queue else None
            style = styles[i % 3] if queue else "-"
            ax.plot(xs, ys, label=legend, color=colour, linestyle=style, linewidth=1.4)
    if layers:
        times = sorted({t for layer in layers.values() for t in layer})
        ys = [[layer.get(t, 0.0) for t in times] for layer in layers.values()]
        ax.stackplot(times, ys, labels=list(layers), alpha=0.6, step="post")
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    ax.set_xlim(0, end - start)  # the whole scenario, also where a quantile has no data (NaN)
    ax.set_ylim(bottom=0)
    ax.set_title(panel["title"], fontsize=11, loc="left")
    ax.set_xlabel("seconds into the scenario", fontsize=8)
    ax.set_ylabel({"s": "seconds", "short": "", "ops": "per second"}.get(unit, unit), fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=2 if len(ax.get_lines()) + len(layers) > 4 else 1)


def render_panels(api: Api, dashboard: Mapping[str, Any], directory: Path, since: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {p["title"]: p for p in dashboard["panels"] if p.get("type") == "timeseries"}
    end = time.time()
    fig, axes = plt.subplots(2, 3, figsize=(16, 8), constrained_layout=True)
    for ax, title in zip(axes.flat, PANELS, strict=True):
        _draw(ax, api, panels[title], since, end)
    fig.suptitle("gpuq dashboard panels (deploy/grafana/gpuq-dashboard.json) on a real Prometheus")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "gpuq-dashboard.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
