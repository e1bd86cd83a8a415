"""The baselines do what their names say: Kueue's quota, lending and preemption rules, Kueue TAS's
best-fit domain, the default kube-scheduler's scoring."""

from __future__ import annotations

from typing import Any

import pytest

from gpuq.core.config import SchedulerConfig
from gpuq.core.model import (
    Job,
    PreemptionPolicy,
    Queue,
    ReclaimPreemption,
    WorkerSpec,
)
from gpuq.sim.cluster import ClusterShape, build_nodes
from gpuq.sim.engine import SimOptions, Simulation
from gpuq.sim.kube_default import balanced_allocation, least_allocated
from gpuq.sim.kueue import best_fit
from gpuq.sim.policy import make_policy
from gpuq.sim.speed import SpeedModel
from gpuq.sim.tas import tas_place
from gpuq.sim.trace import TraceJob

CONFIG = SchedulerConfig()
TWO_RACKS = ClusterShape(racks_per_block=2, nodes_per_rack=4, gpus_per_node=8)
NO_COSTS: dict[str, Any] = {"checkpoint_minutes": 30, "restart_overhead_seconds": 0.0}


def gang(key: str, replicas: int, gpus: int = 8) -> Job:
    return Job(key, "q", 0, 0.0, WorkerSpec(replicas, gpus))


def free_of(shape: ClusterShape, busy: dict[str, int]) -> dict[str, list[int]]:
    nodes = build_nodes(shape, CONFIG)
    return {n.name: [n.allocatable.gpus - busy.get(n.name, 0), 10**9, 10**15] for n in nodes}


def test_kueue_tas_takes_the_smallest_rack_that_holds_the_gang() -> None:
    nodes = build_nodes(TWO_RACKS, CONFIG)
    # Rack r0 has 3 idle nodes, r1 all 4: a 3-node gang fits both; best fit is r0.
    free = free_of(TWO_RACKS, {"z0-b0-r0-n00": 8})
    placement = tas_place(gang("g", 3), nodes, free)
    assert placement is not None and {name[:8] for name in placement} == {"z0-b0-r0"}
    assert len(set(placement)) == 3
    # best_fit (gang-binpack) ignores racks: the fewest GPUs left first, wherever the node is.
    spread_free = free_of(TWO_RACKS, {"z0-b0-r0-n00": 8, "z0-b0-r1-n00": 4})
    binpacked = best_fit(gang("g", 2, 4), nodes, spread_free)
    assert binpacked == ("z0-b0-r1-n00", "z0-b0-r0-n01")


def test_kueue_tas_spans_racks_only_when_no_rack_holds_the_gang() -> None:
    nodes = build_nodes(TWO_RACKS, CONFIG)
    free = free_of(TWO_RACKS, {"z0-b0-r0-n00": 8, "z0-b0-r0-n01": 8})
    placement = tas_place(gang("g", 5), nodes, free)
    assert placement is not None and len(set(placement)) == 5
    racks = sorted(name[:8] for name in placement)
    # The largest rack first (r1: 4 nodes), then the remainder from r0.
    assert racks.count("z0-b0-r1") == 4 and racks.count("z0-b0-r0") == 1
    assert tas_place(gang("g", 7), nodes, free) is None


def run(jobs: list[TraceJob], policy: str, queues: tuple[Queue, ...], **options: Any) -> dict[str, Any]:
    sim = Simulation(
        jobs,
        build_nodes(TWO_RACKS, CONFIG),
        queues,
        CONFIG,
        make_policy(policy),
        SimOptions(speed=SpeedModel(enabled=False), **(NO_COSTS | options)),
    )
    return sim.run()


def cohort(reclaim: ReclaimPreemption) -> tuple[Queue, ...]:
    policy = PreemptionPolicy(reclaim_within_cohort=reclaim)
    return (
        Queue("a", 32, cohort="c", preemption=policy),
        Queue("b", 32, cohort="c", preemption=policy),
    )


