"""The event loop on tiny, hand-computable scenarios, and the baselines behaving as named."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import Admit, Decisions
from gpuq.core.model import Checkpoint, Constraints, Job, Queue, Running, Snapshot, WorkerSpec
from gpuq.sim.cluster import ClusterShape, build_nodes
from gpuq.sim.engine import (
    SimOptions,
    Simulation,
    SimulationError,
    _with_checkpoint,
    offered_load,
    rescale_arrivals,
)
from gpuq.sim.kueue import REQUEUE_BATCH_SECONDS
from gpuq.sim.policy import POLICIES, Delta, Policy, make_policy
from gpuq.sim.queues import derive_queues
from gpuq.sim.readers import read_trace
from gpuq.sim.speed import SpeedModel
from gpuq.sim.trace import TraceJob

CONFIG = SchedulerConfig()
FIXTURES = Path(__file__).parent / "fixtures"
TWO_NODES = ClusterShape(racks_per_block=1, nodes_per_rack=2, gpus_per_node=8)
QUEUE = (Queue("q", nominal_gpus=16),)
KUEUE_LIKE = ("gang-binpack", "kueue-tas")


class Spy:
    """Wraps a policy; records every call and checks what the caller may rely on."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.checkpoint_on_preempt = inner.checkpoint_on_preempt
        self.timers = inner.timers
        self.calls: list[tuple[float, Snapshot, Decisions]] = []

    def schedule(self, snapshot: Snapshot, now: float, config: SchedulerConfig, delta: Delta) -> Decisions:
        decisions = self.inner.schedule(snapshot, now, config, delta)
        self.calls.append((now, snapshot, decisions))
        return decisions


def run(
    jobs: list[TraceJob],
    policy: str | Policy,
    shape: ClusterShape = TWO_NODES,
    queues: tuple[Queue, ...] = QUEUE,
    **options: Any,
) -> dict[str, Any]:
    chosen = make_policy(policy) if isinstance(policy, str) else policy
    sim = Simulation(jobs, build_nodes(shape, CONFIG), queues, CONFIG, chosen, SimOptions(**options))
    return sim.run()


