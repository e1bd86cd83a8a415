"""Prometheus metrics of the operator (served on --metrics-port).

Names follow Kueue's where they mean the same thing, so dashboards and habits carry over:
kueue_pending_workloads -> gpuq_pending_jobs{queue,reason}, kueue_admission_wait_time_seconds ->
gpuq_admission_wait_time_seconds{queue}, kueue_preempted_workloads_total ->
gpuq_preempted_jobs_total{queue,reason}, kueue_cluster_queue_nominal_quota -> gpuq_queue_nominal_gpus.
docs/operations.md ("Metrics") lists every metric; deploy/ holds a dashboard and alerts over them.

Per-queue gauges are published whole by the leader once per cycle (`publish_cycle`); a standby
publishes none, so summing a metric over all replicas counts the cluster once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gpuq.api.trainingjob import Phase
from gpuq.controller.objects import JobEntry, QueueEntry
from gpuq.controller.snapshot import Exclusion
from gpuq.core.decisions import Admit, Decisions, Pending

# Why a gang was preempted (label `reason` of gpuq_preempted_jobs_total), after Kueue's reasons.
PREEMPTION_IN_QUEUE = "InQueuePriority"  # a higher-priority job of the same queue (Kueue: InClusterQueue)
PREEMPTION_RECLAIM = "InCohortReclamation"  # a cohort peer took back quota the victim's queue borrowed
PREEMPTION_CONSOLIDATION = "Consolidation"  # moved off a partly used node for a starving gang
PREEMPTION_UNKNOWN = "Unknown"  # the preemptor was deleted before its victim was evicted
PREEMPTION_REASONS = (PREEMPTION_IN_QUEUE, PREEMPTION_RECLAIM, PREEMPTION_CONSOLIDATION)

# A restart not followed by a running gang within this long is dropped from the recovery bookkeeping
# (the job failed, was deleted, or waits for capacity: it is no longer a failover in progress).
RECOVERY_HORIZON_SECONDS = 6 * 3600.0

CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Sub-second to half a day: a job may be admitted in the cycle after its creation or wait behind a
# day of work (the sub-second buckets keep the quantiles of an idle cluster meaningful).
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                3600.0, 7200.0, 14400.0, 43200.0)  # fmt: skip
# Restart to gang running again: re-placement and pod start (a first restart is re-placed in the
# same cycle), or a restart back-off of up to failover.backoffMaxSeconds (300 s by default).
RECOVERY_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0,
                    600.0, 1800.0)  # fmt: skip

FINISHED_LABELS = (str(Phase.SUCCEEDED), str(Phase.FAILED))
# The samples each metric type serves (prometheus_client's text format; _created: the OpenMetrics
# creation time, which the classic format also exposes).
_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """One queue's gauges after a cycle."""

    cohort: str  # "" when the queue is in no cohort
    nominal: int | None  # None when the queue's spec is invalid
    used: int
    borrowed: int
    admitted: int


@dataclass(frozen=True, slots=True)
class PendingJob:
    queue: str
    reason: str  # the pending code (core) or the exclusion's reason (blocked)
    since: float  # when it was created or last requeued (queued_since)


def _queue(job: JobEntry) -> str:
    return job.spec.queue if job.spec is not None else ""


def preemption_reason(victim: JobEntry, preemptor: JobEntry | None, move: bool = False) -> str:
    """The core preempts within a queue by priority, and across queues only to reclaim lent quota
    (gpuq.core.preemption), so the two jobs' queues tell which rule chose the victim; a move
    (gpuq.core.consolidation) says so itself."""
    if move:
        return PREEMPTION_CONSOLIDATION
    if preemptor is None or preemptor.spec is None:
        return PREEMPTION_UNKNOWN
    return PREEMPTION_IN_QUEUE if preemptor.spec.queue == _queue(victim) else PREEMPTION_RECLAIM


PendingCounts = dict[tuple[str, ...], float]


def _add_figures(
    counts: PendingCounts,
    oldest: PendingCounts,
    reasons: Iterable[tuple[str, str]],
    jobs: Mapping[str, JobEntry],
) -> None:
    for key, reason in reasons:
        job = jobs.get(key)
        if job is None or job.spec is None:
            continue
        q = job.spec.queue
        counts[(q, reason)] = counts.get((q, reason), 0) + 1
        since = job.facts.queued_since
        if since < oldest.get((q,), since + 1):
            oldest[(q,)] = since


