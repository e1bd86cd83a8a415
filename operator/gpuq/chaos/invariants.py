"""The invariants a chaos run checks on every sample of the API server's state (pure: bodies in,
counts out; the sampler that feeds it lives in gpuq.chaos.harness).

- no job lost: every job submitted exists at every sample and ends Succeeded; none is Failed;
- no duplicate worker: at most one live, not-deleting pod per (job, rank);
- no node over-committed: the GPUs of the bound, unfinished pods on a node (terminating ones too:
  they hold their GPUs until gone) never exceed its allocatable;
- no gang partially bound for more than PARTIAL_LIMIT seconds: a job whose current attempt (for a
  job not placed yet, the next: its pods come before its status) has some but not all ranks bound.
  The clock runs only while something could fix it: between two samples that both answered (the
  API server was up) and both saw a live leader; the raw longest partial window, leaderless time
  included, is reported beside it;
- one admission per attempt: Admitted Events of a job never outnumber its attempts (two writers
  admitting one attempt each post one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GPU = "nvidia.com/gpu"
PARTIAL_LIMIT = 10.0
MAX_SAMPLE_GAP = 2.0  # a longer gap between answering samples means the API server was not answering
LIVE_POD_PHASES = ("Pending", "Running", "Unknown")
PLACED = ("Admitted", "Running")
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Sample:
    """What the sampler read, starting at `time` (monotonic): API bodies as plain dicts."""

    time: float
    jobs: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    nodes: Sequence[Mapping[str, Any]]
    leader: bool = True  # a live replica held the lease


def _md(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _labels(body: Mapping[str, Any]) -> Mapping[str, str]:
    return _md(body).get("labels") or {}


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def pod_gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        total += _int((res.get("limits") or {}).get(GPU, (res.get("requests") or {}).get(GPU, 0)))
    return total


def allocatable_gpus(node: Mapping[str, Any]) -> int:
    return _int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))


def overcommitted(
    pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]]
) -> dict[str, tuple[int, int]]:
    """node -> (GPUs bound, allocatable) where bound exceeds allocatable."""
    return {n: (u, a) for n, (u, a, _) in overcommitted_pods(pods, nodes).items()}


def overcommitted_pods(
    pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]]
) -> dict[str, tuple[int, int, list[str]]]:
    """node -> (GPUs bound, allocatable, the pods bound there) where bound exceeds allocatable."""
    alloc = {_md(n)["name"]: allocatable_gpus(n) for n in nodes}
    used: dict[str, int] = {}
    names: dict[str, list[str]] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node and (p.get("status") or {}).get("phase", "Pending") in LIVE_POD_PHASES:
            used[node] = used.get(node, 0) + pod_gpus(p)
            deleting = " (deleting)" if _md(p).get("deletionTimestamp") else ""
            names.setdefault(node, []).append(f"{_md(p)['name']}:{pod_gpus(p)}{deleting}")
    return {n: (u, alloc.get(n, 0), names[n]) for n, u in used.items() if n in alloc and u > alloc[n]}


def duplicates(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(job, rank) -> pod names, where more than one live, not-deleting pod holds the rank."""
    by_rank: dict[tuple[str, str], list[str]] = {}
    for p in pods:
        labels = _labels(p)
        job, rank = labels.get("gpuq.dev/job-name"), labels.get("gpuq.dev/rank")
        live = (p.get("status") or {}).get("phase", "Pending") in LIVE_POD_PHASES
        if job and rank is not None and live and not _md(p).get("deletionTimestamp"):
            by_rank.setdefault((f"{_md(p).get('namespace')}/{job}", rank), []).append(_md(p)["name"])
    return {k: sorted(v) for k, v in by_rank.items() if len(v) > 1}


