"""`gpuq simulate` end to end on the shipped fixtures: all three formats, JSON, plots, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuq.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
SMALL = ["--racks-per-block", "1", "--nodes-per-rack", "4", "--no-progress"]


def simulate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["simulate", *args, "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


def test_canonical_trace_all_policies_to_json(capsys: pytest.CaptureFixture[str]) -> None:
    out = simulate_json(capsys, str(FIXTURES / "canonical_small.csv"), *SMALL, "--policy", "all")
    assert [r["policy"] for r in out["results"]] == ["gpuq", "kube-default", "gang-binpack", "kueue-tas"]
    assert all(r["finished"] == 3 for r in out["results"])
    assert out["scenario"]["gpus"] == 32


def test_philly_trace_with_queue_file_and_one_gpu_workers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(
        "".join(
            f"---\nkind: GPUQueue\nmetadata: {{name: {q}}}\nspec: {{nominalGPUs: 8, cohort: all}}\n"
            for q in ("vc-a", "vc-b", "vc-c", "vc-d")
        )
    )
    out = simulate_json(
        capsys, str(FIXTURES / "philly_small.csv"), *SMALL, "--queues", str(queues), "--worker-gpus", "1"
    )
    (result,) = out["results"]
    assert result["finished"] == 4 and out["scenario"]["worker_gpus"] == "1"
    assert set(result["per_queue"]) == {"vc-a", "vc-b", "vc-c"}


def test_alibaba_pods_on_the_node_list_honour_gpu_models(capsys: pytest.CaptureFixture[str]) -> None:
    out = simulate_json(
        capsys,
        str(FIXTURES / "alibaba_pods_small.csv"),
        "--nodes-file",
        str(FIXTURES / "alibaba_nodes_small.csv"),
        "--no-progress",
        "--policy",
        "gpuq,gang-binpack",
    )
    assert [r["finished"] for r in out["results"]] == [3, 3]
    assert out["scenario"]["nodes"] == 4


def test_table_and_plots(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(
        [
            "simulate",
            str(FIXTURES / "canonical_small.csv"),
            *SMALL,
            "--policy",
            "gpuq,kube-default",
            "--plots",
            str(tmp_path),
            "--per-queue",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "avg JCT (h)" in out and "kube-default" in out and "per queue" in out
    for name in ("allocation.png", "jct_cdf.png", "queueing_delay_per_queue.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_bad_row_is_an_error_naming_file_line_field_and_skip_bad_reports_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("submit_time,duration,gpus,queue,priority\n0,10,1,q,0\n5,ten,1,q,0\n")
    assert main(["simulate", str(trace), *SMALL]) == 2
    assert "bad.csv:3: field 'duration'" in capsys.readouterr().err
    assert main(["simulate", str(trace), *SMALL, "--skip-bad"]) == 0
    assert "1 bad rows skipped" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "fifo"], "unknown"),
        (["--slowdown", "node=0.5"], "must be >= 1"),
        (["--slowdown", "disk=2"], "unknown level"),
        (["--gpus", "100"], "whole number"),
        (["--target-load", "0"], "target-load"),
    ],
)
def test_bad_flags_are_clear_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["simulate", str(FIXTURES / "canonical_small.csv"), *SMALL, *args]) == 2
    assert message in capsys.readouterr().err
