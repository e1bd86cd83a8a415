"""The recording rules of Kueue's scheduler-benchmark runner, for both sides of bench/kueue_perf.py.

Kueue's runner (test/performance/scheduler/runner/recorder in the Kueue module) watches Workloads
and ClusterQueues and keeps, per workload, the time from its first watch event to its admission
(overwritten when it is admitted again after an eviction), to its finish, and how often it was
evicted; per queue, the integral of its status usage over time. Its summary.yaml holds per queue
class the integral, the nominal quota and the first and last event times, and per workload class
the count and the average times; Kueue's checker turns that into the minimum queue usage
(`usage_pct`) and compares it, the average time to admission per class and the manager's wall time
with a rangespec.yaml. `Recorder` applies the same rules to gpuq's TrainingJobs and GPUQueues
(perf_gpuq); `read_summary` reads Kueue's own files; `Summary` and `check` serve both, so the two
sides are summed and judged by one piece of code. Times are seconds (the runner's are ms).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml


@dataclass
class _WorkloadState:
    class_name: str
    first: float
    admitted: bool = False
    evicted: bool = False
    finished: bool = False
    to_admission: float = 0.0
    to_finish: float = 0.0
    evictions: int = 0
    ever_admitted: bool = False


@dataclass
class _QueueState:
    class_name: str
    nominal: float
    first: float
    last: float
    usage: float = 0.0
    used: float = 0.0  # usage x seconds


@dataclass(frozen=True)
class ClassFigures:
    count: int
    avg_time_to_admission_s: float
    avg_time_to_finish_s: float
    evictions: int


@dataclass(frozen=True)
class QueueClassFigures:
    used: float  # usage x seconds, summed over the class's queues
    nominal: float  # summed over the class's queues
    first: float
    last: float

    @property
    def usage_pct(self) -> float:
        """Kueue's checker: used x 100 / (nominal x elapsed); 0 when either is 0."""
        elapsed = self.last - self.first
        return self.used * 100 / (self.nominal * elapsed) if self.nominal and elapsed > 0 else 0.0


@dataclass(frozen=True)
class Summary:
    workloads: Mapping[str, ClassFigures]
    queues: Mapping[str, QueueClassFigures]
    dropped_events: int = 0
    admitted: int = 0  # workloads admitted at least once
    finished: int = 0

    @property
    def seen(self) -> int:
        return sum(c.count for c in self.workloads.values())

    @property
    def min_usage_pct(self) -> float:
        return min((q.usage_pct for q in self.queues.values()), default=0.0)


class Recorder:
    """Feed it watch events (`workload`, `queue`) with the times this process saw them."""

    def __init__(self) -> None:
        self._wl: dict[str, _WorkloadState] = {}
        self._q: dict[str, _QueueState] = {}

    def workload(
        self, key: str, class_name: str, t: float, *, admitted: bool, evicted: bool, finished: bool
    ) -> None:
        s = self._wl.get(key)
        if s is None:
            s = self._wl[key] = _WorkloadState(class_name, t)
        if admitted and not s.admitted:
            s.to_admission = t - s.first
            s.ever_admitted = True
        if evicted and not s.evicted:
            s.evictions += 1
        if finished and not s.finished:
            s.to_finish = t - s.first
        s.admitted, s.evicted, s.finished = admitted, evicted, finished

    def queue(self, name: str, class_name: str, t: float, *, usage: float, nominal: float) -> None:
        s = self._q.get(name)
        if s is None:
            self._q[name] = _QueueState(class_name, nominal, t, t, usage)
            return
        if s.usage > 0:
            s.used += s.usage * (t - s.last)
        s.last, s.usage, s.nominal = t, usage, nominal

    def finished(self, key: str) -> bool:
        s = self._wl.get(key)
        return s is not None and s.finished

    def summary(self) -> Summary:
        per_class: dict[str, list[_WorkloadState]] = {}
        for s in self._wl.values():
            per_class.setdefault(s.class_name, []).append(s)
        workloads = {
            c: ClassFigures(
                len(states),
                sum(s.to_admission for s in states) / len(states),
                sum(s.to_finish for s in states) / len(states),
                sum(s.evictions for s in states),
            )
            for c, states in sorted(per_class.items())
        }
        queues: dict[str, QueueClassFigures] = {}
        for q in self._q.values():
            prev = queues.get(q.class_name)
            queues[q.class_name] = (
                QueueClassFigures(q.used, q.nominal, q.first, q.last)
                if prev is None
                else QueueClassFigures(
                    prev.used + q.used,
                    prev.nominal + q.nominal,
                    min(prev.first, q.first),
                    max(prev.last, q.last),
                )
            )
        admitted = sum(1 for s in self._wl.values() if s.ever_admitted)
        finished = sum(1 for s in self._wl.values() if s.finished)
        return Summary(workloads, queues, 0, admitted, finished)


