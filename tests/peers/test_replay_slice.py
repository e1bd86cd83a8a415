"""The slice a replay plays: the jobs from a start time that fit the cluster, compressed by one factor,
shaped into workers as the simulator shapes them, named as a cluster accepts."""

from __future__ import annotations

import pytest

from gpuq.peers.replay_slice import SliceError, dns_label, replay_jobs, slice_trace
from gpuq.sim.trace import TraceJob


def job(key: str, submit: float, gpus: int, duration: float = 600.0, queue: str = "vc-A") -> TraceJob:
    return TraceJob(key, submit, duration, gpus, queue)


def test_jobs_from_the_start_that_fit_are_shifted_and_compressed() -> None:
    jobs = [job("early", 10, 8), job("a", 100, 8), job("huge", 120, 64), job("b", 160, 16), job("c", 400, 1)]
    chosen, too_big = slice_trace(jobs, start=50, count=2, compress=60, total_gpus=32)
    assert [j.key for j in chosen] == ["a", "b"] and too_big == 1
    assert [j.submit_time for j in chosen] == [0.0, 1.0] and chosen[0].duration == 10.0
    capped, _ = slice_trace(jobs, start=50, count=2, compress=60, total_gpus=32, max_duration=300)
    assert [j.duration for j in capped] == [5.0, 5.0]
    with pytest.raises(SliceError, match="no job"):
        slice_trace(jobs, start=1000, count=5, compress=60, total_gpus=32)
    with pytest.raises(SliceError, match="compress"):
        slice_trace(jobs, start=0, count=5, compress=0, total_gpus=32)


def test_workers_as_the_simulator_shapes_them_and_names_a_cluster_accepts() -> None:
    out = replay_jobs([job("x", 0, 16, queue="Philly VC_7"), job("y", 1, 6, queue="42")], node_gpus=8)
    assert [(j.name, j.workers, j.gpus_per_worker) for j in out] == [("j00001", 2, 8), ("j00002", 1, 6)]
    assert [j.queue for j in out] == ["philly-vc-7", "q-42"]
    assert dns_label("---") == "q"


def test_workers_ask_the_cpu_and_memory_the_simulator_gives_them() -> None:
    from dataclasses import replace

    gib = 1 << 30
    heavy = replace(job("cpu-heavy", 0, 16), cpu_millis=48_000, memory_bytes=64 * gib)  # per job
    out = replay_jobs([heavy, job("bare", 1, 2)], node_gpus=8, per_gpu=(9_000, 100 * gib))
    # The trace's requests split over the job's workers; a job without any gets the per-GPU default.
    assert [(j.cpu_millis, j.memory_bytes) for j in out] == [(24_000, 32 * gib), (18_000, 200 * gib)]


def test_rules_on_the_slices_clock_and_the_operator_reads_them_back() -> None:
    from gpuq.config import config_from_mapping
    from gpuq.core.config import SchedulerConfig
    from gpuq.peers.replay_slice import compressed_rules, rules_yaml

    base = SchedulerConfig()
    fast = compressed_rules(base, 40)
    assert fast.service.thresholds_gpu_hours == (1.0 / 40, 100.0 / 40)
    assert fast.service.min_run_seconds == base.service.min_run_seconds / 40
    assert fast.consolidation.min_wait_seconds == base.consolidation.min_wait_seconds / 40
    assert (fast.starvation_seconds, fast.locality_wait_seconds) == (300.0 / 40, 86400.0 / 40)
    # The machinery's timers do not speed up with the trace.
    assert fast.failover == base.failover
    assert config_from_mapping(rules_yaml(fast)) == fast
