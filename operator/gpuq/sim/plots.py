"""PNG plots of one or more runs (matplotlib, headless): allocation over time, JCT CDF, and
queueing delay per queue."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BINS = 1000
Series = tuple[str, Sequence[float], Sequence[float]]  # label, xs, ys


def _binned(
    timeline: Sequence[tuple[float, int, int, int, int]], column: int, bins: int
) -> tuple[list[float], list[float]]:
    """Time-weighted mean of a piecewise-constant column over equal time bins (x in days)."""
    if len(timeline) < 2:
        return [], []
    start, end = timeline[0][0], timeline[-1][0]
    width = (end - start) / bins or 1.0
    sums = [0.0] * bins
    for (t0, *levels), (t1, *_) in itertools.pairwise(timeline):
        value = levels[column]
        b = min(int((t0 - start) / width), bins - 1)
        while t0 < t1:
            edge = t1 if b >= bins - 1 else min(t1, start + (b + 1) * width)
            sums[b] += value * (edge - t0)
            t0, b = edge, b + 1  # always advances: no float trap at bin edges
    xs = [(start + (i + 0.5) * width) / 86400.0 for i in range(bins)]
    return xs, [s / width for s in sums]


def line_styles(series: Sequence[Series]) -> list[dict[str, Any]]:
    """Plot keywords per series. Two policies can give the very same series (e.g. on a light load),
    and the line drawn last would hide the other: a series equal to an earlier one is drawn dashed
    over it, each copy in its own slot of the dash period (the first shows in the last slot), and
    its label says which it equals."""
    groups: dict[tuple[tuple[float, ...], tuple[float, ...]], list[int]] = {}
    for i, (_, xs, ys) in enumerate(series):
        groups.setdefault((tuple(xs), tuple(ys)), []).append(i)
    styles: list[dict[str, Any]] = [{"label": label} for label, _, _ in series]
    for members in groups.values():
        first = series[members[0]][0]
        for k, i in enumerate(members[1:], start=1):
            dash = 3.0
            styles[i] = {
                "label": f"{series[i][0]} (same as {first})",
                "linestyle": (dash * (k - 1), (dash, dash * (len(members) - 1))),
            }
    return styles


def _lines(ax: Any, series: Sequence[Series], **common: Any) -> None:
    for (_, xs, ys), style in zip(series, line_styles(series), strict=True):
        ax.plot(xs, ys, **common, **style)


def write_plots(results: Sequence[dict[str, Any]], directory: Path, title: str) -> list[Path]:
    # matplotlib logs "generated new fontManager" at INFO the first time it builds its font cache,
    # which the CLI's logging would print among the results: only its warnings are news to a user.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # matplotlib ships with the dev extra
        raise RuntimeError("--plots needs matplotlib: pip install matplotlib (or gpuq[dev])") from exc
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(10, 4))
    allocation = []
    for r in results:
        xs, ys = _binned(r["timeline"], 0, BINS)
        gpus = r["sim"]["cluster_gpus"]
        allocation.append((r["policy"], xs, [100.0 * y / gpus for y in ys]))
    _lines(ax, allocation, linewidth=0.8)
    ax.set(xlabel="time (days)", ylabel="GPUs allocated (%)", title=f"GPU allocation over time: {title}")
    ax.set_ylim(0, 105)
    ax.legend()
    written.append(_save(fig, directory / "allocation.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    cdfs = []
    for r in results:
        jcts = sorted(v / 3600.0 for v in r["jct_samples"])
        if jcts:
            cdfs.append((r["policy"], jcts, [(i + 1) / len(jcts) for i in range(len(jcts))]))
    _lines(ax, cdfs)
    ax.set(
        xscale="log",
        xlabel="job completion time (hours, log)",
        ylabel="fraction of jobs",
        title=f"JCT CDF: {title}",
    )
    ax.legend()
    written.append(_save(fig, directory / "jct_cdf.png", plt))

    queues = sorted({q for r in results for q in r["per_queue"]})
    fig, ax = plt.subplots(figsize=(max(6, len(queues) * 0.8), 4))
    width = 0.8 / max(len(results), 1)
    for i, r in enumerate(results):
        delays = [
            r["per_queue"].get(q, {}).get("queueing_delay", {}).get("avg", 0.0) / 3600.0 for q in queues
        ]
        ax.bar([x + i * width for x in range(len(queues))], delays, width, label=r["policy"])
    ax.set_xticks(
        [x + width * (len(results) - 1) / 2 for x in range(len(queues))], queues, rotation=45, ha="right"
    )
    ax.set(ylabel="avg queueing delay (h)", title=f"Queueing delay per queue: {title}")
    ax.legend()
    written.append(_save(fig, directory / "queueing_delay_per_queue.png", plt))
    return written


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
