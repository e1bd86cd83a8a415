"""What the simulator reads from a trace: one `TraceJob` per training job, plus a load report."""

from __future__ import annotations

from dataclasses import dataclass, field


class TraceError(ValueError):
    """A malformed trace row or file. The message names the file, the line and the field."""

    def __init__(self, path: str, line: int, field_name: str, problem: str) -> None:
        self.path, self.line, self.field_name, self.problem = path, line, field_name, problem
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: field {field_name!r}: {problem}")


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A job as the trace describes it. `duration` is its run time at full speed (no slowdown)."""

    key: str
    submit_time: float  # seconds since the start of the trace
    duration: float
    gpus: int
    queue: str
    priority: int = 0
    gpu_models: tuple[str, ...] = ()  # any of; empty = any GPU model
    cpu_millis: int = 0  # per job (split evenly over its workers)
    memory_bytes: int = 0


@dataclass
class LoadReport:
    """What a reader kept, skipped (bad rows, with --skip-bad) and ignored (rows that are no GPU job)."""

    path: str
    rows: int = 0
    kept: int = 0
    skipped: list[str] = field(default_factory=list)  # one message per bad row skipped
    ignored: dict[str, int] = field(default_factory=dict)  # reason -> count

    def ignore(self, reason: str) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + 1

    def summary(self) -> str:
        parts = [f"{self.path}: {self.rows} rows, {self.kept} jobs"]
        if self.skipped:
            parts.append(f"{len(self.skipped)} bad rows skipped (first: {self.skipped[0]})")
        parts.extend(f"{n} ignored: {reason}" for reason, n in sorted(self.ignored.items()))
        return "; ".join(parts)