@pytest.mark.parametrize("policy", POLICIES)
def test_lone_job_runs_at_once_for_its_duration(policy: str) -> None:
    r = run([TraceJob("a", 0, 100, 8, "q")], policy)
    assert (r["finished"], r["jct"]["avg"], r["queueing_delay"]["avg"]) == (1, 100.0, 0.0)
    assert r["gpu_allocation"] == pytest.approx(0.5)  # 8 of 16 GPUs for the whole span
    assert r["ettr"] == pytest.approx(1.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_second_job_waits_for_the_first_to_free_the_cluster(policy: str) -> None:
    r = run(
        [TraceJob("a", 0, 100, 16, "q"), TraceJob("b", 10, 50, 8, "q")],
        policy,
        speed=SpeedModel(enabled=False),
    )
    per_job = sorted((o["jct"]["avg"], o["queueing_delay"]["avg"]) for o in r["per_queue"].values())
    # Kueue retries a parked job a requeue batch (1 s) after quota frees (sim/kueue.py).
    late = REQUEUE_BATCH_SECONDS if policy in KUEUE_LIKE else 0.0
    assert per_job == [((100 + 140 + late) / 2, (90 + late) / 2)]  # a: (100, 0); b: (140, 90) + late
    assert r["makespan"] == 150.0 + late


@pytest.mark.parametrize("policy", POLICIES)
def test_start_latency_holds_the_gpus_and_counts_as_waiting(policy: str) -> None:
    """A replay's machinery (bench/replay.py): each start holds the GPUs `start_latency_seconds`
    before the pods run, so the first job waits 2 s and the second waits for 2 s more GPU-time."""
    r = run(
        [TraceJob("a", 0, 100, 16, "q"), TraceJob("b", 10, 50, 8, "q")],
        policy,
        speed=SpeedModel(enabled=False),
        start_latency_seconds=2.0,
    )
    # a: placed at 0, running at 2, done at 102; b: placed at 102 (+ Kueue's requeue batch),
    # running 2 s later, done 50 s after that.
    late = REQUEUE_BATCH_SECONDS if policy in KUEUE_LIKE else 0.0
    per_job = sorted((o["jct"]["avg"], o["queueing_delay"]["avg"]) for o in r["per_queue"].values())
    assert per_job == [((102 + 144 + late) / 2, (2 + 94 + late) / 2)]
    assert r["makespan"] == 154.0 + late


def test_kube_default_holds_a_partial_gang_while_gang_binpack_does_not() -> None:
    jobs = [TraceJob("a", 0, 100, 8, "q"), TraceJob("b", 1, 10, 16, "q")]  # b = 2 workers of 8
    kube = Spy(make_policy("kube-default"))
    r = run(jobs, kube, speed=SpeedModel(enabled=False))
    # At t=100 (a finished) the snapshot still shows b holding the one pod it bound at t=1.
    b_at_100 = [j for t, s, _ in kube.calls if t == 100 for j in s.jobs if j.key == "b"]
    assert b_at_100 and b_at_100[0].running is not None and len(b_at_100[0].running.placement) == 1
    # a: 8x100; b: one pod held 99 s, then 16 GPUs for 10 s; span 110 s of 16 GPUs.
    assert r["gpu_allocation"] == pytest.approx((800 + 8 * 99 + 160) / (16 * 110))
    assert r["gpu_busy"] == pytest.approx((800 + 160) / (16 * 110))
    assert r["ettr"] == pytest.approx(960 / (800 + 8 * 99 + 160))

    g = run(jobs, "gang-binpack", speed=SpeedModel(enabled=False))
    # b is retried a requeue batch after a finished, so the span is 111 s; nothing held meanwhile.
    span = 110 + REQUEUE_BATCH_SECONDS
    assert g["gpu_allocation"] == pytest.approx(g["gpu_busy"]) == pytest.approx(960 / (16 * span))


@pytest.mark.parametrize("policy", ["gang-binpack", "gpuq"])
def test_gang_policies_never_place_a_partial_gang(policy: str) -> None:
    jobs, _ = read_trace(FIXTURES / "synthetic_mixed.csv")
    spy = Spy(make_policy(policy))
    r = run(
        jobs[:250],
        spy,
        shape=ClusterShape(racks_per_block=2),
        queues=derive_queues(jobs, 256),
        worker_gpus="1",
    )
    sizes = {j.key: j.workers.replicas for _, s, _ in spy.calls for j in s.jobs}
    admits = [a for _, _, d in spy.calls for a in d.admit]
    assert admits and all(len(a.placement) == sizes[a.job] for a in admits)
    assert r["finished"] == 250


def test_schedule_is_called_only_when_something_changed_and_arrivals_are_batched() -> None:
    spy = Spy(make_policy("gang-binpack"))
    run([TraceJob(k, 0, d, 1, "q") for k, d in (("a", 10), ("b", 20), ("c", 30))], spy)
    assert [t for t, _, _ in spy.calls] == [0, 10, 20, 30]


def test_cycle_period_batches_decisions() -> None:
    spy = Spy(make_policy("gang-binpack"))
    r = run([TraceJob(k, t, 10, 1, "q") for k, t in (("a", 1), ("b", 2), ("c", 3))], spy, cycle_seconds=60)
    assert [t for t, _, _ in spy.calls][:1] == [60]
    assert r["queueing_delay"]["avg"] == pytest.approx(58.0)


@pytest.mark.parametrize(("speed", "jct"), [(SpeedModel(), 120.0), (SpeedModel(enabled=False), 100.0)])
def test_gang_spanning_nodes_runs_slower_by_the_node_factor(speed: SpeedModel, jct: float) -> None:
    one_gpu_nodes = ClusterShape(racks_per_block=1, nodes_per_rack=2, gpus_per_node=1)
    r = run([TraceJob("a", 0, 100, 2, "q")], "gang-binpack", shape=one_gpu_nodes, speed=speed)
    assert r["jct"]["avg"] == pytest.approx(jct)
    assert r["comm_multi_gpu"]["cross_node"] == 1.0


def test_an_over_committing_policy_is_stopped_with_a_clear_error() -> None:
    class Greedy:
        name = "greedy"
        checkpoint_on_preempt = False
        timers = False

        def schedule(
            self, snapshot: Snapshot, now: float, config: SchedulerConfig, delta: Delta
        ) -> Decisions:
            first = snapshot.nodes[0].name
            return Decisions(admit=tuple(Admit(j.key, (first,), 0.0) for j in snapshot.jobs if not j.running))

    with pytest.raises(SimulationError, match=r"greedy: node .* over-committed by b"):
        run([TraceJob("a", 0, 10, 8, "q"), TraceJob("b", 0, 10, 8, "q")], Greedy())


def test_fragmentation_counts_idle_gpus_no_pending_gang_can_use() -> None:
    # kube-default spreads a and b (4 GPUs each) over both nodes: c (8 GPUs on one node) cannot use
    # the 8 idle GPUs for 100 s. gang-binpack packs a and b onto one node and c runs at once.
    jobs = [TraceJob("a", 0, 100, 4, "q"), TraceJob("b", 0, 100, 4, "q"), TraceJob("c", 0, 100, 8, "q")]
    spread_out = run(jobs, "kube-default", speed=SpeedModel(enabled=False))
    assert spread_out["fragmentation"] == pytest.approx(8 * 100 / (16 * 200))
    packed = run(jobs, "gang-binpack", speed=SpeedModel(enabled=False))
    assert packed["fragmentation"] == 0.0 and packed["makespan"] == 100.0


def test_preemption_loses_work_unless_the_victim_checkpoints_first() -> None:
    one_node = ClusterShape(racks_per_block=1, nodes_per_rack=1, gpus_per_node=8)
    queue = (Queue("q", nominal_gpus=8),)
    jobs = [TraceJob("low", 0, 1000, 8, "q", priority=0), TraceJob("high", 100, 10, 8, "q", priority=5)]
    costs = {"checkpoint_minutes": None, "checkpoint_save_seconds": 60.0, "restart_overhead_seconds": 120.0}
    kube = run(jobs, "kube-default", shape=one_node, queues=queue, **costs)
    assert kube["preemptions"] == 1
    assert kube["lost_gpu_hours"] == pytest.approx(8 * 100 / 3600)  # no checkpoint: 100 s of 8 GPUs lost
    assert kube["makespan"] == pytest.approx(110 + 120 + 1000)  # restarts from scratch, after start-up
    gpuq = run(jobs, "gpuq", shape=one_node, queues=queue, **costs)
    assert gpuq["preemptions"] == 1 and gpuq["lost_gpu_hours"] == 0.0
    # The victim holds its GPUs 60 s while it saves; high runs 160-170; low resumes after start-up.
    assert gpuq["queueing_delay"]["avg"] == pytest.approx((0 + 60) / 2)
    assert gpuq["makespan"] == pytest.approx(170 + 120 + 900)
    assert gpuq["overhead_gpu_hours"] == pytest.approx(8 * (60 + 120) / 3600)


def test_a_stopped_job_is_queued_since_its_segment_ended() -> None:
    """The core counts a requeued job's wait (localityWaitSeconds) from when it lost its GPUs."""
    one_node = ClusterShape(racks_per_block=1, nodes_per_rack=1, gpus_per_node=8)
    jobs = [TraceJob("low", 0, 1000, 8, "q", priority=0), TraceJob("high", 100, 10, 8, "q", priority=5)]
    spy = Spy(make_policy("gpuq"))
    run(jobs, spy, shape=one_node, queues=(Queue("q", nominal_gpus=8),), checkpoint_minutes=None)
    waiting = [(now, j) for now, snap, _ in spy.calls for j in snap.jobs if j.key == "low" and not j.running]
    assert waiting[0][1].queued_since == 0.0  # before its first start: its creation counts
    requeued = [j.queued_since for now, j in waiting if now > 100]
    assert requeued and set(requeued) == {160.0}  # asked to save at 100, let go after the 60 s save


def test_a_save_longer_than_the_grace_is_a_kill_at_the_deadline() -> None:
    one_node = ClusterShape(racks_per_block=1, nodes_per_rack=1, gpus_per_node=8)
    queue = (Queue("q", nominal_gpus=8),)
    jobs = [TraceJob("low", 0, 4000, 8, "q", priority=0), TraceJob("high", 3000, 10, 8, "q", priority=5)]
    r = run(
        jobs,
        "gpuq",
        shape=one_node,
        queues=queue,
        checkpoint_minutes=30,
        checkpoint_save_seconds=90.0,
        checkpoint_grace_seconds=60.0,
        restart_overhead_seconds=0.0,
    )
    # Killed at 3060: only the periodic checkpoint at 1800 s survives, 1260 s of 8 GPUs are lost.
    assert r["lost_gpu_hours"] == pytest.approx(8 * 1260 / 3600)
    assert r["makespan"] == pytest.approx(3070 + 4000 - 1800)


@pytest.mark.parametrize("policy", POLICIES)
def test_node_failures_restart_whole_gangs_and_lose_at_most_a_checkpoint_interval(policy: str) -> None:
    jobs = [TraceJob(f"j{i}", i * 600, 4 * 3600, 8 if i % 2 else 4, "q") for i in range(12)]
    spy = Spy(make_policy(policy))
    r = run(
        jobs,
        spy,
        shape=ClusterShape(racks_per_block=1, nodes_per_rack=4),
        queues=(Queue("q", 32),),
        mtbf_hours=6.0,
        repair_hours=1.0,
        checkpoint_minutes=30,
        seed=3,
    )
    assert r["restarts"] > 0 and r["finished"] == 12
    restarts = [x for _, _, d in spy.calls for x in d.restart]
    assert len(restarts) == r["restarts"]
    assert r["lost_gpu_hours"] <= r["restarts"] * 8 * 0.5 + 1e-9
    assert r["ettr"] < 1.0
    # ETTR's complement is what the costs took: lost work and start-ups (no requested saves here).
    held = r["gpu_allocation"] * r["sim"]["cluster_gpus"] * r["makespan"] / 3600
    taken = r["lost_gpu_hours"] + r["overhead_gpu_hours"]
    assert r["ettr"] * held == pytest.approx(held - taken, rel=1e-6)


def test_same_seed_same_results() -> None:
    jobs, _ = read_trace(FIXTURES / "synthetic_mixed.csv")
    queues = derive_queues(jobs, 256)
    a = run(jobs[:200], "kube-default", shape=ClusterShape(racks_per_block=2), queues=queues, seed=5)
    b = run(jobs[:200], "kube-default", shape=ClusterShape(racks_per_block=2), queues=queues, seed=5)
    for r in (a, b):
        r.pop("sim")
    assert a == b


def test_target_load_rescales_arrivals() -> None:
    jobs, _ = read_trace(FIXTURES / "synthetic_mixed.csv")
    assert offered_load(jobs, 256) == pytest.approx(0.9, rel=0.05)
    faster = rescale_arrivals(jobs, 256, 1.5)
    assert offered_load(faster, 256) == pytest.approx(1.5)
    assert [j.duration for j in faster] == [j.duration for j in jobs]
    with pytest.raises(ValueError, match="target-load"):
        rescale_arrivals(jobs, 256, 0)


def test_job_naming_an_unknown_queue_is_rejected() -> None:
    with pytest.raises(ValueError, match="queue 'nope'"):
        run([TraceJob("a", 0, 1, 1, "nope")], "gpuq")


def test_a_job_that_can_never_fit_ends_the_run_unfinished() -> None:
    r = run([TraceJob("a", 0, 10, 1, "q"), TraceJob("huge", 0, 10, 64, "q")], "gang-binpack")
    assert (r["finished"], r["unfinished"]) == (1, 1)
    assert not math.isnan(r["jct"]["avg"])


def test_a_job_that_can_never_fit_costs_no_search_while_the_rest_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """It is set aside (ExceedsCapacity) every cycle without a placement or preemption attempt, and the
    jobs arriving after it run as if it were not there."""
    from gpuq.core import scheduler

    tried: list[str] = []
    real = scheduler._Cycle._try

    def spy(self: Any, job: Any, q: Any, is_head: bool) -> Any:
        tried.append(job.key)
        return real(self, job, q, is_head)

    monkeypatch.setattr(scheduler._Cycle, "_try", spy)
    jobs = [TraceJob("huge", 0, 10, 64, "q")] + [TraceJob(f"j{i}", 20 * i, 20, 8, "q") for i in range(40)]
    r = run(jobs, "gpuq")
    assert (r["finished"], r["unfinished"]) == (40, 1)
    assert "huge" not in tried and len(set(tried)) == 40
    assert r["queueing_delay"]["p99"] == 0.0  # one 8-GPU job at a time on 16 GPUs: none waits


def test_the_kept_index_decides_like_a_fresh_one_with_attained_service_preemption() -> None:
    """The index, cycle memo and service-event heap kept between calls change nothing: the same run
    with a fresh index per call gives the same results (small thresholds, so the rule fires often)."""
    from gpuq.core.config import ServiceOrdering
    from gpuq.sim.policy import GpuqPolicy

    jobs, _ = read_trace(FIXTURES / "synthetic_mixed.csv")
    config = SchedulerConfig(service=ServiceOrdering(thresholds_gpu_hours=(0.05, 0.5), min_run_seconds=60))
    shape = ClusterShape(racks_per_block=1, nodes_per_rack=8)
    queues = derive_queues(jobs[:300], 64)
    results = []
    # The kept index's run is also a shadow run: every cycle is decided again afresh and compared.
    shadowed = GpuqPolicy(use_index=True, verify=True)
    for policy in (shadowed, GpuqPolicy(use_index=False)):
        sim = Simulation(jobs[:300], build_nodes(shape, config), queues, config, policy, SimOptions())
        r = sim.run()
        cycles = r.pop("sim")["cycles"]
        results.append(r)
    assert shadowed.verified == cycles
    assert results[0]["preemptions"] > 20  # the rule is exercised
    assert results[0] == results[1]


def test_a_shadow_run_stops_at_the_first_cycle_that_decides_otherwise(monkeypatch: Any) -> None:
    """GPUQ_VERIFY_INDEX=1 (GpuqPolicy.verify): a kept index that decides differently from a fresh one
    stops the run at that cycle."""
    from gpuq.core import scheduler
    from gpuq.sim.policy import ShadowMismatch

    monkeypatch.setenv("GPUQ_VERIFY_INDEX", "1")
    policy = make_policy("gpuq")
    real = scheduler._Cycle._try

    def kept_index_forgets_one(self: Any, job: Any, q: Any, is_head: bool) -> Any:
        if self.ix is policy.index and job.key == "j3":  # type: ignore[attr-defined]
            return scheduler._Outcome.FAILED
        return real(self, job, q, is_head)

    monkeypatch.setattr(scheduler._Cycle, "_try", kept_index_forgets_one)
    jobs = [TraceJob(f"j{i}", 10 * i, 5, 8, "q") for i in range(6)]
    with pytest.raises(ShadowMismatch, match="cycle at t=30"):
        run(jobs, policy)


def test_periodic_checkpoints_at_a_float_unlucky_instant_do_not_loop() -> None:
    """floor((due - start) / interval) can come out one short of the interval count that gave `due`;
    the checkpoint schedule must still move on (it once re-scheduled the same instant forever)."""
    import signal

    start, k, interval = 7279852.787091834, 1709, 1800.0
    assert math.floor((start + k * interval - start) / interval) == k - 1  # the unlucky case
    jobs = [TraceJob("a", start, 1e8, 8, "q"), TraceJob("b", start + k * interval, 10, 8, "q")]

    def stuck(*_: object) -> None:
        raise TimeoutError("the checkpoint schedule is stuck")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        r = run(jobs, "gang-binpack", checkpoint_minutes=30)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert r["finished"] == 2


def test_a_victim_whose_node_dies_while_it_saves_is_killed_at_its_grace_deadline() -> None:
    from gpuq.sim.engine import Event, State

    one_node = ClusterShape(racks_per_block=1, nodes_per_rack=1, gpus_per_node=8)
    jobs = [TraceJob("low", 0, 10_000, 8, "q", priority=0), TraceJob("high", 3000, 10, 8, "q", priority=5)]
    options = SimOptions(checkpoint_minutes=30, checkpoint_save_seconds=60, checkpoint_grace_seconds=90)
    sim = Simulation(
        jobs, build_nodes(one_node, CONFIG), (Queue("q", 8),), CONFIG, make_policy("gpuq"), options
    )
    sim._process_until(0)
    sim._cycle(0)
    sim._process_until(3000)
    sim._cycle(3000)
    low = sim.jobs["low"]
    assert low.state is State.STOPPING  # asked to checkpoint, saving
    node = low.placement[0]
    sim._handle(3010, Event.FAIL, 0, node, 0)
    sim._cycle(3010)  # the dying node does not fail the check: the victim leaves at its deadline
    sim._process_until(3089)
    assert low.state is State.STOPPING
    sim._process_until(3090)
    assert low.state is State.PENDING
    assert sim.recorder.lost_gpu_seconds == pytest.approx(8 * (3090 - 1800))  # its save never finished


def test_a_preemption_that_buys_nothing_is_called_off_while_the_victim_saves() -> None:
    """Issue 33, as the operator does it: the preemptor got room elsewhere (a job ended) while its
    victim saved its checkpoint; the victim keeps running and loses nothing."""
    jobs = [
        TraceJob("low", 0, 10_000, 8, "q", priority=0),
        TraceJob("busy", 0, 3020, 8, "q", priority=9),
        TraceJob("high", 3000, 100, 8, "q", priority=5),
    ]
    spy = Spy(make_policy("gpuq"))
    r = run(jobs, spy, checkpoint_minutes=30, restart_overhead_seconds=120.0)
    assert [(now, a.victim) for now, _, d in spy.calls for a in d.abandon] == [(3020.0, "low")]
    assert r["preemptions"] == 0 and r["lost_gpu_hours"] == 0.0
    assert r["makespan"] == pytest.approx(10_000)  # no restart: it ran through


def test_a_periodic_checkpoint_replaces_only_the_checkpoint() -> None:
    """The engine's fast copy of a running job with its new checkpoint equals dataclasses.replace."""
    job = Job(
        "ns/j",
        "q",
        3,
        10.0,
        WorkerSpec(2, 4, 100, 200),
        checkpoint=Checkpoint(20.0, 1, "sim://ns/j"),
        running=Running(("n0", "n1"), 15.0),
        restart_count=1,
        constraints=Constraints(gpu_models=("a",)),
        avoid_nodes=frozenset({"n9"}),
        previous_placement=("n5",),
        not_before=12.0,
        attained_gpu_seconds=99.0,
        queued_since=14.0,
    )
    new = Checkpoint(1800.0, 7, "sim://ns/j")
    assert _with_checkpoint(job, new) == replace(job, checkpoint=new)
