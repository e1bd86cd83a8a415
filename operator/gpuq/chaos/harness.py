"""The machinery of a chaos run: operator replicas supervised like a Deployment, a sampler that
feeds the invariant checker, and the load submitter.

    with ChaosRun(cluster, work_dir, replicas=2) as run:
        run.submit(job_mix(500), over_seconds=60)   # in the background
        faults.kill_leader(run)                     # ... any faults
        violations = run.finish(timeout=600)
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from gpuq.api import meta
from gpuq.chaos.invariants import InvariantChecker, Sample, Violations, allocatable_gpus
from gpuq.chaos.load import LoadJob, queue_specs
from gpuq.controller.testing import GpuqClient, OperatorProcess, ensure_namespace, install_crds
from gpuq.devcluster import Cluster
from gpuq.logs import get_logger

log = get_logger("gpuq.chaos")
# The sampler's client retries while the API server is down on purpose: its warnings are noise here.
logging.getLogger("urllib3").setLevel(logging.ERROR)

LEASE_NAMESPACE = "gpuq-system"
SAMPLE_EVERY = 0.5


@dataclass(frozen=True)
class LeaseTimings:
    duration: float = 15.0
    renew: float = 10.0
    retry: float = 2.0

    def args(self) -> tuple[str, ...]:
        return (
            "--lease-duration", str(self.duration),
            "--renew-deadline", str(self.renew),
            "--retry-period", str(self.retry),
        )  # fmt: skip


class Replicas:
    """Operator processes sharing one Lease, restarted like a Deployment's pods after they die."""

    def __init__(self, cluster: Cluster, work: Path, count: int, timings: LeaseTimings, config: Path) -> None:
        self.cluster = cluster
        self.lease = f"chaos-{uuid.uuid4().hex[:6]}"
        self.timings = timings
        self.procs = {
            f"replica-{i}": OperatorProcess(
                cluster.kubeconfig,
                work / f"replica-{i}.log",
                config,
                extra_args=("--lease-name", self.lease, *timings.args()),
                env={"POD_NAME": f"replica-{i}"},
            )
            for i in range(count)
        }
        self.coordination: Any = k8s.CoordinationV1Api(_client(cluster))

    def start(self) -> None:
        for p in self.procs.values():
            p.start()

    def stop(self) -> None:
        for p in self.procs.values():
            p.resume()
            p.stop()

    def holder(self) -> str | None:
        """The replica named in the Lease, or None (no lease, released, or the API is down)."""
        name = (self.identity() or "").split("_")[0]
        return name if name in self.procs else None

    def leader(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name = self.holder()
            if name is not None and self.procs[name].alive:
                return name
            time.sleep(0.05)
        raise TimeoutError(f"no leader within {timeout:.0f}s")

    def leader_alive(self) -> bool:
        name = self.holder()
        return name is not None and self.procs[name].alive

    def wait_new_leader(self, old: str, timeout: float, old_identity: str | None) -> float:
        """Seconds until a live replica other than `old` holds the lease (old may be the same name
        restarted: then until the lease names a different identity than `old_identity`, read before
        the fault: a released lease is taken over within milliseconds, before a read made here)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            identity = self.identity()
            name = (identity or "").split("_")[0]
            if identity and identity != old_identity and name in self.procs and self.procs[name].alive:
                return time.monotonic() - t0
            time.sleep(0.02)
        raise TimeoutError(f"no new leader within {timeout:.0f}s after {old}")

    def identity(self) -> str | None:
        """The lease's holder identity (None if unreadable or empty)."""
        try:
            lease = self.coordination.read_namespaced_lease(self.lease, LEASE_NAMESPACE, _request_timeout=2)
        except Exception:
            return None
        return str(lease.spec.holder_identity or "") or None

    def restart_later(self, name: str, delay: float = 1.0) -> None:
        """As a ReplicaSet would: a new process for a dead one, after a short delay."""

        def again() -> None:
            time.sleep(delay)
            self.procs[name].start()

        threading.Thread(target=again, daemon=True).start()


def _client(cluster: Cluster) -> Any:
    from kubernetes import config as k8s_config

    return k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]


@dataclass
class RunReport:
    violations: Violations
    samples: int
    longest_partial: float
    longest_partial_raw: float
    jobs: int
    seconds: float
    faults: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)
    restarts: int = 0
    preemptions: int = 0
    evidence: dict[str, str] = field(default_factory=dict)


