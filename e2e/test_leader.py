"""Leader election on a real API server: two replicas schedule as one, a killed leader is replaced
by the standby, a graceful stop hands over at once, and a leader that stalls past its lease (SIGSTOP)
is fenced: when it wakes up its in-flight writes are refused, so nothing is admitted twice."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

import test_operator as shared
from gpuq.controller.testing import GpuqClient, OperatorProcess
from gpuq.devcluster import SIM_DURATION
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

gpuq = shared.gpuq
queue = shared.queue
phase = shared.phase

# Short timings keep the test quick; the rules are the same as with the defaults (15/10/2 s).
LEASE = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1")


class Pair:
    """Two replicas of `gpuq operator run` sharing one Lease, told apart by POD_NAME."""

    def __init__(self, cluster: E2ECluster, work: Path) -> None:
        self.lease = f"e2e-{uuid.uuid4().hex[:6]}"
        self.cluster = cluster
        self.ops = {
            name: OperatorProcess(
                cluster.kubeconfig,
                work / f"{name}.log",
                log_level="DEBUG",
                extra_args=("--lease-name", self.lease, *LEASE),
                env={"POD_NAME": name},
            )
            for name in ("replica-a", "replica-b")
        }

    def holder(self) -> str:
        """The replica named in the Lease ("" while there is none)."""
        try:
            lease = k8s.CoordinationV1Api(self.cluster.api).read_namespaced_lease(self.lease, "gpuq-system")
        except k8s.ApiException as exc:
            if exc.status == 404:
                return ""
            raise
        return str(lease.spec.holder_identity or "").split("_")[0]

    def leader(self, timeout: float = 30) -> str:
        return wait_for(lambda: self.holder() in self.ops and self.holder(), timeout, "a leader")

    def log(self) -> str:
        return "\n".join(f"--- {n} ---\n{op.log_tail(30)}" for n, op in self.ops.items())


@pytest.fixture
def pair(cluster: E2ECluster, tmp_path: Path, gpuq: GpuqClient) -> Iterator[Pair]:
    p = Pair(cluster, tmp_path)
    for op in p.ops.values():
        op.start()
    yield p
    for op in p.ops.values():
        op.resume()
        op.stop()
    print(f"operator logs: {tmp_path}")


@pytest.fixture
def ns(namespace: str, gpuq: GpuqClient) -> Iterator[str]:
    yield namespace
    gpuq.clear_namespace(namespace)


def admitted_events(gpuq: GpuqClient, ns: str, name: str) -> int:
    return sum(e.count or 1 for e in gpuq.events(ns, name) if e.reason == "Admitted")


def assert_one_admission_per_attempt(gpuq: GpuqClient, ns: str, jobs: list[str]) -> None:
    for name in jobs:
        attempts = gpuq.status(ns, name).get("attempt", 0)
        assert admitted_events(gpuq, ns, name) <= attempts, (name, attempts)


def test_two_replicas_schedule_as_one_and_hand_over(
    cluster: E2ECluster, gpuq: GpuqClient, pair: Pair, ns: str, queue: shared.Callable[..., str]
) -> None:
    cluster.require_simulated_pods("jobs that finish")
    q = queue(len(cluster.node_names) * cluster.gpus_per_node)
    g = cluster.gpus_per_node
    first = pair.leader()
    standby = next(n for n in pair.ops if n != first)
    wave1 = [f"a{i}" for i in range(8)]
    for name in wave1:
        gpuq.submit(ns, name, q, 2, g, annotations={SIM_DURATION: "2s"})
    for name in wave1:
        phase(gpuq, pair.ops[first], ns, name, "Succeeded", timeout=60)
    assert "became leader" not in pair.ops[standby].log_path.read_text(), pair.log()

    # SIGKILL: no release, the standby waits for the lease to expire, then schedules.
    pair.ops[first].kill()
    wait_for(lambda: pair.holder() == standby, 30, f"{standby} takes over\n{pair.log()}")
    gpuq.submit(ns, "after-kill", q, 2, g, annotations={SIM_DURATION: "2s"})
    phase(gpuq, pair.ops[standby], ns, "after-kill", "Succeeded", timeout=60)

    # The killed replica comes back as a standby; a graceful stop of the leader hands over at once
    # (its lease is released, nobody waits for it to expire).
    pair.ops[first].start()
    wait_for(lambda: "cache synced" in pair.ops[first].log_path.read_text(), 30, "restarted replica synced")
    pair.ops[standby].stop()
    wait_for(lambda: pair.holder() == first, 3 * 1.0 + 2, f"{first} takes over at once\n{pair.log()}")
    assert "released leadership" in pair.ops[standby].log_path.read_text()
    gpuq.submit(ns, "after-stop", q, 2, g, annotations={SIM_DURATION: "2s"})
    phase(gpuq, pair.ops[first], ns, "after-stop", "Succeeded", timeout=60)
    assert_one_admission_per_attempt(gpuq, ns, [*wave1, "after-kill", "after-stop"])


def test_a_stalled_leader_is_fenced_when_it_wakes(
    cluster: E2ECluster, gpuq: GpuqClient, pair: Pair, ns: str, queue: shared.Callable[..., str]
) -> None:
    """SIGSTOP the leader with admissions in flight, past its lease: the standby takes over and
    finishes them; when the old leader runs again, its lease is gone and every write it had in
    flight is refused locally (the fence), so no gang is created or bound twice."""
    q = queue(len(cluster.node_names) * cluster.gpus_per_node)
    g = cluster.gpus_per_node
    old = pair.leader()
    new = next(n for n in pair.ops if n != old)
    jobs = [f"j{i}" for i in range(len(cluster.node_names) // 2)]
    for name in jobs:
        gpuq.submit(ns, name, q, 2, g)
    # The leader's own log, polled fast: a gang goes Admitted -> Running in well under a second
    # here, so polling job phases for "Admitted" can miss every admission.
    log = pair.ops[old].log_path
    wait_for(lambda: '"event": "admitted"' in log.read_text(), 30, "first admission", interval=0.01)
    pair.ops[old].pause()
    try:
        wait_for(lambda: pair.holder() == new, 30, f"{new} takes over\n{pair.log()}")
    finally:
        pair.ops[old].resume()
    for name in jobs:
        phase(gpuq, pair.ops[new], ns, name, "Running", timeout=90)
    wait_for(lambda: "lost leadership" in pair.ops[old].log_path.read_text(), 30, "old leader steps down")
    shared_state = {j: gpuq.status(ns, j)["attempt"] for j in jobs}
    live = [p for p in gpuq.core.list_namespaced_pod(ns).items if not p.metadata.deletion_timestamp]
    assert len(live) == 2 * len(jobs), sorted(p.metadata.name for p in live)
    assert len({p.spec.node_name for p in live}) == len(live), "two workers on one 8-GPU node"
    assert_one_admission_per_attempt(gpuq, ns, jobs)
    print(f"attempts after the stall: {shared_state}")
