"""Prometheus metrics of the operator (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gpuq.controller.objects import JobEntry
from gpuq.core.decisions import Admit


def _queue(job: JobEntry) -> str:
    return job.spec.queue if job.spec is not None else ""


class Metrics:
    """All gpuq metrics, on their own registry so several operators can live in one test process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.queue_used = Gauge("gpuq_queue_used_gpus", "GPUs held by admitted jobs", ["queue"], registry=r)
        self.queue_borrowed = Gauge(
            "gpuq_queue_borrowed_gpus", "GPUs in use above nominal", ["queue"], registry=r
        )
        self.queue_nominal = Gauge(
            "gpuq_queue_nominal_gpus", "nominalGPUs of the queue", ["queue"], registry=r
        )
        self.pending = Gauge("gpuq_pending_jobs", "jobs waiting in the queue", ["queue"], registry=r)
        self.admitted_jobs = Gauge("gpuq_admitted_jobs", "jobs holding quota", ["queue"], registry=r)
        self.admissions = Counter("gpuq_admissions", "gang admissions", ["queue"], registry=r)
        self.preemptions = Counter("gpuq_preemptions", "gangs preempted (victims)", ["queue"], registry=r)
        self.restarts = Counter("gpuq_restarts", "gang restarts after failures", ["queue"], registry=r)
        self.finishes = Counter("gpuq_jobs_finished", "jobs finished", ["queue", "phase"], registry=r)
        self.rollbacks = Counter("gpuq_admission_rollbacks", "admissions rolled back", registry=r)
        self.lost_gpu_seconds = Counter(
            "gpuq_lost_gpu_seconds", "GPU-seconds of work lost to restarts", ["queue"], registry=r
        )
        buckets = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
        self.cycle = Histogram("gpuq_cycle_seconds", "scheduling cycle duration", buckets=buckets, registry=r)
        self.schedule = Histogram(
            "gpuq_schedule_seconds", "time in gpuq.core.schedule per cycle", buckets=buckets, registry=r
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

    def api_answer(self, verb: str, status: int) -> None:
        self.api_requests.labels(verb, str(status)).inc()

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def admitted(self, job: JobEntry, decision: Admit) -> None:
        self.admissions.labels(_queue(job)).inc()

    def preempted(self, job: JobEntry) -> None:
        self.preemptions.labels(_queue(job)).inc()

    def restarted(self, job: JobEntry, lost_gpu_seconds: float) -> None:
        self.restarts.labels(_queue(job)).inc()
        self.lost_gpu_seconds.labels(_queue(job)).inc(lost_gpu_seconds)

    def finished(self, job: JobEntry, phase: str) -> None:
        self.finishes.labels(_queue(job), str(phase)).inc()