class ChaosRun:
    """One chaos run on a (dedicated) dev cluster: queues, replicas, sampler, load."""

    def __init__(
        self,
        cluster: Cluster,
        work: Path,
        replicas: int = 2,
        timings: LeaseTimings | None = None,
        config: str = "",
    ) -> None:
        self.cluster = cluster
        self.work = work
        self.api: Any = _client(cluster)
        self.gpuq = GpuqClient(self.api)
        self.core: Any = k8s.CoreV1Api(self.api)
        self.namespace = f"chaos-{uuid.uuid4().hex[:6]}"
        (work / "config.yaml").write_text(config)
        self.replicas = Replicas(cluster, work, replicas, timings or LeaseTimings(), work / "config.yaml")
        self.checker = InvariantChecker()
        self.faults: list[tuple[str, float, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t0 = time.monotonic()
        self.submitted: list[str] = []

    # -- set-up -------------------------------------------------------------------------------
    def __enter__(self) -> ChaosRun:
        install_crds(self.api)
        ensure_namespace(self.core, self.namespace)
        ensure_namespace(self.core, LEASE_NAMESPACE)
        nodes = self.api.sanitize_for_serialization(self.core.list_node().items)
        for name, spec in queue_specs(sum(allocatable_gpus(n) for n in nodes)).items():
            body = {
                "apiVersion": meta.API_VERSION,
                "kind": "GPUQueue",
                "metadata": {"name": name},
                "spec": spec,
            }
            try:
                self.gpuq.custom.create_cluster_custom_object(meta.GROUP, meta.VERSION, "gpuqueues", body)
            except k8s.ApiException as exc:
                if exc.status != 409:
                    raise
        self.replicas.start()
        self.replicas.leader(timeout=90)
        self._spawn(self._sample_forever, "sampler")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self.replicas.stop()

    def _spawn(self, fn: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=fn, name=f"chaos-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    # -- sampling -----------------------------------------------------------------------------
    def sample(self) -> Sample | None:
        t = time.monotonic()
        try:
            jobs = self.gpuq.custom.list_namespaced_custom_object(
                meta.GROUP, meta.VERSION, self.namespace, "trainingjobs", _request_timeout=5
            )["items"]
            pods = self.api.sanitize_for_serialization(
                self.core.list_namespaced_pod(self.namespace, _request_timeout=5).items
            )
            nodes = self.api.sanitize_for_serialization(self.core.list_node(_request_timeout=5).items)
        except Exception:
            return None  # the API server is not answering: no sample (its clock does not run)
        return Sample(t, jobs, pods, nodes, leader=self.replicas.leader_alive())

    def _sample_forever(self) -> None:
        while not self._stop.is_set():
            s = self.sample()
            if s is not None:
                with self._lock:
                    self.checker.observe(s)
            self._stop.wait(SAMPLE_EVERY)

    # -- load ---------------------------------------------------------------------------------
    def submit(self, jobs: Sequence[LoadJob], over_seconds: float) -> None:
        """Create the jobs at an even pace over `over_seconds`, in the background; a create that
        fails (the API server is down) is retried until it succeeds."""

        def run() -> None:
            gap = over_seconds / max(1, len(jobs))
            for job in jobs:
                while not self._stop.is_set():
                    try:
                        self.gpuq.create_job(self.namespace, job.body())
                        break
                    except k8s.ApiException as exc:
                        if exc.status == 409:
                            break  # it went through before its answer was lost
                        time.sleep(0.5)
                    except Exception:
                        time.sleep(0.5)
                with self._lock:
                    self.checker.submit(f"{self.namespace}/{job.name}", time.monotonic())
                    self.submitted.append(job.name)
                time.sleep(gap)

        self._spawn(run, "submitter")

    def fault(self, name: str, fn: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
        t0 = time.monotonic()
        log.info("chaos fault", fault=name, t=round(t0, 1))
        details = fn() or {}
        self.faults.append((name, time.monotonic() - t0, {**details, "at": round(t0, 1)}))
        return details

    # -- the end ------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        return list(
            self.gpuq.custom.list_namespaced_custom_object(
                meta.GROUP, meta.VERSION, self.namespace, "trainingjobs"
            )["items"]
        )

    def restarts(self) -> int:
        return sum(int((j.get("status") or {}).get("restarts", 0)) for j in self.jobs())

    def finish(self, expected: int, timeout: float) -> RunReport:
        """Wait until every job was submitted and finished (or the timeout), then check the end state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                submitted = len(self.submitted)
            if submitted >= expected:
                try:
                    jobs = self.jobs()
                except Exception:
                    jobs = []
                if len(jobs) >= expected and all(
                    (j.get("status") or {}).get("phase") in ("Succeeded", "Failed") for j in jobs
                ):
                    break
            time.sleep(1.0)
        self._stop.set()
        for t in self._threads:
            t.join(10)
        jobs = self.jobs()
        admitted: dict[str, int] = {}
        for ev in self.core.list_namespaced_event(self.namespace).items:
            if ev.reason == "Admitted" and ev.involved_object.kind == "TrainingJob":
                key = f"{self.namespace}/{ev.involved_object.name}"
                admitted[key] = admitted.get(key, 0) + (ev.count or 1)
        violations = self.checker.finish(jobs, admitted)
        return RunReport(
            violations=violations,
            samples=self.checker.samples,
            longest_partial=self.checker.longest_partial,
            longest_partial_raw=self.checker.longest_partial_raw,
            jobs=len(jobs),
            seconds=time.monotonic() - self._t0,
            faults=list(self.faults),
            restarts=sum(int((j.get("status") or {}).get("restarts", 0)) for j in jobs),
            preemptions=sum(int((j.get("status") or {}).get("preemptions", 0)) for j in jobs),
            evidence=dict(self.checker.evidence),
        )
