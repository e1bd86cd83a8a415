"""Attained-service order end to end: an operator with tiny thresholds, so seconds of running count.
A long runner is preempted (with a checkpoint request) by new work of its own queue and priority, its
attained GPU-seconds land in its status, and it then waits behind newer work of its queue."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

import test_operator as shared
from gpuq.api import meta
from gpuq.controller.testing import GpuqClient, OperatorProcess
from gpuq.devcluster.testing import E2ECluster, wait_for

pytestmark = pytest.mark.e2e

gpuq = shared.gpuq
ns = shared.ns
queue = shared.queue
# 0.002 GPU-hours = 7.2 GPU-seconds: a 2x8 gang reaches level 1 in under a second of running.
SERVICE_CONFIG = (
    shared.FAST_CONFIG + "service: {thresholdsGPUHours: [0.002], preempt: true, minRunSeconds: 3}\n"
)


@pytest.fixture(scope="module")
def operator(
    cluster: E2ECluster, gpuq: GpuqClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    yield from shared.run_operator(cluster, tmp_path_factory, "service-operator", SERVICE_CONFIG)


def report_checkpoint(gpuq: GpuqClient, ns: str, name: str, step: int) -> None:
    report = {"step": step, "path": f"s3://ckpt/{name}/{step}", "time": time.time()}
    gpuq.patch_job(ns, name, {"metadata": {"annotations": {meta.ANNOTATION_CHECKPOINT: json.dumps(report)}}})


def test_new_work_preempts_a_long_runner_which_then_waits_behind_newer_work(
    cluster: E2ECluster, gpuq: GpuqClient, operator: OperatorProcess, ns: str, queue: Any
) -> None:
    g = cluster.gpus_per_node
    q = queue(2 * g)  # room for one 2-node gang: the queue's quota, not capacity, decides
    gpuq.submit(ns, "long", q, 2, g)
    shared.phase(gpuq, operator, ns, "long", "Running")
    time.sleep(4)  # past minRunSeconds, far past the threshold
    gpuq.submit(ns, "new", q, 2, g)
    wait_for(
        lambda: gpuq.condition(ns, "long", "PreemptionRequested") is not None,
        30,
        "a checkpoint request on the long runner",
    )
    report_checkpoint(gpuq, ns, "long", 7)
    long = shared.phase(gpuq, operator, ns, "long", ("Preempted", "Queued"), timeout=60)
    shared.phase(gpuq, operator, ns, "new", "Running", timeout=60)
    assert long["preemptions"] == 1 and long.get("restarts", 0) == 0
    assert long["attainedGPUSeconds"] >= 2 * g * 3  # it ran at least minRunSeconds on 2 x g GPUs
    # Newer work of the queue goes first: `later` was created after `long` but has attained nothing.
    gpuq.submit(ns, "later", q, 2, g)
    gpuq.delete_job(ns, "new")
    shared.phase(gpuq, operator, ns, "later", "Running", timeout=60)
    assert gpuq.status(ns, "long")["phase"] in ("Preempted", "Queued")
    # Equal levels never preempt each other: `later` keeps running once it too reached level 1.
    time.sleep(4)
    assert gpuq.status(ns, "later")["phase"] == "Running"
    assert gpuq.condition(ns, "later", "PreemptionRequested") is None
    gpuq.delete_job(ns, "later")
    resumed = shared.phase(gpuq, operator, ns, "long", "Running", timeout=60)
    assert resumed["attempt"] == 2 and resumed["lastCheckpoint"]["step"] == 7
