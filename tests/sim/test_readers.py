"""Trace readers: the three formats, format detection, and bad rows (error names file, line, field)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.sim.readers import MIB, detect_format, parse_models, read_trace
from gpuq.sim.trace import TraceError

FIXTURES = Path(__file__).parent / "fixtures"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_canonical_rows_rebased_sorted_and_priority_defaults_to_zero() -> None:
    jobs, report = read_trace(FIXTURES / "canonical_small.csv")
    assert [(j.submit_time, j.duration, j.gpus, j.queue, j.priority) for j in jobs] == [
        (0.0, 3600.0, 8, "team-a", 0),
        (0.0, 600.0, 1, "team-b", 5),
        (60.0, 1800.0, 16, "team-a", 0),
    ]
    assert [j.key for j in jobs] == ["job-1", "job-2", "job-3"]
    assert (report.rows, report.kept, report.skipped) == (3, 3, [])


def test_philly_timestamps_become_seconds_since_first_submit_and_cluster_is_queue() -> None:
    jobs, _ = read_trace(FIXTURES / "philly_small.csv")
    assert [(j.submit_time, j.gpus, j.queue) for j in jobs] == [
        (0.0, 8, "vc-b"),
        (10.0, 1, "vc-a"),
        (300.0, 16, "vc-a"),
        (3600.0, 2, "vc-c"),
    ]
    assert jobs[0].duration == 1200.0


def test_alibaba_pods_keep_gpu_tasks_that_ran_with_models_and_round_fractional_gpus_up() -> None:
    jobs, report = read_trace(FIXTURES / "alibaba_pods_small.csv")
    by_key = {j.key: j for j in jobs}
    assert sorted(by_key) == ["pod-a", "pod-b", "pod-e"]
    b = by_key["pod-b"]
    assert (b.gpus, b.duration, b.gpu_models, b.queue, b.priority) == (
        1,
        250.0,
        ("V100M16", "V100M32"),
        "BE",
        0,
    )
    e = by_key["pod-e"]
    assert (e.duration, e.gpu_models, e.cpu_millis, e.memory_bytes, e.priority) == (
        1900.0,
        ("T4",),
        32000,
        65536 * MIB,
        1,
    )
    assert by_key["pod-a"].submit_time == 0.0 and e.submit_time == 400.0
    assert report.ignored == {"CPU-only task (num_gpu=0)": 1, "never scheduled in the trace (no run time)": 1}


def test_alibaba_list_without_times_needs_a_default_duration(tmp_path: Path) -> None:
    path = write(
        tmp_path, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,2,1000\np1,1000,1024,1,500\n"
    )
    with pytest.raises(TraceError, match="--default-duration"):
        read_trace(path)
    jobs, _ = read_trace(path, default_duration=60)
    assert [(j.submit_time, j.duration, j.gpus) for j in jobs] == [(0.0, 60.0, 2), (1.0, 60.0, 1)]


@pytest.mark.parametrize(
    ("row", "line", "field", "problem"),
    [
        ("5,abc,1,q,0", 3, "duration", "not a number"),
        ("5,-3,1,q,0", 3, "duration", "must be >"),
        ("5,10,1.5,q,0", 3, "gpus", "not an integer"),
        ("5,10,0,q,0", 3, "gpus", ">= 1"),
        ("5,10,1,,0", 3, "queue", "empty"),
        ("5,10,1,q,high", 3, "priority", "not an integer"),
        ("nan,10,1,q,0", 3, "submit_time", "not finite"),
        ("5,10,1,q,0,extra", 3, "<row>", "more than 5 cells"),
    ],
)
def test_bad_canonical_row_names_file_line_and_field(
    tmp_path: Path, row: str, line: int, field: str, problem: str
) -> None:
    path = write(tmp_path, f"submit_time,duration,gpus,queue,priority\n0,10,1,q,0\n{row}\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    err = info.value
    assert (err.path, err.line, err.field_name) == (str(path), line, field)
    assert problem in str(err) and f"{path}:{line}" in str(err)


def test_bad_philly_timestamp_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp,duration,num_gpus,gpu_time,cluster\n2017-13-45 00:00:00,10,1,10,a\n")
    with pytest.raises(TraceError, match=r"trace.csv:2: field 'timestamp'"):
        read_trace(path)


def test_skip_bad_counts_and_describes_every_skipped_row(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "submit_time,duration,gpus,queue,priority\n0,10,1,q,0\nx,10,1,q,0\n1,10,zero,q,0\n2,5,2,q,1\n",
    )
    jobs, report = read_trace(path, skip_bad=True)
    assert [j.gpus for j in jobs] == [1, 2]
    assert len(report.skipped) == 2
    assert "trace.csv:3: field 'submit_time'" in report.skipped[0]
    assert "trace.csv:4: field 'gpus'" in report.skipped[1]
    assert "2 bad rows skipped" in report.summary()


def test_missing_column_and_unknown_header_are_clear(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="missing column"):
        read_trace(write(tmp_path, "submit_time,duration,gpus,priority\n0,1,1,0\n"), fmt="canonical")
    with pytest.raises(TraceError, match="unknown trace format"):
        detect_format(write(tmp_path, "a,b,c\n1,2,3\n", "other.csv"))
    with pytest.raises(TraceError, match="does not exist"):
        read_trace(tmp_path / "nope.csv")


def test_detect_format_of_each_fixture() -> None:
    assert detect_format(FIXTURES / "canonical_small.csv") == "canonical"
    assert detect_format(FIXTURES / "philly_small.csv") == "philly"
    assert detect_format(FIXTURES / "alibaba_pods_small.csv") == "alibaba"


def test_parse_models_accepts_pipes_semicolons_and_spaces() -> None:
    assert parse_models("A100|H100") == ("A100", "H100")
    assert parse_models(" H100; A100  A100 ") == ("A100", "H100")
    assert parse_models("") == ()