@pytest.mark.parametrize("policy", ["gang-binpack", "kueue-tas"])
def test_kueue_reclaims_lent_quota_and_the_victim_keeps_only_its_periodic_checkpoint(policy: str) -> None:
    # b borrows all of a's idle quota (64 GPUs); at t=3000 a asks for its nominal 32 back.
    jobs = [TraceJob(f"b{i}", i, 10_000, 8, "b") for i in range(8)] + [TraceJob("a0", 3000, 100, 32, "a")]
    r = run(jobs, policy, cohort(ReclaimPreemption.ANY))
    assert r["preemptions"] == 4 and r["per_queue"]["a"]["queueing_delay"]["avg"] == 0.0
    # The four most recently started (b4-b7, started at 4-7 s) are killed at 3000 s; each keeps its
    # periodic checkpoint taken 1,800 s after it started.
    assert r["lost_gpu_hours"] == pytest.approx(sum(8 * (3000 - (i + 1800)) for i in (4, 5, 6, 7)) / 3600)


@pytest.mark.parametrize("policy", ["gang-binpack", "kueue-tas"])
def test_kueue_never_admits_within_nominal_quota_that_is_lent_out(policy: str) -> None:
    jobs = [TraceJob(f"b{i}", i, 10_000, 8, "b") for i in range(8)] + [TraceJob("a0", 3000, 100, 32, "a")]
    r = run(jobs, policy, cohort(ReclaimPreemption.NEVER))
    assert r["preemptions"] == 0
    # a's quota is borrowed by b: a waits until b's jobs end at ~10,000 s, though it is within nominal.
    assert r["per_queue"]["a"]["queueing_delay"]["avg"] == pytest.approx(10_000 - 3000, abs=10)


def test_default_scoring_ignores_gpus_and_balances_cpu_and_memory() -> None:
    node = build_nodes(ClusterShape(racks_per_block=1, nodes_per_rack=1), CONFIG)[0]
    a = node.allocatable
    job = Job("j", "q", 0, 0.0, WorkerSpec(1, 1, a.cpu_millis // 8, a.memory_bytes // 8))
    idle = [a.gpus, a.cpu_millis, a.memory_bytes]
    no_gpus_left = [1, a.cpu_millis, a.memory_bytes]  # GPUs taken by pods without cpu requests
    assert least_allocated(node, idle, job) == least_allocated(node, no_gpus_left, job) == 87
    assert balanced_allocation(node, idle, job) == 100
    lopsided = [a.gpus, a.cpu_millis // 4, a.memory_bytes]
    assert balanced_allocation(node, lopsided, job) < 100


def test_trace_jobs_without_requests_ask_cpu_and_memory_in_proportion_to_gpus() -> None:
    nodes = build_nodes(TWO_RACKS, CONFIG)
    sim = Simulation([TraceJob("j", 0, 10, 4, "q")], nodes, (Queue("q", 64),), CONFIG, make_policy("gpuq"))
    w = sim.jobs["j"].workers
    a = nodes[0].allocatable
    assert (w.cpu_millis, w.memory_bytes) == (
        int(a.cpu_millis * 0.75 / 8) * 4,
        int(a.memory_bytes * 0.75 / 8) * 4,
    )


@pytest.mark.parametrize("policy", ["gang-binpack", "kueue-tas"])
def test_kueue_retries_a_waiting_job_a_second_after_quota_frees_and_newcomers_go_first(policy: str) -> None:
    """Kueue parks a workload it could not admit until quota is released and its requeue batch
    (1 s) passes; a workload created meanwhile is tried at once (pkg/cache/queue)."""
    queue = (Queue("q", 64),)
    # The whole quota is held; f7 ends at t=100, the others much later.
    full = [TraceJob(f"f{i}", 0, 100 if i == 7 else 10_000, 8, "q") for i in range(8)]
    waiting = [TraceJob("w", 10, 50, 8, "q"), TraceJob("x", 20, 50, 8, "q")]
    newcomer = TraceJob("n", 100.5, 50, 8, "q")  # after f7 ends, before the requeue at 101
    sim = Simulation(
        [*full, *waiting, newcomer],
        build_nodes(TWO_RACKS, CONFIG),
        queue,
        CONFIG,
        make_policy(policy),
        SimOptions(**NO_COSTS),
    )
    sim.run()
    waits = {o.key: o.queueing_delay for o in sim.recorder.outcomes}
    # n takes f7's GPUs at once; w, first in queue order, gets n's a second after n ends (150.5),
    # and x w's a second after w ends (201.5). Strict creation order would run w, x, n instead.
    assert waits["n"] == 0.0
    assert waits["w"] == pytest.approx(151.5 - 10)
    assert waits["x"] == pytest.approx(202.5 - 20)
