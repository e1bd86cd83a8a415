"""Trace readers: canonical CSV, Philly (Pollux pre-processing) and the Alibaba 2023 pod list.

Every reader validates each row and raises `TraceError` naming file, line and field, unless
`skip_bad` is set, in which case the row is counted and described in the `LoadReport`.
Submit times are shifted so the first job arrives at t=0.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from gpuq.sim.trace import LoadReport, TraceError, TraceJob

CANONICAL_COLUMNS = ("submit_time", "duration", "gpus", "queue", "priority")
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
ALIBABA_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
ALIBABA_TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")
# Alibaba QoS class -> queue priority (latency-sensitive work outranks best-effort work).
ALIBABA_QOS_PRIORITY = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0}
MIB = 1024 * 1024
FORMATS = ("auto", "canonical", "philly", "alibaba")


class Row:
    """One CSV row with typed accessors that raise `TraceError` naming file, line and field."""

    def __init__(self, path: str, line: int, values: dict[str, str]) -> None:
        self.path, self.line, self.values = path, line, values

    def error(self, name: str, problem: str) -> TraceError:
        return TraceError(self.path, self.line, name, problem)

    def text(self, name: str, required: bool = True) -> str:
        value = (self.values.get(name) or "").strip()
        if required and not value:
            raise self.error(name, "is empty")
        return value

    def number(self, name: str, minimum: float = 0.0, strictly_above: bool = False) -> float:
        raw = self.text(name)
        try:
            value = float(raw)
        except ValueError:
            raise self.error(name, f"{raw!r} is not a number") from None
        if not math.isfinite(value):
            raise self.error(name, f"{raw!r} is not finite")
        if value < minimum or (strictly_above and value == minimum):
            relation = ">" if strictly_above else ">="
            raise self.error(name, f"{raw!r} must be {relation} {minimum:g}")
        return value

    def integer(self, name: str, minimum: int = 0) -> int:
        raw = self.text(name)
        try:
            value = float(raw)
        except ValueError:
            raise self.error(name, f"{raw!r} is not an integer") from None
        if not value.is_integer():
            raise self.error(name, f"{raw!r} is not an integer")
        if value < minimum:
            raise self.error(name, f"{raw!r} must be >= {minimum}")
        return int(value)


def csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[Row]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = tuple(name.strip() for name in (reader.fieldnames or ()))
        missing = [name for name in required if name not in header]
        if missing:
            raise TraceError(str(path), 1, missing[0], f"missing column (header has {', '.join(header)})")
        reader.fieldnames = list(header)
        for values in reader:
            if None in values:  # more cells than header columns
                raise TraceError(str(path), reader.line_num, "<row>", f"has more than {len(header)} cells")
            yield Row(str(path), reader.line_num, values)


def _read(
    path: Path,
    required: tuple[str, ...],
    parse: Callable[[Row, LoadReport], TraceJob | None],
    skip_bad: bool,
) -> tuple[list[TraceJob], LoadReport]:
    """Parse every row; `parse` returns None for rows that are valid but no GPU job (it notes why)."""
    report = LoadReport(str(path))
    jobs: list[TraceJob] = []
    for row in csv_rows(path, required):
        report.rows += 1
        try:
            job = parse(row, report)
        except TraceError as exc:
            if not skip_bad:
                raise
            report.skipped.append(str(exc))
            continue
        if job is not None:
            jobs.append(job)
    report.kept = len(jobs)
    return _rebase(jobs), report


def _rebase(jobs: list[TraceJob]) -> list[TraceJob]:
    """Shift submit times so the first arrival is at 0 and sort by (submit time, file order)."""
    if not jobs:
        return jobs
    start = min(job.submit_time for job in jobs)
    ordered = sorted(enumerate(jobs), key=lambda pair: (pair[1].submit_time, pair[0]))
    return [_shift(job, start) for _, job in ordered]


def _shift(job: TraceJob, start: float) -> TraceJob:
    if start == 0:
        return job
    return TraceJob(
        job.key,
        job.submit_time - start,
        job.duration,
        job.gpus,
        job.queue,
        job.priority,
        job.gpu_models,
        job.cpu_millis,
        job.memory_bytes,
    )


def parse_models(raw: str) -> tuple[str, ...]:
    """A GPU model list as written in traces and our canonical CSV: `A100|H100` (also `;` or spaces)."""
    for sep in (";", " "):
        raw = raw.replace(sep, "|")
    return tuple(sorted({model.strip() for model in raw.split("|") if model.strip()}))


def read_canonical(path: Path, skip_bad: bool = False) -> tuple[list[TraceJob], LoadReport]:
    """`submit_time,duration,gpus,queue,priority` (seconds, seconds, GPUs, queue name, integer);
    optional columns: `name` (job key), `gpu_models` (`A100|H100`), `cpu_millis`, `memory_mib`."""

    def parse(row: Row, report: LoadReport) -> TraceJob:
        priority_raw = row.text("priority", required=False)
        try:
            priority = int(priority_raw) if priority_raw else 0
        except ValueError:
            raise row.error("priority", f"{priority_raw!r} is not an integer") from None
        return TraceJob(
            key=row.text("name", required=False) or f"job-{row.line - 1}",
            submit_time=row.number("submit_time"),
            duration=row.number("duration", strictly_above=True),
            gpus=row.integer("gpus", minimum=1),
            queue=row.text("queue"),
            priority=priority,
            gpu_models=parse_models(row.text("gpu_models", required=False)),
            cpu_millis=row.integer("cpu_millis") if row.values.get("cpu_millis") else 0,
            memory_bytes=row.integer("memory_mib") * MIB if row.values.get("memory_mib") else 0,
        )

    return _read(path, CANONICAL_COLUMNS[:4], parse, skip_bad)


def read_philly(path: Path, skip_bad: bool = False) -> tuple[list[TraceJob], LoadReport]:
    """Philly as pre-processed by Pollux: `timestamp,duration,num_gpus,gpu_time,cluster`;
    the virtual cluster is the tenant queue. `gpu_time` is validated but implied by the others."""

    def parse(row: Row, report: LoadReport) -> TraceJob:
        raw = row.text("timestamp")
        try:
            submit = datetime.fromisoformat(raw).replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise row.error("timestamp", f"{raw!r} is not a 'YYYY-MM-DD HH:MM:SS' time") from None
        row.number("gpu_time")
        return TraceJob(
            key=f"philly-{row.line - 1}",
            submit_time=submit,
            duration=row.number("duration", strictly_above=True),
            gpus=row.integer("num_gpus", minimum=1),
            queue=row.text("cluster"),
        )

    return _read(path, PHILLY_COLUMNS, parse, skip_bad)


def read_alibaba_pods(
    path: Path, skip_bad: bool = False, default_duration: float | None = None
) -> tuple[list[TraceJob], LoadReport]:
    """Alibaba cluster-trace-gpu-v2023 pod list: one single-pod job per GPU task.

    Run time = deletion_time - scheduled_time; tasks never scheduled in the trace (no run time) and
    CPU-only tasks are ignored and counted. A fractional GPU (gpu_milli < 1000) is rounded up to a
    whole GPU (gpuq allocates whole GPUs). queue = QoS class. A list without time columns (the
    `multigpu50` sample) needs `default_duration`: tasks then arrive one per second in file order.
    """
    with path.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), [])
    timed = all(name in header for name in ALIBABA_TIME_COLUMNS)
    if not timed and default_duration is None:
        raise TraceError(
            str(path),
            1,
            "creation_time",
            "pod list has no creation/deletion/scheduled times; pass --default-duration SECONDS "
            "to run it with synthetic times (one arrival per second, fixed run time)",
        )

    def parse(row: Row, report: LoadReport) -> TraceJob | None:
        gpus = row.integer("num_gpu")
        cpu = row.integer("cpu_milli")
        memory = row.integer("memory_mib") * MIB
        row.integer("gpu_milli")
        if gpus == 0:
            report.ignore("CPU-only task (num_gpu=0)")
            return None
        qos = row.text("qos", required=False) or "default"
        if timed:
            if not row.text("scheduled_time", required=False):
                report.ignore("never scheduled in the trace (no run time)")
                return None
            submit = row.number("creation_time")
            duration = row.number("deletion_time") - row.number("scheduled_time")
            if duration <= 0:
                raise row.error("deletion_time", "is not after scheduled_time")
        else:
            submit, duration = float(row.line - 2), float(default_duration or 0)
        return TraceJob(
            key=row.text("name"),
            submit_time=submit,
            duration=duration,
            gpus=gpus,
            queue=qos,
            priority=ALIBABA_QOS_PRIORITY.get(qos, 0),
            gpu_models=parse_models(row.text("gpu_spec", required=False)),
            cpu_millis=cpu,
            memory_bytes=memory,
        )

    return _read(path, ALIBABA_POD_COLUMNS, parse, skip_bad)


def detect_format(path: Path) -> str:
    with path.open(newline="", encoding="utf-8") as handle:
        header = {name.strip() for name in next(csv.reader(handle), [])}
    if set(PHILLY_COLUMNS) <= header:
        return "philly"
    if set(ALIBABA_POD_COLUMNS) <= header:
        return "alibaba"
    if set(CANONICAL_COLUMNS[:4]) <= header:
        return "canonical"
    raise TraceError(
        str(path),
        1,
        "<header>",
        f"unknown trace format (header {sorted(header)}); expected canonical {CANONICAL_COLUMNS}, "
        f"Philly {PHILLY_COLUMNS} or an Alibaba pod list {ALIBABA_POD_COLUMNS}",
    )


def read_trace(
    path: Path, fmt: str = "auto", skip_bad: bool = False, default_duration: float | None = None
) -> tuple[list[TraceJob], LoadReport]:
    if not path.is_file():
        raise TraceError(str(path), 0, "<file>", "does not exist or is not a file")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "canonical":
        return read_canonical(path, skip_bad)
    if fmt == "philly":
        return read_philly(path, skip_bad)
    if fmt == "alibaba":
        return read_alibaba_pods(path, skip_bad, default_duration)
    raise ValueError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")


def write_canonical(jobs: list[TraceJob], path: Path) -> None:
    """Write jobs as canonical CSV (used to ship generated workloads)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("name", *CANONICAL_COLUMNS, "gpu_models"))
        for job in jobs:
            writer.writerow(
                (
                    job.key,
                    f"{job.submit_time:g}",
                    f"{job.duration:g}",
                    job.gpus,
                    job.queue,
                    job.priority,
                    "|".join(job.gpu_models),
                )
            )
