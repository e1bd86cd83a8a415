"""Chaos, for correctness: a 500-job mixed load on a 128-node local cluster of its own while the
operator and the control plane are broken on purpose, one fault after another, with the invariants of
gpuq.chaos.invariants checked on every sample (twice a second): no job lost, no duplicate worker,
no node over-committed, no gang partially bound for more than 10 s, one admission per attempt, and
in the end every job finished. Figures (takeover times, each fault alone, 20 kills, 60 s freezes)
come from bench/chaos.py; this test keeps to one bounded run (~6 minutes).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.chaos import faults
from gpuq.chaos.harness import ChaosRun, LeaseTimings, RunReport
from gpuq.chaos.load import job_mix
from gpuq.devcluster import Cluster, Shape
from gpuq.devcluster.testing import E2ECluster

pytestmark = pytest.mark.e2e

SHAPE = Shape(racks=16, nodes_per_rack=8, blocks=4, zones=2)  # 2 zones, 4 blocks, 16 racks: 128 nodes
JOBS = 500
FAST_LEASE = LeaseTimings(duration=4, renew=3, retry=1)  # the rules of 15/10/2, in less time


@pytest.fixture(scope="module")
def chaos_cluster(cluster: E2ECluster) -> Iterator[Cluster]:
    if cluster.backend != "local":
        pytest.skip("chaos needs a gpuq dev cluster of its own (it restarts and freezes the control plane)")
    dev = Cluster.up(f"chaos-{os.getpid()}", SHAPE, tie_to_process=True)
    try:
        yield dev
    finally:
        dev.down(keep_logs=True)
        print(f"chaos control-plane logs: {dev.paths.logs}")


def explain(report: RunReport, work: Path) -> str:
    v = report.violations
    lines = [f"{k}: {n}" for k, n in v.counts().items() if n]
    lines += (
        [f"  lost: {sorted(v.lost)[:5]}", f"  failed: {sorted(v.failed)[:5]}"] if v.lost or v.failed else []
    )
    lines += [f"  duplicates: {list(v.duplicate_pods.items())[:3]}"] if v.duplicate_pods else []
    lines += [f"  over-committed: {list(v.overcommitted.items())[:3]}"] if v.overcommitted else []
    lines += [f"  partial: {list(v.partial_too_long.items())[:3]}"] if v.partial_too_long else []
    lines += [f"  double admissions: {list(v.double_admissions.items())[:3]}"] if v.double_admissions else []
    lines += [f"  unfinished: {sorted(v.unfinished)[:5]}"] if v.unfinished else []
    lines += [f"  evidence: {report.evidence}"] if report.evidence else []
    lines += [f"faults: {[(n, round(s, 1), d) for n, s, d in report.faults]}", f"operator logs: {work}"]
    return "\n".join(lines)


def test_invariants_hold_through_a_gauntlet_of_faults(chaos_cluster: Cluster, tmp_path: Path) -> None:
    rng = random.Random(2026)
    with ChaosRun(chaos_cluster, tmp_path, replicas=2, timings=FAST_LEASE) as run:
        run.submit(job_mix(JOBS, seed=11, min_seconds=5, max_seconds=25), over_seconds=200)
        time.sleep(10)
        for _ in range(6):  # two replicas: SIGKILL the leader at random moments
            time.sleep(rng.uniform(2, 8))
            run.fault("kill leader", lambda: faults.kill_leader(run))
        for _ in range(2):
            time.sleep(rng.uniform(2, 5))
            run.fault("stop leader", lambda: faults.stop_leader(run))
        run.fault("stall leader past its lease", lambda: faults.stall_leader(run))
        for _ in range(2):
            run.fault("restart kube-apiserver", lambda: faults.restart_apiserver(run))
        run.fault("freeze kube-apiserver 20s", lambda: faults.freeze(run, "kube-apiserver", 20))
        time.sleep(5)
        run.fault("pause etcd 10s", lambda: faults.freeze(run, "etcd", 10))
        time.sleep(5)
        run.fault("429 storm 20s", lambda: faults.throttle_apiserver(run, 20))
        third = run.fault("a third of the nodes NotReady 30s", lambda: faults.nodes_not_ready(run, 1 / 3, 30))
        # One replica: a killed operator's successor is the only candidate.
        run.replicas.procs["replica-1"].stop()
        for _ in range(3):
            time.sleep(rng.uniform(2, 6))
            run.fault("kill the only replica", lambda: faults.kill_leader(run, restart_after=0.5))
        report = run.finish(expected=JOBS, timeout=600)
    print(
        f"\nchaos: {report.jobs} jobs, {report.samples} samples, {report.seconds:.0f}s, "
        f"{report.restarts} gang restarts, {report.preemptions} preemptions, longest partial binding "
        f"{report.longest_partial:.1f}s ({report.longest_partial_raw:.1f}s wall)"
    )
    for name, seconds, details in report.faults:
        print(f"  {name:<36} {seconds:6.1f}s  {details}")
    assert third["restarts_during"] == 0, explain(report, tmp_path)
    assert report.jobs == JOBS and report.violations.total == 0, explain(report, tmp_path)