def partially_bound(jobs: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """Jobs whose current attempt has some, but not all, of its ranks bound: the attempt a placed
    job's status records, or, for a job still waiting, the next one (its pods come before its status,
    gpuq.controller.record, so a gang stopped half-created shows up here until it is deleted)."""
    bound: dict[tuple[str, str], set[str]] = {}
    for p in pods:
        labels = _labels(p)
        if (p.get("spec") or {}).get("nodeName") and not _md(p).get("deletionTimestamp"):
            attempt = (
                f"{_md(p).get('namespace')}/{labels.get('gpuq.dev/job-name')}",
                labels.get("gpuq.dev/attempt", ""),
            )
            bound.setdefault(attempt, set()).add(labels.get("gpuq.dev/rank", ""))
    out: set[str] = set()
    for j in jobs:
        status = j.get("status") or {}
        if status.get("phase") in FINISHED:
            continue
        current = _int(status.get("attempt")) + (0 if status.get("phase") in PLACED else 1)
        name = f"{_md(j).get('namespace')}/{_md(j)['name']}"
        replicas = _int(((j.get("spec") or {}).get("workers") or {}).get("replicas"))
        ranks = bound.get((name, str(current)), set())
        if 0 < len(ranks) < replicas:
            out.add(name)
    return out


@dataclass
class Violations:
    lost: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    duplicate_pods: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    overcommitted: dict[str, tuple[int, int]] = field(default_factory=dict)
    partial_too_long: dict[str, float] = field(default_factory=dict)
    double_admissions: dict[str, tuple[int, int]] = field(default_factory=dict)
    unfinished: set[str] = field(default_factory=set)

    def counts(self) -> dict[str, int]:
        return {
            "jobs lost": len(self.lost),
            "jobs failed": len(self.failed),
            "duplicate worker pods": len(self.duplicate_pods),
            "nodes over-committed": len(self.overcommitted),
            f"gangs partially bound > {PARTIAL_LIMIT:.0f}s": len(self.partial_too_long),
            "double admissions": len(self.double_admissions),
            "jobs not finished": len(self.unfinished),
        }

    @property
    def total(self) -> int:
        return sum(self.counts().values())


class InvariantChecker:
    """Feed it samples in time order; it keeps the violations and the partial-binding clocks."""

    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}  # job -> when its create returned (monotonic)
        self.v = Violations()
        self.samples = 0
        self.longest_partial = 0.0  # counted only while a leader and the API server were up
        self.longest_partial_raw = 0.0  # wall time, leaderless windows and outages included
        self._partial: dict[str, tuple[float, float]] = {}  # job -> (counted seconds, first seen)
        self.evidence: dict[str, str] = {}  # the first sample of each violation, for diagnosis
        self._last: Sample | None = None

    def submit(self, key: str, at: float) -> None:
        self.submitted[key] = at

    def observe(self, s: Sample) -> None:
        self.samples += 1
        names = {f"{_md(j).get('namespace')}/{_md(j)['name']}" for j in s.jobs}
        # A sample's list started at s.time: it must hold every job whose create returned before.
        self.v.lost |= {k for k, at in self.submitted.items() if at < s.time and k not in names}
        for j in s.jobs:
            if (j.get("status") or {}).get("phase") == "Failed":
                self.v.failed.add(f"{_md(j).get('namespace')}/{_md(j)['name']}")
        self.v.duplicate_pods.update(duplicates(s.pods))
        for node, (used, alloc, pods) in overcommitted_pods(s.pods, s.nodes).items():
            self.v.overcommitted[node] = (used, alloc)
            self.evidence.setdefault(f"over-committed {node}", f"t={s.time:.1f} {pods}")
        self._clock_partials(s)
        self._last = s

    def _clock_partials(self, s: Sample) -> None:
        partial = partially_bound(s.jobs, s.pods)
        last = self._last
        counts = last is not None and s.leader and last.leader and s.time - last.time <= MAX_SAMPLE_GAP
        step = s.time - last.time if counts and last is not None else 0.0
        nxt = {}
        for key in partial:
            counted, first = self._partial.get(key, (0.0, s.time))
            counted += step if key in self._partial else 0.0
            nxt[key] = (counted, first)
            self.longest_partial = max(self.longest_partial, counted)
            self.longest_partial_raw = max(self.longest_partial_raw, s.time - first)
            if counted > PARTIAL_LIMIT:
                self.v.partial_too_long[key] = counted
        self._partial = nxt

    def finish(self, jobs: Sequence[Mapping[str, Any]], admitted_events: Mapping[str, int]) -> Violations:
        """The final state: every job finished, and no attempt admitted twice."""
        for j in jobs:
            key = f"{_md(j).get('namespace')}/{_md(j)['name']}"
            status = j.get("status") or {}
            if status.get("phase") != "Succeeded":
                self.v.unfinished.add(key)
            attempts = _int(status.get("attempt"))
            if admitted_events.get(key, 0) > attempts:
                self.v.double_admissions[key] = (admitted_events[key], attempts)
        self.v.unfinished -= self.v.failed
        return self.v
