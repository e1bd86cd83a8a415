"""`gpuq simulate --plots`: two policies with the same series both stay visible, and matplotlib's
font-cache note stays out of the user's output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuq.sim import plots

FIXTURES = Path(__file__).parent / "fixtures"


def result(policy: str) -> dict[str, Any]:
    timeline = [(0.0, 8, 0, 0, 0), (3600.0, 16, 0, 0, 0), (7200.0, 0, 0, 0, 0)]
    return {
        "policy": policy,
        "timeline": timeline,
        "sim": {"cluster_gpus": 32},
        "jct_samples": [600.0, 1800.0, 7200.0],
        "per_queue": {"q": {"queueing_delay": {"avg": 60.0}}},
    }


def test_identical_series_are_all_visible_and_say_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    figures: list[Any] = []

    def keep(fig: Any, path: Path, plt: Any) -> Path:
        figures.append(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    plots.write_plots([result("gpuq"), result("kueue-tas"), result("kube-default")], tmp_path, "t")
    allocation, cdf, _ = figures
    for fig in (allocation, cdf):
        ax = fig.axes[0]
        lines = ax.get_lines()
        assert len(lines) == 3 and all(list(ln.get_ydata()) == list(lines[0].get_ydata()) for ln in lines)
        # Each copy dashes a different slot of the period, so the one below shows between its dashes
        # (matplotlib has no public getter for a line's dash pattern).
        patterns = [ln._unscaled_dash_pattern for ln in lines]
        assert patterns[0] == (0, None) and len(set(patterns)) == 3, patterns
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["gpuq", "kueue-tas (same as gpuq)", "kube-default (same as gpuq)"]


def test_line_styles_leave_distinct_series_alone() -> None:
    styles = plots.line_styles([("a", [1, 2], [1, 2]), ("b", [1, 2], [2, 1]), ("c", [1, 2], [1, 2])])
    assert styles[0] == {"label": "a"} and styles[1] == {"label": "b"}
    assert styles[2] == {"label": "c (same as a)", "linestyle": (0.0, (3.0, 3.0))}


def test_no_font_cache_note_in_the_output(tmp_path: Path) -> None:
    """A first run builds matplotlib's font cache (a fresh MPLCONFIGDIR here), which matplotlib
    announces with an INFO log line; the user's output has only the results and the files."""
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    args = [
        "simulate",
        str(FIXTURES / "canonical_small.csv"),
        "--racks-per-block",
        "1",
        "--nodes-per-rack",
        "4",
    ]
    run = subprocess.run(
        [sys.executable, "-m", "gpuq.cli", *args, "--no-progress", "--plots", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "mpl").exists()  # matplotlib did build its cache for this run
    output = run.stdout + run.stderr
    assert "fontManager" not in output, output
    assert "wrote " in run.stderr