def _merge(counts: PendingCounts, oldest: PendingCounts, part: tuple[PendingCounts, PendingCounts]) -> None:
    for k, n in part[0].items():
        counts[k] = counts.get(k, 0) + n
    for k, since in part[1].items():
        if since < oldest.get(k, since + 1):
            oldest[k] = since


def unchanged(
    queue: str, chunk: tuple[Pending, ...], last: tuple[Pending, ...], dirty: set[str] | None
) -> bool:
    """Whether what an explaining cycle derived from a queue's Pendings (`last`) holds for `chunk`:
    the core gave the very same tuple (nothing they are made of changed) and the queue is not
    `dirty` (no job of it changed or has a write in flight since; None: every queue is)."""
    return chunk is last and dirty is not None and queue not in dirty


class PendingFigures:
    """What the pending gauges show, straight from a cycle's decisions: jobs per (queue, reason),
    and per queue the oldest queued_since (`pending_jobs` without a record per job). Kept queue by
    queue: a queue whose Pendings are the very tuple the core gave last time
    (Decisions.pending_by_queue) and that is not `dirty` (no job of it changed since; None: all
    are) counts what it counted then, so an explaining cycle with 35,000 jobs waiting counts only
    the queues that changed. Jobs kept out (few) are counted every time."""

    def __init__(self) -> None:
        # queue -> (its Pendings, what they counted)
        self._kept: dict[str, tuple[tuple[Pending, ...], tuple[PendingCounts, PendingCounts]]] = {}

    def update(
        self,
        d: Decisions,
        excluded: Mapping[str, Exclusion],
        jobs: Mapping[str, JobEntry],
        dirty: set[str] | None = None,
    ) -> tuple[PendingCounts, PendingCounts]:
        counts: PendingCounts = {}
        oldest: PendingCounts = {}
        kept: dict[str, tuple[tuple[Pending, ...], tuple[PendingCounts, PendingCounts]]] = {}
        for queue, chunk in d.pending_queues():
            last = self._kept.get(queue)
            if last is None or not unchanged(queue, chunk, last[0], dirty):
                part: tuple[PendingCounts, PendingCounts] = ({}, {})
                _add_figures(*part, ((p.job, p.code or "Pending") for p in chunk), jobs)
                last = (chunk, part)
            kept[queue] = last
            _merge(counts, oldest, last[1])
        _add_figures(counts, oldest, ((key, why.reason) for key, why in excluded.items()), jobs)
        self._kept = kept
        return counts, oldest


def queue_figures(
    queues: Mapping[str, QueueEntry], decisions: Decisions, admitted: Mapping[str, int]
) -> dict[str, QueueFigures]:
    out: dict[str, QueueFigures] = {}
    for name, q in queues.items():
        spec = q.spec
        out[name] = QueueFigures(
            cohort=(spec.cohort or "") if spec is not None else "",
            nominal=spec.nominal_gpus if spec is not None else None,
            used=decisions.queue_usage.get(name, 0),
            borrowed=decisions.queue_borrowed.get(name, 0),
            admitted=admitted.get(name, 0),
        )
    return out


class _Published:
    """A gauge whose every label set is published at once; a label set missing from the next
    publication is set to 0 ("zero": a count that fell to nothing) or removed ("remove": the thing
    it described is gone, and a 0 would be a wrong value, e.g. a timestamp)."""

    def __init__(self, gauge: Gauge, vanished: Literal["zero", "remove"]) -> None:
        self.gauge = gauge
        self.vanished = vanished
        self.shown: set[tuple[str, ...]] = set()
        # What each label set was last set to: only changes reach the gauge (a label lookup takes
        # its lock; 1,000 queues x 4 gauges each cycle was most of a quiet cycle's metrics).
        self._values: dict[tuple[str, ...], float] = {}

    def publish(self, values: Mapping[tuple[str, ...], float]) -> None:
        for labels in self.shown - values.keys():
            if self.vanished == "zero":
                self._set(labels, 0)
            else:
                self.gauge.remove(*labels)
                self._values.pop(labels, None)
        for labels, value in values.items():
            self._set(labels, value)
        if self.vanished == "remove":
            self.shown = set(values)
        elif not values.keys() <= self.shown:
            self.shown |= values.keys()

    def _set(self, labels: tuple[str, ...], value: float) -> None:
        if self._values.get(labels) != value:
            self.gauge.labels(*labels).set(value)
            self._values[labels] = value

    def clear(self) -> None:
        for labels in self.shown:
            self.gauge.remove(*labels)
        self.shown = set()
        self._values = {}