def _seconds(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def read_summary(path: Path, states: Path | None = None) -> Summary:
    """Kueue's runner's summary.yaml (CPU in millicores x ms; times in ms) as a Summary; how many
    workloads were admitted and finished comes from its wlStates.csv (`states`), one row a workload
    with its ms to admission and to finish (0: never)."""
    raw = yaml.safe_load(path.read_text()) or {}
    admitted = finished = 0
    if states is not None:
        with states.open(newline="") as f:
            for row in csv.DictReader(f):
                admitted += int(row["ms to admitted"]) > 0 or int(row["ms to finish"]) > 0
                finished += int(row["ms to finish"]) > 0
    workloads = {
        c: ClassFigures(
            int(w.get("count", 0)),
            float(w.get("averageTimeToAdmissionMs", 0)) / 1000,
            float(w.get("averageTimeToFinishMs", 0)) / 1000,
            int(w.get("totalEvictions", 0)),
        )
        for c, w in sorted((raw.get("workloadClasses") or {}).items())
    }
    queues = {
        c: QueueClassFigures(
            float(q.get("cpuUsed", 0)) / 1000,
            float(q.get("nominalQuota", 0)),
            _seconds(q["firstEventTime"]),
            _seconds(q["lastEventTime"]),
        )
        for c, q in sorted((raw.get("clusterQueueClasses") or {}).items())
    }
    return Summary(workloads, queues, int(raw.get("droppedWorkloadEvents", 0)), admitted, finished)


@dataclass(frozen=True)
class CmdStats:
    """What Kueue's runner records of the manager process (minimalkueue.stats.yaml)."""

    wall_s: float
    cpu_s: float  # user + system
    max_rss_mib: float


def read_cmd_stats(path: Path) -> CmdStats:
    raw = yaml.safe_load(path.read_text()) or {}
    cpu = (float(raw.get("userMs", 0)) + float(raw.get("sysMs", 0))) / 1000
    return CmdStats(float(raw.get("wallMs", 0)) / 1000, cpu, float(raw.get("maxrss", -1)) / 1024)


@dataclass(frozen=True)
class RangeSpec:
    """Kueue's rangespec.yaml: the thresholds its checker holds a run to."""

    max_wall_s: float | None
    min_usage_pct: Mapping[str, float] = field(default_factory=dict)
    max_avg_time_to_admission_s: Mapping[str, float] = field(default_factory=dict)


def read_rangespec(path: Path) -> RangeSpec:
    raw = yaml.safe_load(path.read_text()) or {}
    wall = (raw.get("cmd") or {}).get("maxWallMs")
    return RangeSpec(
        float(wall) / 1000 if wall is not None else None,
        {c: float(v) for c, v in (raw.get("clusterQueueClassesMinUsage") or {}).items()},
        {c: float(v) / 1000 for c, v in (raw.get("wlClassesMaxAvgTimeToAdmissionMs") or {}).items()},
    )


def check(summary: Summary, stats: CmdStats, spec: RangeSpec) -> list[str]:
    """Kueue's checker (test/performance/scheduler/checker): every way the run misses the
    rangespec, one line each; empty when it is within. A class the spec does not know fails, as
    there."""
    misses: list[str] = []
    if spec.max_wall_s is not None and stats.wall_s > spec.max_wall_s:
        misses.append(f"wall time {stats.wall_s:.1f} s is greater than the maximum {spec.max_wall_s:.1f} s")
    for c, q in summary.queues.items():
        if c not in spec.min_usage_pct:
            misses.append(f"queue class {c}: not in the rangespec")
        elif q.usage_pct < spec.min_usage_pct[c]:
            misses.append(
                f"queue class {c}: usage {q.usage_pct:.2f}% is less than {spec.min_usage_pct[c]:.2f}%"
            )
    for c, w in summary.workloads.items():
        if c not in spec.max_avg_time_to_admission_s:
            misses.append(f"workload class {c}: not in the rangespec")
        elif w.avg_time_to_admission_s > spec.max_avg_time_to_admission_s[c]:
            misses.append(
                f"workload class {c}: average time to admission {w.avg_time_to_admission_s:.1f} s is more "
                f"than {spec.max_avg_time_to_admission_s[c]:.1f} s"
            )
    return misses