class Metrics:
    """All gpuq metrics, on their own registry so several operators can live in one test process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._define_queue_metrics(self.registry)
        self._define_job_metrics(self.registry)
        self._define_operator_metrics(self.registry)
        self._recovering: dict[str, float] = {}  # job uid -> when its gang was restarted
        self._known_queues: set[str] = set()
        self._published = [
            self._queue_used,
            self._queue_borrowed,
            self._queue_nominal,
            self._admitted_jobs,
            self._pending,
            self._oldest_pending,
        ]

    def _define_queue_metrics(self, r: CollectorRegistry) -> None:
        def gauge(
            name: str, doc: str, labels: Sequence[str], vanished: Literal["zero", "remove"]
        ) -> _Published:
            return _Published(Gauge(name, doc, labels, registry=r), vanished)

        qc = ("queue", "cohort")
        self._queue_used = gauge("gpuq_queue_used_gpus", "GPUs held by admitted jobs", qc, "remove")
        self._queue_borrowed = gauge("gpuq_queue_borrowed_gpus", "GPUs in use above nominal", qc, "remove")
        self._queue_nominal = gauge("gpuq_queue_nominal_gpus", "nominalGPUs of the queue", qc, "remove")
        self._admitted_jobs = gauge("gpuq_admitted_jobs", "jobs holding quota", ("queue",), "remove")
        self._pending = gauge(
            "gpuq_pending_jobs", "jobs waiting, by queue and pending reason code", ("queue", "reason"), "zero"
        )
        self._oldest_pending = gauge(
            "gpuq_oldest_pending_job_timestamp_seconds",
            "when the longest-waiting pending job of the queue was created or requeued (Unix time)",
            ("queue",),
            "remove",
        )

    def _define_job_metrics(self, r: CollectorRegistry) -> None:
        self.admissions = Counter("gpuq_admissions", "gang admissions", ["queue"], registry=r)
        self.admission_wait = Histogram(
            "gpuq_admission_wait_time_seconds",
            "time from a job's creation or requeue to its admission",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.preempted_jobs = Counter(
            "gpuq_preempted_jobs", "gangs preempted (victims), by reason", ["queue", "reason"], registry=r
        )
        self.restarts = Counter("gpuq_restarts", "gang restarts after failures", ["queue"], registry=r)
        self.recovery = Histogram(
            "gpuq_failover_recovery_time_seconds",
            "time from a gang's restart after a failure (node or worker) to all its workers running again",
            ["queue"],
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.finishes = Counter("gpuq_jobs_finished", "jobs finished", ["queue", "phase"], registry=r)
        self.rollbacks = Counter("gpuq_admission_rollbacks", "admissions rolled back", registry=r)
        self.lost_gpu_seconds = Counter(
            "gpuq_lost_gpu_seconds", "GPU-seconds of work lost to restarts", ["queue"], registry=r
        )

    def _define_operator_metrics(self, r: CollectorRegistry) -> None:
        self.cycle = Histogram(
            "gpuq_cycle_seconds", "scheduling cycle duration", buckets=CYCLE_BUCKETS, registry=r
        )
        self.schedule = Histogram(
            "gpuq_schedule_seconds", "time in gpuq.core.schedule per cycle", buckets=CYCLE_BUCKETS, registry=r
        )
        self.leader = Gauge("gpuq_leader", "1 while this replica holds the leader lease", registry=r)
        self.leader_terms = Counter(
            "gpuq_leader_terms", "leadership terms this replica started (lease acquisitions)", registry=r
        )
        self.disruption = Gauge(
            "gpuq_node_disruption",
            "1 while many nodes are NotReady at once and NotReady alone fails no gang",
            registry=r,
        )
        self.events_dropped = Counter(
            "gpuq_events_dropped",
            "routine Normal Events not posted because of the Event rate limit",
            ["reason"],
            registry=r,
        )
        self.api_requests = Counter(
            "gpuq_api_requests",
            "API server answers by verb and HTTP status (0: no answer)",
            ["verb", "code"],
            registry=r,
        )

    def names(self) -> set[str]:
        """Every sample name this registry serves (gpuq_cycle_seconds_bucket, gpuq_api_requests_total,
        ...), labelled metrics included before their first sample: dashboards and alerts are checked
        against it."""
        out: set[str] = set()
        for family in self.registry.collect():
            out |= {family.name + suffix for suffix in _SAMPLE_SUFFIXES.get(family.type, ("",))}
        return out

    def api_answer(self, verb: str, status: int) -> None:
        self.api_requests.labels(verb, str(status)).inc()

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    # -- per cycle (leader) ---------------------------------------------------------------------
    def publish_cycle(self, queues: Mapping[str, QueueFigures], pending: Sequence[PendingJob]) -> None:
        """The gauges of one cycle, whole: queues and pending jobs that vanished are zeroed or removed."""
        counts: PendingCounts = {}
        oldest: PendingCounts = {}
        for p in pending:
            counts[(p.queue, p.reason)] = counts.get((p.queue, p.reason), 0) + 1
            oldest[(p.queue,)] = min(oldest.get((p.queue,), p.since), p.since)
        self.publish_figures(queues, counts, oldest)

    def publish_figures(
        self, queues: Mapping[str, QueueFigures], counts: PendingCounts, oldest: PendingCounts
    ) -> None:
        """`publish_cycle` from `pending_figures`' aggregates."""
        self._queue_used.publish({(n, f.cohort): f.used for n, f in queues.items()})
        self._queue_borrowed.publish({(n, f.cohort): f.borrowed for n, f in queues.items()})
        self._queue_nominal.publish(
            {(n, f.cohort): f.nominal for n, f in queues.items() if f.nominal is not None}
        )
        self._admitted_jobs.publish({(n,): f.admitted for n, f in queues.items()})
        self._pending.publish(counts)
        self._oldest_pending.publish(oldest)
        self._initialize(queues)

    def _initialize(self, queues: Iterable[str]) -> None:
        """Create each queue's counters and histograms at zero, so their first increment is a change
        that rate() and increase() see (a series that appears at 1 shows no increase)."""
        for name in set(queues) - self._known_queues:
            self.admissions.labels(name)
            self.admission_wait.labels(name)
            self.restarts.labels(name)
            self.recovery.labels(name)
            self.lost_gpu_seconds.labels(name)
            for reason in PREEMPTION_REASONS:
                self.preempted_jobs.labels(name, reason)
            for phase in FINISHED_LABELS:
                self.finishes.labels(name, phase)
            self._known_queues.add(name)

    def standby(self) -> None:
        """Leadership lost: the new leader publishes the per-cycle gauges; stale copies here would be
        counted twice by a sum over replicas."""
        for gauge in self._published:
            gauge.clear()

    # -- per job --------------------------------------------------------------------------------
    def admitted(self, job: JobEntry, decision: Admit, at: float) -> None:
        """`job` as it was before this admission (its status says when it was queued)."""
        self.admissions.labels(_queue(job)).inc()
        self.admission_wait.labels(_queue(job)).observe(max(0.0, at - job.facts.queued_since))

    def preempted(self, job: JobEntry, reason: str) -> None:
        self.preempted_jobs.labels(_queue(job), reason).inc()

    def restarted(self, job: JobEntry, lost_gpu_seconds: float, at: float) -> None:
        self.restarts.labels(_queue(job)).inc()
        self.lost_gpu_seconds.labels(_queue(job)).inc(lost_gpu_seconds)
        horizon = at - RECOVERY_HORIZON_SECONDS
        self._recovering = {uid: t for uid, t in self._recovering.items() if t >= horizon}
        self._recovering.setdefault(job.uid, at)  # a second failure while recovering: still one recovery

    def running(self, job: JobEntry, at: float) -> None:
        """All of the job's workers run: if its gang was restarted, the failover is over."""
        since = self._recovering.pop(job.uid, None)
        if since is not None:
            self.recovery.labels(_queue(job)).observe(max(0.0, at - since))

    def finished(self, job: JobEntry, phase: str) -> None:
        self.finishes.labels(_queue(job), str(phase)).inc()
